"""The recorder: the hot path behind ``trace()``.

Entering a scope reads the clock, asks a timed backend for a token and pushes onto its track's
stack; leaving it appends the name and both clock readings to the track's buffer (token, flags and
args too, when there are any). A track is an OS thread, an asyncio task (found through a context
variable, so tasks on one thread never nest into each other), or a generator suspended with a scope
open. No shared lock, no I/O, no resolution, no conversion of args: that happens after the stop.
With no session active, ``trace`` costs one global read per enter and exit.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.abc
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Hashable
from types import FrameType, TracebackType
from typing import Any, TypeVar

import numpy as np

from gputrace.backends.base import Backend, Clock
from gputrace.errors import GputraceError, report_internal
from gputrace.jsonsafe import clean_str, is_plain, jsonsafe, short_repr
from gputrace.model import Flag
from gputrace.records import RawThread

F = TypeVar("F", bound=Callable[..., Any])

# The active recorder, or None, and copies of what the hot path needs from it (module globals
# are the cheapest lookups Python has). Only ``Recorder.activate``/``deactivate`` write them.
_recorder: Recorder | None = None
_clock: Clock = time.perf_counter_ns
_tls: threading.local = threading.local()
_timed = False
_getframe = sys._getframe
_get_ident = threading.get_ident
# The running asyncio loop of this thread, or None; a stand-in saying None until the program
# imports asyncio (only then is a loop looked for: gputrace never imports it itself).
_running_loop: Callable[[], Any] = type(None)
_asyncio = False
_current_task: Callable[[Any], Any] | None = None
# The asyncio task's own track (set in the task's context, so every task has its own value).
_task_track: contextvars.ContextVar[ThreadBuffer | None] = contextvars.ContextVar(
    "gputrace_task_track", default=None
)

_DEGRADED = int(Flag.DEGRADED)
_ERROR = int(Flag.ERROR)
# Code that can be suspended with a scope open: generators, coroutines, async generators.
_SUSPENDABLE = 0x20 | 0x80 | 0x100 | 0x200
# Tracks that are not OS threads (asyncio tasks, suspended generators) get tids from here up:
# above any Linux tid (< 2**22), below the exporter's overlap lanes (multiples of 2**24).
EXTRA_TID_BASE = 1 << 23
THROTTLE_WAIT_S = 0.5  # the longest one scope's exit waits for the stream's writer
MAX_OLD_LOGS = 4  # logs swapped out by backpressure kept readable (the empty oldest are dropped)


class ThreadBuffer:
    """Everything one track recorded: an OS thread, an asyncio task, or a generator that was
    suspended with a scope open. Only the thread that owns it appends to it."""

    __slots__ = (
        "ident", "log", "marks", "name", "old_logs", "rec", "rich", "sides", "stack", "task_id", "tid",
    )  # fmt: skip

    def __init__(self, rec: Recorder | None = None, name: str | None = None, tid: int | None = None) -> None:
        t = threading.current_thread()
        self.rec = rec
        self.ident = t.ident or 0
        self.tid = threading.get_native_id() if tid is None else tid
        self.name = t.name if name is None else name
        self.task_id = 0
        # Open scopes: (trace object, cpu_start_ns, token, frame that entered it).
        self.stack: list[tuple[Any, int, int, FrameType | None]] = []
        # Plain scopes, flat: name, cpu_start_ns, cpu_end_ns, ... Extending a list with three
        # references is the cheapest store Python has (an array('q') converts each int: +190 ns).
        self.log: list[Any] = []
        # Logs swapped out by backpressure (``ThrottledLog``), oldest first, read before ``log``.
        self.old_logs: list[list[Any]] = []
        # Scopes with a token, flags or args: ``RICH`` items each (name, start, end, token, flags,
        # args or None), one ``extend`` a scope so a taker on another thread never sees half of one.
        self.rich: list[Any] = []
        self.marks: list[tuple[str, int, str, dict[str, Any]]] = []
        self.sides: dict[Any, ThreadBuffer] = {}  # suspended generators' tracks, by frame


class ThrottledLog(list):  # type: ignore[type-arg]
    """A buffer's log while the stream's writer catches up with a backlog (past
    ``gputrace.streaming.BACKLOG_SCOPES``): each scope stored waits, bounded, for ``gate``."""

    __slots__ = ("gate",)

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def extend(self, items: Any) -> None:
        list.extend(self, items)
        if not self.gate.is_set():
            self.gate.wait(THROTTLE_WAIT_S)


class Recorder:
    """Owns the per-track buffers of one session."""

    def __init__(self, clock: Clock, backend: Backend) -> None:
        self.clock = clock
        self.backend = backend
        self.timed = backend.timed
        self.owner: object = None  # the session that owns this recorder
        self.local = threading.local()
        self.buffers: list[ThreadBuffer] = []
        self._buffers_lock = threading.Lock()  # taken once per track, never per scope
        self._extra_tids = 0
        self._finder: _AsyncioWatch | None = None
        self.nvtx: Any = None  # gputrace.nvtx.Ranges for session(nvtx=True): on while active

    def _extra_track(self, name: str) -> ThreadBuffer:
        """A new track that is not an OS thread (an asyncio task, a suspended generator)."""
        with self._buffers_lock:
            self._extra_tids += 1
            buf = ThreadBuffer(self, clean_str(name, 200), EXTRA_TID_BASE + self._extra_tids)
            self.buffers.append(buf)
        return buf

    def tracks(self) -> list[ThreadBuffer]:
        """A copy of the list of tracks, for readers on other threads (the stream's writer, the drain)."""
        with self._buffers_lock:
            return list(self.buffers)

    def take_recorded(self) -> list[Recorded]:
        """Cut what every track recorded so far out of its buffers: a ``Recorded`` per track that
        has any. Owners only append, so a prefix can be cut while they record. One taker at a time
        (two would both copy a prefix, then both delete one)."""
        out = []
        for buf in self.tracks():
            plain = [x for old in list(buf.old_logs) for x in _cut(old)]
            plain += _cut(buf.log)
            rich = _cut(buf.rich, len(buf.rich) // RICH * RICH)
            marks = _cut(buf.marks)
            if plain or rich or marks:
                out.append(Recorded(buf, plain, rich, marks))
        return out

    def add_mark(self, name: str, ts_ns: int, kind: str = "mark", args: dict[str, Any] | None = None) -> None:
        """An instant on this OS thread's track (a sync, a step, a window's start)."""
        self.buffer().marks.append((name, ts_ns, kind, {} if args is None else args))

    def unclosed(self, stop_ns: int) -> list[Recorded]:
        """Per track with scopes still open: those scopes, closed as ``_unclosed`` says."""
        got = [Recorded(buf, [], _unclosed(list(buf.stack), stop_ns), []) for buf in self.tracks()]
        return [r for r in got if r.rich]

    def open_tids(self) -> list[int]:
        """The tids of the tracks with a scope open now."""
        return [b.tid for b in self.tracks() if b.stack]

    def backlog(self) -> int:
        """Plain scopes recorded and not yet taken (read without stopping anyone)."""
        return sum(len(b.log) for b in self.tracks()) // 3

    def throttle(self, gate: threading.Event | None) -> None:
        """Backpressure: with a ``gate``, each track's log becomes a ``ThrottledLog``; with None, a
        plain list. The old lists stay in ``old_logs`` (a scope leaving during the swap may land
        in one), the oldest dropped once read empty. Call it from the taker's side, not mid-take."""
        for buf in self.tracks():
            old = buf.log
            buf.log = ThrottledLog(gate) if gate is not None else []
            olds = [*buf.old_logs, old]
            while len(olds) > MAX_OLD_LOGS and not olds[0]:
                olds.pop(0)
            buf.old_logs = olds

    def scopes_held(self, open_too: bool = True) -> int:
        """Scopes waiting in the buffers (what a failed drain would lose), and with ``open_too``
        those still open; 0 when they cannot be counted."""
        try:
            n = 0
            for b in self.tracks():
                n += sum(len(o) // 3 for o in b.old_logs) + len(b.log) // 3 + len(b.rich) // RICH
                n += len(b.stack) if open_too else 0
            return n
        except Exception:
            return 0

    def buffer(self) -> ThreadBuffer:
        """This OS thread's track."""
        try:
            buf: ThreadBuffer = self.local.buf
        except AttributeError:
            buf = self.local.buf = ThreadBuffer(self)
            with self._buffers_lock:
                self.buffers.append(buf)
        return buf

    def task_buffer(self, loop: Any) -> ThreadBuffer:
        """The track of the asyncio task running on ``loop`` (this thread's, outside a task)."""
        global _current_task
        try:
            if _current_task is None:
                _current_task = sys.modules["asyncio"].current_task
            task = _current_task(loop)
        except Exception:  # an event loop that asyncio does not know: one track per thread
            task = None
        if task is None:
            return self.buffer()
        trk = _task_track.get()
        if trk is not None and trk.rec is self and trk.task_id == id(task):
            return trk
        try:
            tname = str(task.get_name())
        except Exception:
            tname = "task"
        trk = self._extra_track(f"{self.buffer().name} · {tname}")
        trk.task_id = id(task)
        _task_track.set(trk)
        return trk

    def current(self) -> ThreadBuffer:
        loop = _running_loop() if _asyncio else None
        return self.buffer() if loop is None else self.task_buffer(loop)

    def set_aside(self, buf: ThreadBuffer) -> None:
        """Move the scopes on top of ``buf``'s stack that a now suspended generator (or coroutine)
        opened to its own track, so they do not adopt the scopes run while it is suspended."""
        stack = buf.stack
        moved = []
        while stack:
            frame = stack[-1][3]
            if frame is None or frame.f_back is not None or not frame.f_code.co_flags & _SUSPENDABLE:
                break
            moved.append(stack.pop())
        if not moved:
            return
        frame = moved[-1][3]
        assert frame is not None
        side = buf.sides.get(frame)
        if side is None:
            code = frame.f_code
            what = getattr(code, "co_qualname", code.co_name)
            side = buf.sides[frame] = self._extra_track(f"{buf.name} · {what} (suspended)")
        side.stack.extend(reversed(moved))

    def activate(self) -> None:
        global _recorder, _clock, _tls, _timed
        if _recorder is not None:
            raise GputraceError("a gputrace session is already active; stop it before starting another.")
        if not _watch_asyncio():  # start watching for the program's own ``import asyncio``
            self._finder = _AsyncioWatch()
            sys.meta_path.insert(0, self._finder)
        _clock, _tls, _timed = self.clock, self.local, self.timed
        _recorder = self
        if self.nvtx is not None:  # swaps trace's enter/exit: the plain path stays as it is
            self.nvtx.enable()

    def deactivate(self) -> None:
        global _recorder
        if _recorder is self:
            _recorder = None
        finder, self._finder = self._finder, None
        if finder is not None:
            finder.remove()
        if self.nvtx is not None:
            self.nvtx.disable()

    def internal_error(self, where: str, exc: BaseException) -> None:
        report_internal(
            f"{where}:{type(exc).__name__}",
            f"{where} failed inside the profiler ({type(exc).__name__}: {exc}); "
            "the scope is recorded as degraded and your program continues.",
        )


def _watch_asyncio() -> bool:
    """Look for asyncio loops from now on if the program has imported asyncio; True if so."""
    global _running_loop, _asyncio
    if not _asyncio:
        get = getattr(sys.modules.get("asyncio.events"), "_get_running_loop", None)
        if get is None:
            return False
        _running_loop, _asyncio = get, True
    return True


class _AsyncioWatch(importlib.abc.MetaPathFinder):
    """Finds nothing; notices when the program has imported ``asyncio.events``."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if _watch_asyncio():
            self.remove()
        return None

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)


def _after_fork_in_child() -> None:
    """A process forked inside a session records nothing (the file, the backend, which CUDA and
    wgpu cannot fork, and the buffers are the parent's); one notice says so."""
    rec = _recorder
    if rec is None:
        return
    rec._buffers_lock = threading.Lock()  # another thread may have held it at the fork
    rec.deactivate()
    owner = rec.owner
    if getattr(owner, "quiet", False):
        return
    path = getattr(owner, "path", None)
    where = f" ({path})" if path is not None else ""
    msg = (
        f"gputrace: process {os.getpid()} was forked inside a session and records nothing; "
        f"the trace{where} stays its parent's.\n"
    )
    with contextlib.suppress(Exception):
        os.write(2, msg.encode("utf-8", "replace"))  # no lock taken: safe right after a fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def innermost_token() -> int:
    """The token of the innermost timed scope open on this thread's current track (its asyncio
    task's, when one runs), or 0: what backends attribute work to (wgpu passes)."""
    rec = _recorder
    if rec is None:
        return 0
    loop = _running_loop() if _asyncio else None
    if loop is None:
        buf = getattr(_tls, "buf", None)
        if buf is None:
            return 0
    else:
        buf = rec.task_buffer(loop)
    stack = buf.stack
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][2] > 0:
            return stack[i][2]
    return 0


def _cut(items: list[Any], k: int | None = None) -> list[Any]:
    """The first ``k`` (all there are now) of ``items``, cut out (its owner may append meanwhile)."""
    k = len(items) if k is None else k
    got = items[:k]
    del items[:k]
    return got


def active_recorder() -> Recorder | None:
    return _recorder


class trace:
    """Trace a region: ``with trace("name"):``, ``@trace("name")``, or ``@trace`` bare (the scope
    is then named after the function's qualified name, ``Class.method``).

    Scopes nest per thread and per asyncio task; one object can be reused and entered recursively.
    Keyword arguments are kept as the scope's args (shown in Perfetto and the viewer); ``stream``
    names the CUDA stream the work goes to (default: CuPy's current stream).

    >>> import gputrace
    >>> @gputrace.trace("double")
    ... def double(x):
    ...     return 2 * x
    >>> with gputrace.session(backend="cpu") as s:
    ...     with gputrace.trace("outer", batch=4):
    ...         _ = double(21)
    >>> [(sc.name, sc.depth) for sc in s.trace]
    [('outer', 0), ('double', 1)]

    If the code inside raises, the scope is closed, marked with the exception type, and the
    exception propagates unchanged.
    """

    __slots__ = ("args", "name", "stream")
    name: str
    stream: Hashable | None
    args: dict[str, Any]

    def __new__(cls, name: Any, /, stream: Hashable | None = None, **args: Any) -> Any:
        # made here, without an ``__init__`` (a scope made per ``with`` costs one call less)
        if type(name) is str or not callable(name):
            self = object.__new__(cls)
            self.name, self.stream, self.args = name, stream, args
            return self
        # ``@trace`` bare hands over the function as the name: decorate it under its qualified name.
        if stream is not None or args:
            raise GputraceError(
                "@gputrace.trace bare takes no arguments; name the scope to give it some: "
                '@gputrace.trace("name", key=value).'
            )
        qualname = getattr(name, "__qualname__", None) or getattr(name, "__name__", None)
        return cls(str(qualname or repr(name)))(name)

    def __enter__(self) -> trace:
        rec = _recorder
        if rec is None:
            return self
        if not _asyncio or _running_loop() is None:
            try:
                buf = _tls.buf
            except AttributeError:
                buf = rec.buffer()
        else:
            buf = rec.task_buffer(_running_loop())
        stack = buf.stack
        try:
            frame = _getframe(1)
        except ValueError:  # entered from C with no Python caller
            frame = _getframe(0)
        if stack and stack[-1][3].f_back is None:  # type: ignore[union-attr]
            rec.set_aside(buf)  # the scope on top may belong to a suspended generator
        if _timed:
            cpu_start = _clock()
            try:
                token = rec.backend.begin(self.name, self.stream, cpu_start)
            except Exception as exc:
                rec.internal_error("starting a GPU span", exc)
                token = -1
            stack.append((self, cpu_start, token, frame))
        else:
            stack.append((self, _clock(), 0, frame))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        rec = _recorder
        if rec is None:
            return
        if _asyncio:
            found = _task_entry(rec, self)
            if found is None:
                return
            entry, buf = found
        else:
            try:
                buf = _tls.buf
                entry = buf.stack.pop()
            except (AttributeError, IndexError):
                return  # entered before this session started: nothing of it was recorded
            if entry[0] is not self:
                buf.stack.append(entry)
                found = _find(rec, buf, self)
                if found is None:
                    return  # entered before this session started, or on another thread
                entry, buf = found
        cpu_start, token = entry[1], entry[2]
        if token or exc_type is not None or self.args:
            self._exit_slow(rec, buf, cpu_start, token, exc_type)
            return
        buf.log.extend((self.name, cpu_start, _clock()))

    def _exit_slow(
        self,
        rec: Recorder,
        buf: ThreadBuffer,
        cpu_start: int,
        token: int,
        exc_type: type[BaseException] | None,
    ) -> None:
        """Leaving a scope that has a GPU token, args or an exception."""
        if exc_type is GeneratorExit:
            exc_type = None  # a generator closed early: a normal end for its scopes
        flags = 0
        lost = ""
        if token > 0:
            try:
                rec.backend.end(token)
            except Exception as err:
                rec.internal_error("ending a GPU span", err)
                flags, lost = _DEGRADED, f"ending its GPU span failed ({type(err).__name__})"
        elif token < 0:
            flags, lost = _DEGRADED, "starting its GPU span failed"
            token = 0
        cpu_end = _clock()
        args = None
        if exc_type is not None or self.args or lost:
            # kept as given: converted to JSON-safe values when the session stops, off the hot path
            args = dict(self.args)
            if exc_type is not None:
                flags |= _ERROR
                args["exception"] = getattr(exc_type, "__name__", "exception")
            if lost:
                args["degraded"] = lost
        buf.rich.extend((self.name, cpu_start, cpu_end, token, flags, args))

    def __call__(self, fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*a: Any, **kw: Any) -> Any:
                with self:
                    return await fn(*a, **kw)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            with self:
                return fn(*a, **kw)

        return wrapper  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"gputrace.trace({self.name!r})"


def _task_entry(rec: Recorder, obj: trace) -> tuple[tuple[Any, int, int, Any], ThreadBuffer] | None:
    """``obj``'s open entry, popped, and its track, once the program uses asyncio."""
    buf = _task_track.get()
    if buf is None or buf.rec is not rec or buf.ident != _get_ident():
        buf = getattr(_tls, "buf", None)
        if buf is None:
            return None
    stack = buf.stack
    if stack and stack[-1][0] is obj:
        return stack.pop(), buf
    return _find(rec, buf, obj)


def _find(
    rec: Recorder, buf: ThreadBuffer, obj: trace
) -> tuple[tuple[Any, int, int, Any], ThreadBuffer] | None:
    """``obj``'s open entry, popped, and its track, when it is not on top of ``buf``'s stack: left
    out of order (interleaved coroutines), set aside with a suspended generator, or entered on
    this thread's own track from inside a task."""
    cands = [buf]
    thread = getattr(rec.local, "buf", None)
    if thread is not None and thread is not buf:
        cands.append(thread)
    for b in list(cands):
        if b.sides:
            cands.extend(b.sides.values())
    for b in cands:
        stack = b.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is obj:
                return stack.pop(i), b
    return None


def mark(name: str, **args: Any) -> None:
    """Record an instant on this thread (shown as a marker in Perfetto and the viewer)."""
    rec = _recorder
    if rec is None:
        return
    try:
        rec.current().marks.append((name, rec.clock(), "mark", args))
    except Exception as exc:
        rec.internal_error("recording a mark", exc)


def drain(rec: Recorder, stop_ns: int) -> list[RawThread]:
    """Every track's records as ``RawThread``s, scopes still open included (``_unclosed``). A scope
    another thread leaves meanwhile is in the copy, or still open, or (at that very moment) in
    neither; never half of it."""
    out = []
    for buf in rec.tracks():
        stack = list(buf.stack)
        log = [x for old in list(buf.old_logs) for x in old] + list(buf.log)
        rich = list(buf.rich)
        del rich[len(rich) // RICH * RICH :]
        rich += _unclosed(stack, stop_ns)
        out.append(raw_thread(buf, log, rich, list(buf.marks)))
    return out


def _unclosed(stack: list[Any], stop_ns: int) -> list[Any]:
    """Rich items for the scopes open on ``stack``: ending at ``stop_ns``, flagged degraded,
    ``args["unclosed"] = True`` (nothing recorded is dropped at a stop)."""
    rich: list[Any] = []
    for entry in stack:
        obj = entry[0]
        a = dict(getattr(obj, "args", None) or {})
        a["unclosed"] = True
        name, start, token = getattr(obj, "name", "?"), entry[1], max(entry[2], 0)
        rich.extend((name, start, max(stop_ns, start), token, _DEGRADED, a))
    return rich


RICH = 6  # items per scope in ``ThreadBuffer.rich``


class Recorded:
    """What one track recorded since the last take: ``plain`` (3 items a scope: name, start, end),
    ``rich`` (``RICH`` a scope) and marks. The stream's writer uses only these methods."""

    __slots__ = ("buf", "marks", "plain", "rich")

    def __init__(self, buf: ThreadBuffer, plain: list[Any], rich: list[Any], marks: list[Any]) -> None:
        self.buf, self.plain, self.rich, self.marks = buf, plain, rich, marks

    @property
    def tid(self) -> int:
        return self.buf.tid

    @property
    def key(self) -> int:
        """The same for every take of one track."""
        return id(self.buf)

    def scopes(self) -> int:
        return len(self.plain) // 3 + len(self.rich) // RICH

    def pieces(self, n: int) -> list[Recorded]:
        """This track's scopes in pieces of at most ``n`` scopes (its marks with the first)."""
        out = [
            Recorded(self.buf, self.plain[i : i + 3 * n], [], self.marks if i == 0 else [])
            for i in range(0, max(len(self.plain), 1), 3 * n)
        ]
        return out + [
            Recorded(self.buf, [], self.rich[i : i + RICH * n], [])
            for i in range(0, len(self.rich), RICH * n)
        ]

    def settle(
        self, held: Recorded | None, horizon: int | None, complete: bool = False
    ) -> tuple[Recorded, Recorded | None]:
        """What can be written now, and what must wait (None: nothing), given ``held`` (what waited
        at the last take). ``complete`` (a sync): nothing waits. Else a scope waits while its GPU
        work may still run: without a ``horizon``, a scope with a GPU token; with one (CUPTI: every
        operation launched before it has arrived), one that ended after it, and with it every
        scope that started at or after the earliest waiting one (plain first, then rich, in
        order): a chunk resolves its own scopes' spans only, so a parent waits with its children
        (one that started earlier ended before the horizon, so it holds no waiting one)."""
        before = held.rich if held is not None else []
        plain = self.plain
        if complete:
            return Recorded(self.buf, plain, before + self.rich, self.marks), None
        if horizon is None:
            ready, late = _split(self.rich, _column(self.rich, 3, RICH) > 0, RICH)
            wait = before + late
        else:
            rich = before + self.rich
            plain, wait = _split_plain(plain, _column(plain, 2) > horizon)
            ready, late = _split(rich, _column(rich, 2, RICH) > horizon, RICH)
            wait += late
            if wait:
                first = min(wait[1::RICH])
                plain, moved = _split_plain(plain, _column(plain, 1) >= first)
                ready, moved_rich = _split(ready, _column(ready, 1, RICH) >= first, RICH)
                wait = moved + moved_rich + wait
        waiting = Recorded(self.buf, [], wait, []) if wait else None
        return Recorded(self.buf, plain, ready, self.marks), waiting

    def raw(self) -> RawThread:
        """As a ``RawThread``: names, args and marks made JSON-safe."""
        return raw_thread(self.buf, self.plain, self.rich, self.marks)


def scopes_in(recorded: list[Recorded]) -> int:
    """Scopes held in ``recorded``."""
    return sum(r.scopes() for r in recorded)


def _column(items: list[Any], k: int, width: int = 3) -> np.ndarray:
    """Item ``k`` of every scope of a flat list of ``width`` items a scope, as an array."""
    return np.fromiter(items[k::width], np.int64, len(items) // width)


def _split(items: list[Any], late: np.ndarray, width: int) -> tuple[list[Any], list[Any]]:
    """Whole scopes of a flat list cut by the mask ``late``: those not late, and the late ones, in
    order. Scopes are logged as they end, so the late ones are mostly a suffix: one slice."""
    if len(items) != width * len(late):
        items = items[: width * len(late)]
    at = np.flatnonzero(late)
    if not len(at):
        return items, []
    if at[0] == len(late) - len(at):  # a suffix
        return items[: width * int(at[0])], items[width * int(at[0]) :]
    on = late.tolist()
    return (
        [x for i, x in enumerate(items) if not on[i // width]],
        [x for i, x in enumerate(items) if on[i // width]],
    )


def _split_plain(plain: list[Any], late: np.ndarray) -> tuple[list[Any], list[Any]]:
    """``_split`` of ``plain`` scopes, the late ones as rich items."""
    plain, moved = _split(plain, late, 3)
    rich: list[Any] = []
    for i in range(0, len(moved), 3):
        rich.extend((moved[i], moved[i + 1], moved[i + 2], 0, 0, None))
    return plain, rich


def raw_thread(
    buf: ThreadBuffer, log: list[Any], rich: list[Any], marks: list[tuple[str, int, str, dict[str, Any]]]
) -> RawThread:
    """A ``RawThread`` from flat ``log`` and ``rich`` items; names, args and marks made JSON-safe
    (``gputrace.jsonsafe``), never a reason to fail."""
    n_plain = len(log) // 3
    del log[n_plain * 3 :]
    del rich[len(rich) // RICH * RICH :]
    times = np.zeros((n_plain + len(rich) // RICH, 4), np.int64)
    times[:n_plain, 0] = log[1::3]
    times[:n_plain, 1] = log[2::3]
    for col in range(4):
        times[n_plain:, col] = rich[1 + col :: RICH]
    try:
        names = _clean_names(log[0::3] + rich[0::RICH])
    except Exception:
        names = [_clean_name(n) for n in log[0::3] + rich[0::RICH]]
    safe_args = {}
    for k, v in enumerate(rich[5::RICH]):
        if v is None:
            continue
        safe_args[n_plain + k], why = _safe_dict(v)
        if why:  # the scope is kept, without its args, flagged
            times[n_plain + k, 3] |= _DEGRADED
            report_internal("args", f"converting scope args failed ({why}).")
    safe_marks = [(_clean_name(name), ts, kind, _safe_dict(margs)[0]) for name, ts, kind, margs in marks]
    return RawThread(buf.tid, _clean_name(buf.name, 200), names, times, safe_args, safe_marks)


def _safe_dict(d: Any) -> tuple[dict[str, Any], str]:
    """``d`` as JSON-safe args (a plain dict is already), and why converting it failed or ""."""
    try:
        got = d if type(d) is dict and is_plain(d) else jsonsafe(d)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        return {"degraded": f"its args could not be converted ({why})"}, why
    return (got if isinstance(got, dict) else {"args": got}), ""


def _clean_name(n: Any, limit: int = 1000) -> str:
    try:
        return clean_str(n if type(n) is str else str(n), limit)
    except Exception:
        try:
            return short_repr(n)
        except Exception:
            return "?"


def _clean_names(names: list[Any]) -> list[str]:
    """Scope names (anything a user passed) as clean, bounded strings; the list itself when every
    name is one already (a short ASCII str is: the common case costs no call that could fail)."""
    try:
        uniq = set(names)
    except TypeError:  # an unhashable name
        return [_clean_name(n) for n in names]
    plain = {n for n in uniq if type(n) is str and len(n) <= 1000 and n.isascii()}
    fix = {n: c for n in uniq - plain if (c := _clean_name(n)) is not n}
    return [fix.get(n, n) for n in names] if fix else names
