"""The recorder: the hot path behind ``trace()``.

Entering a scope reads the clock, asks a timed backend for a token and pushes onto this thread's
stack; leaving it appends the name and the two clock readings to this thread's buffer (and the
token and flags, when there are any). No lock shared across threads, no I/O, no resolution:
that all happens after the session stops. With no session active, ``trace`` costs one global
read per enter and exit.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from gputrace.backends.base import Backend, Clock
from gputrace.errors import report_internal
from gputrace.model import Flag

F = TypeVar("F", bound=Callable[..., Any])

# The active recorder, or None, and copies of what the hot path needs from it (module globals
# are the cheapest lookups Python has). Only ``Recorder.activate``/``deactivate`` write them.
_recorder: Recorder | None = None
_clock: Clock = time.perf_counter_ns
_tls: threading.local = threading.local()
_timed = False

_DEGRADED = int(Flag.DEGRADED)
_ERROR = int(Flag.ERROR)


class ThreadBuffer:
    """Everything one thread recorded. Only its own thread appends to it."""

    __slots__ = ("ident", "log", "marks", "name", "rich", "stack", "tid")

    def __init__(self) -> None:
        t = threading.current_thread()
        self.ident = t.ident or 0
        self.tid = threading.get_native_id()
        self.name = t.name
        self.stack: list[tuple[Any, int, int]] = []  # (trace object, cpu_start_ns, token)
        # Plain scopes, flat: name, cpu_start_ns, cpu_end_ns, ... Extending a list with three
        # references is the cheapest store Python has (an array('q') converts each int: +190 ns).
        self.log: list[Any] = []
        # Scopes with a GPU token, flags or args, flat: name, cpu_start_ns, cpu_end_ns, token, flags,
        # args (or None). One ``extend`` per scope, so another thread can take a prefix of the list
        # at any time (streaming) and never see half a scope.
        self.rich: list[Any] = []
        self.marks: list[tuple[str, int, str, dict[str, Any]]] = []


class Recorder:
    """Owns the per-thread buffers of one session."""

    def __init__(self, clock: Clock, backend: Backend) -> None:
        self.clock = clock
        self.backend = backend
        self.timed = backend.timed
        self.owner: object = None  # the session that owns this recorder
        self.local = threading.local()
        self.buffers: list[ThreadBuffer] = []
        self._buffers_lock = threading.Lock()  # taken once per thread, never per scope

    def buffer(self) -> ThreadBuffer:
        try:
            buf: ThreadBuffer = self.local.buf
        except AttributeError:
            buf = ThreadBuffer()
            self.local.buf = buf
            with self._buffers_lock:
                self.buffers.append(buf)
        return buf

    def activate(self) -> None:
        global _recorder, _clock, _tls, _timed
        if _recorder is not None:
            from gputrace.errors import GputraceError

            raise GputraceError("a gputrace session is already active; stop it before starting another.")
        _clock, _tls, _timed = self.clock, self.local, self.timed
        _recorder = self

    def deactivate(self) -> None:
        global _recorder
        if _recorder is self:
            _recorder = None

    def internal_error(self, where: str, exc: BaseException) -> None:
        report_internal(
            f"{where}:{type(exc).__name__}",
            f"{where} failed inside the profiler ({type(exc).__name__}: {exc}); "
            "the scope is recorded as degraded and your program continues.",
        )


def active_recorder() -> Recorder | None:
    return _recorder


class trace:
    """Trace a region: ``with trace("name"):`` or ``@trace("name")``.

    Scopes nest per thread. The same object can be reused and entered recursively. Keyword
    arguments are kept as the scope's args (shown in Perfetto and the viewer); ``stream`` names the
    CUDA stream the work goes to (default: CuPy's current stream).

    >>> import gputrace
    >>> @gputrace.trace("double")
    ... def double(x):
    ...     return 2 * x
    >>> with gputrace.session(backend="cpu") as s:
    ...     with gputrace.trace("outer", batch=4):
    ...         _ = double(21)
    >>> [(sc.name, sc.depth) for sc in s.trace]
    [('outer', 0), ('double', 1)]

    If the user's code raises inside the scope, the scope is closed, marked with the exception
    type, and the exception propagates unchanged. With no session active the cost is a global
    read per enter and exit.
    """

    __slots__ = ("args", "name", "stream")

    def __init__(self, name: str, /, stream: Hashable | None = None, **args: Any) -> None:
        self.name = name
        self.stream = stream
        self.args = args

    def __enter__(self) -> trace:
        rec = _recorder
        if rec is None:
            return self
        try:
            buf = _tls.buf
        except AttributeError:
            buf = rec.buffer()
        if _timed:
            cpu_start = _clock()
            try:
                token = rec.backend.begin(self.name, self.stream, cpu_start)
            except Exception as exc:
                rec.internal_error("starting a GPU span", exc)
                token = -1
            buf.stack.append((self, cpu_start, token))
        else:
            buf.stack.append((self, _clock(), 0))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if _recorder is None:
            return
        try:
            buf = _tls.buf
            entry = buf.stack.pop()
        except (AttributeError, IndexError):
            return  # entered before this session started: nothing of it was recorded
        obj, cpu_start, token = entry
        if obj is not self:
            found = _unwind(buf, entry, self)
            if found is None:
                return
            obj, cpu_start, token = found
        if token or exc_type is not None or self.args:
            self._exit_slow(buf, cpu_start, token, exc_type)
            return
        buf.log.extend((self.name, cpu_start, _clock()))

    def _exit_slow(
        self,
        buf: ThreadBuffer,
        cpu_start: int,
        token: int,
        exc_type: type[BaseException] | None,
    ) -> None:
        """Leaving a scope that has a GPU token, args or an exception."""
        rec = _recorder
        assert rec is not None
        flags = 0
        if token > 0:
            try:
                rec.backend.end(token)
            except Exception as err:
                rec.internal_error("ending a GPU span", err)
                flags = _DEGRADED
        elif token < 0:
            flags = _DEGRADED
            token = 0
        cpu_end = _clock()
        args = None
        if exc_type is not None or self.args:
            args = dict(self.args)
            if exc_type is not None:
                flags |= _ERROR
                args["exception"] = exc_type.__name__
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


def _unwind(buf: ThreadBuffer, popped: tuple[Any, int, int], obj: trace) -> tuple[Any, int, int] | None:
    """Scopes left out of order (interleaved coroutines on one thread): find ``obj``'s entry."""
    stack = buf.stack
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] is obj:
            found = stack.pop(i)
            stack.append(popped)
            return found
    stack.append(popped)
    return None


