"""Low-level pieces of the wgpu backend: tick conversion, completion waits, query-set pages.

For wgpu-py 0.32 (wgpu-native 29); cffi fills two gaps: the timestamp period (not wrapped) and the
queue's work-done callback (``on_submitted_work_done_sync`` has the wrong signature). Every wait
polls without blocking and ends in a ``GputraceError`` after ``timeout_s``: nothing here can hang.

wgpu-native aborts the process (SIGABRT) when a submit uses a buffer still mapped or pending, so a
read-back given up on is never used again: ``abandon`` unmaps it, or parks it (with what its work
needs) until its mapping settles; a work-done callback stays alive until wgpu-native has called it.

>>> import numpy as np
>>> ticks_to_ns(np.array([0, 10, 1_000_001], np.uint64), 2.5).tolist()
[0, 25, 2500002]
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace.backends.base import Clock
from gputrace.errors import GputraceError

# WebGPU caps a query set at 4096 queries; a page holds 2048 passes (a begin and an end slot each).
PAGE_QUERIES = 4096
# Resolving needs a 256-byte aligned offset: resolve to a scratch buffer, then copy to the slot's.
RESOLVE_ALIGNMENT = 256
# Spin this long on a non-blocking poll before sleeping between polls (tight calibration windows).
SPIN_NS = 2_000_000


def ticks_to_ns(ticks: npt.NDArray[Any], period: float) -> npt.NDArray[np.int64]:
    """Device ticks → ns, exactly for the rational nearest to ``period`` (ns per tick), in integer
    arithmetic: floats would lose up to 256 ns on epoch-sized ticks (NVIDIA counts ns since 1970)."""
    t = np.asarray(ticks).astype(np.int64)
    if period == 1.0:
        return t
    if not period > 0.0:
        raise GputraceError(f"the timestamp period must be positive, not {period!r}.")
    frac = Fraction(period).limit_denominator(1 << 20)
    num, den = np.int64(frac.numerator), np.int64(frac.denominator)
    whole, rest = np.divmod(t, den)
    out: npt.NDArray[np.int64] = (whole * num + (rest * num) // den).astype(np.int64)
    return out


def timestamp_period(queue: Any) -> float:
    """The queue's ns per timestamp tick, read through cffi (wgpu-py 0.32 does not wrap it)."""
    from wgpu.backends.wgpu_native._api import libf

    return float(libf.wgpuQueueGetTimestampPeriod(queue._internal))


def poll(device: Any) -> None:
    """Let wgpu-native run its callbacks without blocking."""
    from wgpu.backends.wgpu_native._api import ffi, libf

    if device._internal:
        libf.wgpuDevicePoll(device._internal, False, ffi.NULL)


