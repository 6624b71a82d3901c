"""Run a Python program under a gputrace session, as ``python script.py`` would run it.

The program runs as ``__main__`` with its own ``sys.argv`` and its directory first on
``sys.path``; the trace is written when it ends, whether it returns, raises, calls ``sys.exit``
or is stopped with SIGINT/SIGTERM. Its exit status is passed through unchanged.

>>> import pathlib, tempfile
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> _ = (d / "prog.py").write_text("import sys\\nsys.exit(3)\\n")
>>> result = run_script(RunOptions(d / "prog.py", [], output=None, backend="cpu", quiet=True))
>>> result.exit_code, len(result.trace)
(3, 0)

``trace_modules`` and ``trace_functions`` wrap functions in scopes as the program imports their
modules (docs/commands.md, ``gputrace run``).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import importlib.abc
import inspect
import os
import signal
import sys
import threading
import tokenize
import traceback
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputrace.errors import GputraceError, notice
from gputrace.model import Trace
from gputrace.recorder import trace
from gputrace.session import session

MAIN = "__main__"
_HELPER = "__gputrace_trace__"
_WRAPPED = "__gputrace_wrapped__"
# Signals that end a Python program by default; while the program runs they end it through an
# exception instead, so the trace is still written.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


@dataclass
class RunOptions:
    script: Path
    args: Sequence[str]
    output: Path | None
    backend: str = "auto"
    trace_modules: Sequence[str] = ()
    trace_functions: Sequence[str] = ()  # "module:func" or "module:Class.method"
    quiet: bool = False
    nvtx: bool = False  # every scope also an NVTX range (gputrace.nvtx)
    ring_s: float | None = None  # flight recorder: keep the last N seconds (session(ring_s=))
    steps: str | None = None  # record only these steps, "a:b" (session(steps=))
    timing: str = "auto"  # the cuda backend's timing source (session(timing=))
    schedule: str | None = None  # "wait=1,warmup=1,active=3,repeat=2" (session(schedule=))


# the fields of RunOptions that go to gputrace.session under their own names
SESSION_OPTIONS = ("backend", "quiet", "nvtx", "ring_s", "steps", "timing", "schedule")


@dataclass
class RunResult:
    exit_code: int
    session: Any  # the gputrace session that recorded the program; None if it never ran
    written: Path | None
    signal: int | None = None  # the program was stopped by this signal: re-raise it to exit
    notes: list[str] = field(default_factory=list)
    scopes: int = 0  # scopes in the trace
    backend: str = ""

    @property
    def trace(self) -> Trace | None:
        """The recorded trace (None if the program never ran); a streamed one is read back from
        its file on first use, never at exit (it can be far larger than the session's memory)."""
        return self.session.trace if self.session is not None else None


class _Stopped(BaseException):
    """Raised inside the program when a stop signal arrives (like KeyboardInterrupt for SIGINT)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signum}")
        self.signum = signum


def parse_targets(modules: Sequence[str], functions: Sequence[str]) -> dict[str, set[str] | None]:
    """``{module: None}`` for every top-level function, ``{module: {"f", "C.m"}}`` for chosen ones.

    >>> parse_targets(["pkg.mod"], ["__main__:step", "pkg.mod:f"])
    {'pkg.mod': None, '__main__': {'step'}}
    """
    targets: dict[str, set[str] | None] = {m: None for m in modules}
    for spec in functions:
        mod, sep, qual = spec.partition(":")
        if not sep or not mod or not qual or not all(p.isidentifier() for p in qual.split(".")):
            raise GputraceError(
                f"--trace-function {spec!r} is not of the form module:function or module:Class.method."
            )
        chosen = targets.setdefault(mod, set())
        if chosen is not None:  # (None: the whole module is traced already)
            chosen.add(qual)
    return targets


def run_script(opts: RunOptions) -> RunResult:
    """Run ``opts.script`` under a session; return its exit code and the trace."""
    script = Path(os.path.abspath(opts.script))
    if not script.is_file():
        raise GputraceError(f"{opts.script}: no such Python file.")
    targets = parse_targets(opts.trace_modules, opts.trace_functions)
    try:
        with tokenize.open(script) as f:
            source = f.read()
    except (OSError, SyntaxError) as exc:
        raise GputraceError(f"{opts.script}: could not be read ({exc}).") from None

    in_main = targets.get(MAIN, set())  # None: every function
    try:
        code, found = _compile(source, script, in_main)
    except SyntaxError:  # as Python reports it: no traceback frames, exit status 1
        traceback.print_exception(*sys.exc_info(), limit=0)
        return RunResult(1, None, None)
    notes = [
        f"--trace-function: {script.name} has no function {q}." for q in sorted((in_main or set()) - found)
    ]
    hook = _WrapOnImport({m: q for m, q in targets.items() if m != MAIN}, notes)
    main = types.ModuleType(MAIN)
    main.__dict__.update(__file__=str(script), __builtins__=builtins, __cached__=None, __spec__=None,
                         __loader__=None, __package__=None, **{_HELPER: trace})  # fmt: skip
    metadata = {"command": "gputrace run", "script": str(script), "args": list(opts.args)}
    s = session(opts.output, metadata=metadata, **{k: getattr(opts, k) for k in SESSION_OPTIONS})
    s.yields_to_inner = True  # a session the program starts itself records its own scopes
    saved_argv, saved_main = list(sys.argv), sys.modules[MAIN]
    saved_path0 = sys.path[0] if sys.path else None
    sys.argv = [str(opts.script), *opts.args]
    if sys.path:
        sys.path[0] = os.path.dirname(os.path.realpath(script))
    exit_code: int = 0
    stopped_by: int | None = None
    try:
        s.start()
        previous = _install(_raise_stopped, _STOP_SIGNALS, only_default=True)
        undo_wgpu = _trace_new_wgpu_devices() if opts.backend == "wgpu" else None
        hook.install()
        sys.modules[MAIN] = main
        try:
            try:
                exec(code, main.__dict__)
            except SystemExit as exc:
                exit_code = _exit_status(exc.code)
            except KeyboardInterrupt:
                _print_exception(main.__dict__)
                stopped_by = int(signal.SIGINT)
            except _Stopped as exc:
                stopped_by = exc.signum
            except BaseException:
                _print_exception(main.__dict__)
                exit_code = 1
            if stopped_by is None or stopped_by == int(signal.SIGINT):
                # As the interpreter does before it exits; a stop signal (SIGTERM) ends the process
                # at once instead, whatever its threads are doing.
                _join_threads()
        except _Stopped as exc:  # while waiting for the program's threads
            stopped_by = exc.signum
        except KeyboardInterrupt:
            stopped_by = int(signal.SIGINT)
        finally:
            hook.remove()
            if undo_wgpu is not None:
                undo_wgpu()
            _restore_signals(previous)
            with _held_signals() as arrived:  # a second Ctrl-C or SIGTERM must not cut the write short
                s.stop()
            if arrived and stopped_by is None:
                stopped_by = arrived[0]
    finally:
        sys.modules[MAIN] = saved_main
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
    if stopped_by is not None:
        exit_code = 128 + stopped_by
    if os.getpid() != s._pid:  # a process the program forked: its parent writes the trace
        return RunResult(exit_code, None, None, stopped_by)
    for mod in sorted(set(hook.targets) - hook.seen):
        notes.append(f"--trace-module/--trace-function: the program never imported {mod}.")
    scopes = s.scopes_recorded()
    if scopes == 0 and s.written is not None:
        notes.append(_no_scopes(s))
    return RunResult(exit_code, s, s.written, stopped_by, notes, scopes, s.backend_name)


def _no_scopes(s: session) -> str:
    """One sentence on why the trace holds no scope, and how to get some."""
    if s.steps_seen is not None:
        seen, window = s.steps_seen
        if seen < window:
            return (
                f"no scope was recorded: the program called gputrace.step() {seen} times, "
                f"never reaching the first recorded step ({window})."
            )
    how = (
        "no scope was recorded: name functions to trace with --trace-module MODULE or "
        '--trace-function MODULE:FUNC, or wrap regions in `with gputrace.trace("name"):`'
    )
    outside = s.backend_info.get("passes_outside_scopes")
    if isinstance(outside, int) and outside > 0:
        return f"{how}; {outside} wgpu passes ran outside any scope and were not timed."
    return how + "."


def _compile(source: str, script: Path, chosen: set[str] | None) -> tuple[types.CodeType, set[str]]:
    """Compile the program, adding a trace decorator to the ``chosen`` functions of ``__main__``
    (None: every top-level one), innermost, on the ``def`` line, so line numbers and tracebacks
    stay the same. Returns the code and the names decorated."""
    found: set[str] = set()
    tree = ast.parse(source, str(script))
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    defs = [(n, n.name) for n in tree.body if isinstance(n, functions)]
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            defs += [(item, f"{node.name}.{item.name}") for item in node.body if isinstance(item, functions)]
    for node, qual in defs:
        if ("." not in qual) if chosen is None else (qual in chosen):
            call = ast.Call(func=ast.Name(id=_HELPER, ctx=ast.Load()), args=[ast.Constant(qual)], keywords=[])
            node.decorator_list.append(ast.fix_missing_locations(ast.copy_location(call, node)))
            found.add(qual)
    return compile(tree, str(script), "exec", dont_inherit=True), found


def _exit_status(code: object) -> int:
    """What ``sys.exit(code)`` makes the process return, as Python itself does it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code % 256
    print(code, file=sys.stderr)
    return 1


def _print_exception(main_globals: dict[str, Any]) -> None:
    """Print the program's uncaught exception through ``sys.excepthook``, gputrace's frames left out."""
    etype, value, tb = sys.exc_info()
    assert etype is not None and value is not None
    while tb is not None and tb.tb_frame.f_globals is not main_globals:
        tb = tb.tb_next
    if tb is not None:
        value = value.with_traceback(_without_own_frames(tb))  # the hook prints __traceback__
    seen, chained = {id(value)}, [value.__cause__, value.__context__]
    while chained:  # the exceptions it was raised from or during are printed too
        e = chained.pop()
        if e is not None and id(e) not in seen:
            seen.add(id(e))
            if e.__traceback__ is not None:
                _without_own_frames(e.__traceback__)
            chained += [e.__cause__, e.__context__]
    try:
        sys.excepthook(etype, value, value.__traceback__)
    except Exception:
        traceback.print_exception(etype, value, tb)
    sys.stderr.flush()


def _without_own_frames(tb: types.TracebackType) -> types.TracebackType:
    """``tb`` without gputrace's own frames (a traced function's ``wrapper``); the first (the
    script's) is always kept."""
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    kept = tb
    while (t := kept.tb_next) is not None:
        if os.path.abspath(t.tb_frame.f_code.co_filename).startswith(package):
            kept.tb_next = t.tb_next
        else:
            kept = t
    return tb


def _trace_new_wgpu_devices() -> Callable[[], None] | None:
    """With ``--backend wgpu``: trace the devices the program creates with ``request_device_sync``
    (``"timestamp-query"`` added where the adapter has it). Returns the undo."""
    try:
        from wgpu.backends.wgpu_native._api import GPUAdapter

        from gputrace.backends.wgpu import instrument
    except ImportError:
        return None
    own = "request_device_sync" in GPUAdapter.__dict__  # wgpu-py 0.32 defines it on the base class
    original = getattr(GPUAdapter, "request_device_sync", None)
    if original is None:
        return None

    @functools.wraps(original)
    def request_device_sync(self: Any, **kwargs: Any) -> Any:
        features = list(kwargs.get("required_features") or ())
        if "timestamp-query" in self.features and "timestamp-query" not in features:
            kwargs["required_features"] = [*features, "timestamp-query"]
        device = original(self, **kwargs)
        try:
            instrument(device)
        except Exception as exc:  # the program gets its device either way
            notice(f"the program's wgpu device could not be traced ({type(exc).__name__}: {exc}).")
        return device

    GPUAdapter.request_device_sync = request_device_sync
    if own:
        return functools.partial(setattr, GPUAdapter, "request_device_sync", original)
    return functools.partial(delattr, GPUAdapter, "request_device_sync")


def _join_threads() -> None:
    """Wait for the program's non-daemon threads, as the interpreter does before it exits."""
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon and t is not threading.main_thread():
            t.join()


def _raise_stopped(signum: int, frame: Any) -> None:
    raise _Stopped(signum)


def _install(handler: Any, signals: Sequence[int], only_default: bool = False) -> dict[int, Any]:
    """``handler`` for ``signals`` (main thread only), with ``only_default`` only where the default
    is in charge; returns the handlers they had (none off the main thread: ``signal`` raises there)."""
    previous = {}
    for sig in signals:
        if not only_default or signal.getsignal(sig) is signal.SIG_DFL:
            with contextlib.suppress(ValueError, OSError, TypeError):
                previous[sig] = signal.signal(sig, handler)
    return previous


@contextlib.contextmanager
def _held_signals() -> Iterator[list[int]]:
    """Holds SIGINT, SIGTERM and SIGHUP inside the block (the trace being written); yields the
    list of those that arrived meanwhile (less those the program ignored)."""
    arrived: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        arrived.append(signum)
        if len(arrived) >= 3:  # asked three times: give up on the trace, as asked
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    previous = _install(hold, (signal.SIGINT, *_STOP_SIGNALS))
    try:
        yield arrived
    finally:
        _restore_signals(previous)
        arrived[:] = [sig for sig in arrived if previous.get(sig) is not signal.SIG_IGN]


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wraps chosen functions of chosen modules in ``trace`` scopes as the modules are imported."""

    def __init__(self, targets: dict[str, set[str] | None], notes: list[str]) -> None:
        self.targets = targets
        self.notes = notes
        self.seen: set[str] = set()

    def install(self) -> None:
        for name in self.targets:
            mod = sys.modules.get(name)
            if mod is not None:
                self.wrap(mod)
        if self.targets:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.targets:
            return None
        finders = (f for f in sys.meta_path if f is not self and hasattr(f, "find_spec"))
        spec = next((s for f in finders if (s := f.find_spec(fullname, path, target)) is not None), None)
        if spec is None:
            return None
        loader = spec.loader
        original: Callable[[types.ModuleType], None] | None = getattr(loader, "exec_module", None)
        if original is None:
            return spec

        def exec_module(module: types.ModuleType) -> None:
            assert original is not None
            original(module)
            self.wrap(module)

        with contextlib.suppress(AttributeError, TypeError):
            loader.exec_module = exec_module  # type: ignore[union-attr,method-assign]  # per module
        return spec

    def wrap(self, module: types.ModuleType) -> None:
        name = module.__name__
        self.seen.add(name)
        chosen = self.targets.get(name)
        try:
            if chosen is None:  # every function the module defines
                chosen = {
                    attr
                    for attr, obj in vars(module).items()
                    if inspect.isfunction(obj) and obj.__module__ == name and not attr.startswith("__")
                }
            for qual in sorted(chosen):
                if not _wrap_qualname(module, qual, f"{name}.{qual}"):
                    self.notes.append(f"--trace-function: {name} has no function {qual}.")
        except Exception as exc:  # never break the program over tracing it
            notice(f"could not trace functions of {name} ({type(exc).__name__}: {exc}).")


def _traced(fn: Any, scope: str) -> Any:
    if getattr(fn, _WRAPPED, False):
        return fn
    wrapped = trace(scope)(fn)
    setattr(wrapped, _WRAPPED, True)
    return wrapped


def _wrap_qualname(module: types.ModuleType, qual: str, scope: str) -> bool:
    """Wrap ``module.<qual>`` (a function or ``Class.method``) in place; False if not found."""
    *owners, last = qual.split(".")
    owner: Any = module
    for part in owners:
        owner = getattr(owner, part, None)
        if owner is None:
            return False
    raw = vars(owner).get(last) if hasattr(owner, "__dict__") else None
    if isinstance(raw, (staticmethod, classmethod)):
        setattr(owner, last, type(raw)(_traced(raw.__func__, scope)))
    elif inspect.isfunction(raw):
        setattr(owner, last, _traced(raw, scope))
    else:
        return False
    return True