def mark(name: str, **args: Any) -> None:
    """Record an instant on this thread (shown as a marker in Perfetto and the viewer)."""
    rec = _recorder
    if rec is None:
        return
    rec.buffer().marks.append((name, rec.clock(), "mark", args))


@dataclass
class RawThread:
    """One thread's drained buffer, handed to the resolver."""

    tid: int
    name: str
    names: list[str]
    times: npt.NDArray[np.int64]  # shape (n, 4): cpu_start_ns, cpu_end_ns, token, flags
    args: dict[int, dict[str, Any]]  # row in ``names``/``times`` -> args
    marks: list[tuple[str, int, str, dict[str, Any]]] = field(default_factory=list)


def drain(rec: Recorder, stop_ns: int) -> list[RawThread]:
    """Take every thread's records. Scopes still open at stop are kept, ending at ``stop_ns``,
    flagged degraded with ``args["unclosed"] = True``: nothing recorded is dropped."""
    with rec._buffers_lock:
        buffers = list(rec.buffers)
    out = []
    for buf in buffers:
        log, rich = list(buf.log), list(buf.rich)
        for obj, cpu_start, token in list(buf.stack):
            a = dict(getattr(obj, "args", {}) or {})
            a["unclosed"] = True
            rich.extend((getattr(obj, "name", "?"), cpu_start, stop_ns, max(token, 0), _DEGRADED, a))
        out.append(raw_thread(buf, log, rich, list(buf.marks)))
    return out


RICH = 6  # items per scope in ``ThreadBuffer.rich``


def raw_thread(
    buf: ThreadBuffer, log: list[Any], rich: list[Any], marks: list[tuple[str, int, str, dict[str, Any]]]
) -> RawThread:
    """A ``RawThread`` from flat ``log`` (3 per scope) and ``rich`` (``RICH`` per scope) items."""
    n_plain = len(log) // 3
    times = np.zeros((n_plain + len(rich) // RICH, 4), np.int64)
    times[:n_plain, 0] = log[1::3]
    times[:n_plain, 1] = log[2::3]
    for col in range(4):
        times[n_plain:, col] = rich[1 + col :: RICH]
    names = log[0::3] + rich[0::RICH]
    args = {n_plain + k: a for k, a in enumerate(rich[5::RICH]) if a is not None}
    return RawThread(buf.tid, buf.name, names, times, args, marks)