def _poll_until(device: Any, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``device`` until ``ready()``: spin, then sleep longer each time; then a ``GputraceError``."""
    start = time.monotonic_ns()
    deadline = start + int(timeout_s * 1e9)
    nap = 0.0
    while not ready():
        poll(device)
        if ready():
            return
        now = time.monotonic_ns()
        if now > deadline:
            raise GputraceError(
                f"the GPU did not finish {what} within {timeout_s:g} s; "
                "its queue may be hung (gputrace stopped waiting)."
            )
        if now - start > SPIN_NS:
            nap = min(max(nap * 2, 50e-6), 2e-3)
            time.sleep(nap)


_parked: list[QueryPage] = []  # pages whose read-back was given up on while mapping
_parked_lock = threading.Lock()


def abandon(page: QueryPage) -> bool:
    """Give up on reading ``page`` back. True when its read-back is unmapped: the page is reset
    and may be used again; else it is parked, as it is, until its mapping settles. Never raises."""
    settle_parked()
    try:
        state = str(page.readback.map_state)
        if state == "mapped":
            page.readback.unmap()
        if state == "mapped" or (state == "unmapped" and page.promise is None):  # (or never mapped)
            page.reset()
            return True
    except Exception:
        pass
    with _parked_lock:
        _parked.append(page)
    return False


def settle_parked() -> None:
    """Let go of parked pages whose mapping has settled (unmapping those that mapped)."""
    with _parked_lock:
        todo = list(_parked)
    done = []
    for page in todo:
        try:
            if page.promise is None or not mapped_ready(page.promise):
                continue  # still pending on the GPU (or unknowable): kept
            with contextlib.suppress(Exception):  # (a mapping that failed leaves it unmapped)
                page.promise.sync_wait()  # settled: runs its handler (the buffer becomes mapped) or raises
            if str(page.readback.map_state) == "mapped":
                page.readback.unmap()
        except Exception:
            continue
        done.append(page)
    if done:
        with _parked_lock:
            _parked[:] = [page for page in _parked if page not in done]


# Work-done callbacks wgpu-native has not called yet: their owners stay alive until it does (a
# freed cffi callback called later would crash the process).
_unanswered: dict[int, Any] = {}


class WorkDone:
    """Completion of submitted work, timed on the session clock inside the callback: ``request()``
    asks for a call back once all submitted so far is done, ``wait(req)`` returns when it ran."""

    def __init__(self, device: Any, clock: Clock, timeout_s: float) -> None:
        from wgpu.backends.wgpu_native._api import ffi, lib

        self.device = device
        self.clock = clock
        self.timeout_s = timeout_s
        self._done: dict[int, tuple[int, int]] = {}
        self._next = 0
        self._asked: set[int] = set()  # requests wgpu-native has not called back yet
        self._lock = threading.Lock()
        self._ok = int(lib.WGPUQueueWorkDoneStatus_Success)
        self._mode = int(lib.WGPUCallbackMode_AllowProcessEvents)
        self._callback_error: str = ""  # why a callback raised (its wait then ends at once)
        # the type comes from wgpu-native's own header, so its signature cannot drift
        self._callback = ffi.callback("WGPUQueueWorkDoneCallback", self._on_done, onerror=self._on_error)

    def _on_done(self, status: Any, message: Any, userdata1: Any, userdata2: Any) -> None:
        from wgpu.backends.wgpu_native._api import ffi

        now = self.clock()
        req = int(ffi.cast("uintptr_t", userdata1))
        with self._lock:
            self._done[req] = (now, int(status))
            self._asked.discard(req)
            if not self._asked:
                _unanswered.pop(id(self), None)

    def _on_error(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """``_on_done`` raised (unprinted): its wait ends now, as a fault, not as a GPU timeout."""
        self._callback_error = f"{exc_type.__name__}: {exc}"

    def request(self) -> int:
        from wgpu.backends.wgpu_native._api import ffi, libf

        with self._lock:
            self._next += 1
            req = self._next
            self._asked.add(req)
            _unanswered[id(self)] = self
        info = ffi.new(
            "WGPUQueueWorkDoneCallbackInfo *",
            {"mode": self._mode, "callback": self._callback, "userdata1": ffi.cast("void *", req)},
        )
        libf.wgpuQueueOnSubmittedWorkDone(self.device.queue._internal, info[0])
        return req

    def wait(self, req: int, what: str = "its submitted work") -> int:
        def answered() -> bool:
            if req in self._done:
                return True
            if self._callback_error:
                why, self._callback_error = self._callback_error, ""
                raise RuntimeError(f"a wgpu work-done callback failed ({why})")
            return False

        _poll_until(self.device, answered, self.timeout_s, what)
        with self._lock:
            done_ns, status = self._done.pop(req)
        if status != self._ok:
            raise GputraceError(f"waiting for the GPU failed (work-done status {status}).")
        return done_ns


def wait_mapped(buffer: Any, promise: Any, timeout_s: float, what: str) -> None:
    """Wait for ``buffer.map_async``'s promise, polling, with a timeout."""
    _poll_until(buffer._device, lambda: mapped_ready(promise), timeout_s, what)
    promise.sync_wait()  # resolved already: runs the handler (marks the buffer mapped) or raises


def mapped_ready(promise: Any) -> bool:
    """Has the promise been settled (by the poll thread or our own poll)? Never blocks."""
    event = getattr(promise, "_thread_event", None)
    if event is not None:
        return bool(event.is_set())
    return str(getattr(promise, "_state", "pending")) != "pending"


class QueryPage:
    """A pooled query set with its scratch resolve buffer and its read-back buffer; slots go in
    pairs (a pass's begin, end). ``unsubmitted`` counts the encoders or command buffers holding
    slots not submitted yet: read-back maps only a closed page at 0, so no submit meets it mapped."""

    __slots__ = (
        "closed", "count", "promise", "query_set", "readback", "records", "resolve_buf",
        "unsubmitted", "used",
    )  # fmt: skip

    def __init__(self, device: Any, count: int) -> None:
        import wgpu

        self.count = count
        self.query_set = device.create_query_set(label="gputrace timestamps", type="timestamp", count=count)
        size = count * 8
        self.resolve_buf = device.create_buffer(
            label="gputrace resolve",
            size=-(-size // RESOLVE_ALIGNMENT) * RESOLVE_ALIGNMENT,
            usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC,
        )
        self.readback = device.create_buffer(
            label="gputrace readback",
            size=size,
            usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
        )
        self.reset()

    def reset(self) -> None:
        self.used = 0
        self.unsubmitted = 0
        self.closed = False
        self.promise: Any = None
        self.records: list[Any] = []

    def writes(self, slot: int) -> dict[str, Any]:
        """``timestamp_writes`` for a pass timed by slots ``slot`` (begin) and ``slot + 1`` (end)."""
        return {
            "query_set": self.query_set,
            "beginning_of_pass_write_index": slot,
            "end_of_pass_write_index": slot + 1,
        }

    def start_map(self) -> None:
        # READ_NOSYNC: wgpu-py would otherwise submit an empty command buffer first; every copy
        # into this buffer was submitted already, so there is nothing to flush.
        self.promise = self.readback.map_async("READ_NOSYNC", 0, max(self.used, 2) * 8)

    def read_ticks(self) -> npt.NDArray[np.uint64]:
        try:
            data = self.readback.read_mapped(0, max(self.used, 2) * 8)
        finally:
            self.readback.unmap()  # mapped or not, never left mapped by a failed read
        ticks: npt.NDArray[np.uint64] = np.frombuffer(data, np.uint64).copy()
        return ticks
