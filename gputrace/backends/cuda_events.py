"""CUDA-event timing for the cuda backend: a pooled CUDA event pair per scope, through CuPy.

The fallback where CUPTI cannot be used, and the path that coexists with other profilers: one span
per scope, recorded at its entry on the stream its work goes to (CuPy's current stream, or
``trace(name, stream=s)``); what that span can and cannot see: docs/cuda.md. Events come from a
per-device pool and go back once read: creating one costs as much as recording it.

The GPU clock: ``cudaEventElapsedTime`` gives float32 ms (61 ns resolution 1 s apart), so
*anchor* events on the backend's own stream (one per calibration, from ``begin`` at most every
``ANCHOR_EVERY_NS``) are chained, anchor ``k`` at ``G(k-1) + elapsed(k-1, k)``, and a scope's
event ``e`` is placed at ``G(a) + elapsed(a, e)`` from the anchor ``a`` issued nearest to it.
Calibration brackets an event record on that idle stream between two session-clock reads, polled
to completion (6–8 µs wide on the H200). Not ``%globaltimer`` anchors (a kernel reads the timer,
an event follows it): on the H200 the event is stamped when its record *arrives*, for a one-thread
kernel after the kernel finished, at a time set by the CPU's launch jitter: such anchors disagreed
by up to 10 µs.

Scopes entered while their stream captures a CUDA graph cannot be timed by events: they are
flagged ``untimed``, with one notice.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import operator
import threading
import time
from collections.abc import Hashable
from typing import Any

import numpy as np

from gputrace.backends.base import Backend, CalibrationSample, Clock, Collected, SpanBatch
from gputrace.errors import GputraceError, notice
from gputrace.model import QueueInfo

# A span at or below this holds no GPU work: two event records queued back to back measure
# 1.25–2.34 µs apart on the H200, an empty kernel between them 2.69–3.94 µs (docs/cuda.md).
EMPTY_SPAN_NS = 2_500
ANCHOR_EVERY_NS = 1_000_000_000
# Brackets tried per calibration, and the tightest kept: the resolver's bound follows its worst
# sample, and a wide window (a preempted thread, a GPU waking up) only loosens it.
SAMPLES_PER_CALIBRATION = 6
SAMPLES_KEPT = 2
DEFAULT_SYNC_TIMEOUT_S = 120.0
# Without syncs the pool would grow by two events per scope: once this many ended scopes wait,
# every HARVEST_EXITS-th exit reads the oldest HARVEST_BATCH finished ones without waiting (all
# every 1,024 scopes, read in Python, stalled ~5 ms each time on the H200; in bulk a scope costs
# 1.2 µs in batches of 32, 0.7 in batches of 256 on 2 cores, ``benchmarks/probe_events_python.py``).
HARVEST_EVERY = 512
HARVEST_EXITS = 64
HARVEST_BATCH = 4 * HARVEST_EXITS
WAIT_NAP_S = 1e-4  # longest nap while waiting for the GPU (1 ms naps made a stop ~0.5 ms late)
RETIRE_EVERY = 256  # harvests between two anchor retirements (it walks every live scope)
SPAN_BYTES = 256  # a scope ended and not yet collected (its entry: a 5-tuple of ints; once read, 48 B)
_MS = 1e6
_EV0, _EV1 = operator.itemgetter(2), operator.itemgetter(3)  # an ended scope's two events


def probe() -> str | None:
    """Why CUDA through CuPy cannot be used here, or None. Never raises."""
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc})"
    except Exception as exc:
        return f"importing CuPy failed ({type(exc).__name__}: {exc})"
    try:
        if not cupy.cuda.is_available():
            return "CuPy found no usable CUDA device"
    except Exception as exc:
        return f"CuPy could not query CUDA devices ({type(exc).__name__}: {exc})"
    return None


def device_name(index: int) -> str:
    """The name CuPy gives CUDA device ``index``."""
    import cupy

    raw = cupy.cuda.runtime.getDeviceProperties(index).get("name", b"")
    return (raw.decode() if isinstance(raw, bytes) else str(raw)) or f"CUDA device {index}"


def nearest(anchor_cpu_ns: list[int], cpu_ns: int) -> int:
    """Index of the anchor issued nearest to ``cpu_ns`` (ties go to the earlier one).

    >>> nearest([0, 100, 200], 149), nearest([0, 100, 200], 150), nearest([0, 100, 200], 999)
    (1, 1, 2)
    """
    i = bisect.bisect_left(anchor_cpu_ns, cpu_ns)
    if i == 0:
        return 0
    if i == len(anchor_cpu_ns):
        return i - 1
    return i if anchor_cpu_ns[i] - cpu_ns < cpu_ns - anchor_cpu_ns[i - 1] else i - 1


def ms_to_ns(ms: float) -> int:
    """``cudaEventElapsedTime`` milliseconds to integer ns.

    >>> ms_to_ns(0.001248), ms_to_ns(-0.5)
    (1248, -500000)
    """
    return round(ms * _MS)


# Plain classes, not dataclasses: creating a dataclass costs ~1 ms at import, inside session start.
class _Anchor:
    __slots__ = ("cpu_ns", "event", "gpu_ns")

    def __init__(self, cpu_ns: int, event: int) -> None:
        self.cpu_ns = cpu_ns  # session clock when it was recorded
        self.event = event
        self.gpu_ns: int | None = None  # ns since the device's first anchor, once chained


class _Device:
    __slots__ = ("anchor_due_ns", "anchors", "created", "index", "lock", "name", "pool", "stream")

    def __init__(self, index: int, name: str, stream: Any) -> None:
        self.index = index
        self.name = name
        self.stream = stream  # the backend's own non-blocking stream on this device
        self.pool: list[int] = []
        self.created = 0
        self.anchors: list[_Anchor] = []
        self.anchor_due_ns = 0
        self.lock = threading.Lock()


class _Queue:
    __slots__ = ("dev", "last_end", "q", "sptr", "stream")

    def __init__(self, q: int, dev: _Device, sptr: int, stream: Any) -> None:
        self.q = q
        self.dev = dev
        self.sptr = sptr
        self.stream = stream  # the user's stream object, kept alive so its handle is not reused
        self.last_end = 0  # last end event recorded on it (0: none since the last sync)


class CudaEventsBackend(Backend):
    """CUDA events through CuPy; ``backend_options``: ``sync_timeout_s``, ``samples``."""

    name = "cuda"
    timed = True
    spans_cover_children = False
    empty_span_ns = EMPTY_SPAN_NS
    calibration_target_ns = 10_000  # an event record between two clock reads: 6–8 µs wide (H200)
    timing_note = ""  # why CUPTI was not used (set by gputrace.backends.cuda.CudaBackend)

    def __init__(
        self,
        clock: Clock,
        *,
        sync_timeout_s: float = DEFAULT_SYNC_TIMEOUT_S,
        samples: int = SAMPLES_PER_CALIBRATION,
        anchor_every_ns: int = ANCHOR_EVERY_NS,
    ) -> None:
        super().__init__(clock)  # (gputrace.backends.cuda.CudaBackend probed CuPy already)
        import cupy

        self._cp = cupy
        self._rt = cupy.cuda.runtime
        self._record = cupy.cuda.runtime.eventRecord
        self._capturing = cupy.cuda.runtime.streamIsCapturing
        self._current = cupy.cuda.get_current_stream
        self._get_device = cupy.cuda.runtime.getDevice
        self.sync_timeout_s = float(sync_timeout_s)
        self.samples = max(1, int(samples))
        self.anchor_every_ns = int(anchor_every_ns)
        self._tokens = itertools.count(1)
        self._devs: dict[int, _Device] = {}
        self._queues: dict[tuple[int, int], _Queue] = {}
        self._queue_list: list[_Queue] = []
        self._open: dict[int, tuple[_Queue, int, int]] = {}
        self._ended: list[tuple[int, _Queue, int, int, int]] = []
        self._captured: set[int] = set()
        self._captured_noticed = False
        self._lock = threading.Lock()  # slow paths only: new device, new queue
        self._pending_samples: list[CalibrationSample] = []
        self._harvested: list[SpanBatch] = []  # spans read at scope exits, for the next collect
        self._harvested_degraded: dict[int, str] = {}
        self._harvests = 0
        self._exits = 0
        self._harvest_lock = threading.Lock()
        self._synced_ns = 0
        self._one_device = cupy.cuda.runtime.getDeviceCount() == 1
        self._by_ptr: dict[int, _Queue] = {}  # the single-device fast path
        self._device(self._get_device())

    # hot path -------------------------------------------------------------------------------
    def begin(self, name: str, stream: Hashable | None, cpu_ns: int) -> int:
        s = self._current() if stream is None else stream
        sptr = s if isinstance(s, int) else getattr(s, "ptr", None)
        if sptr is None:
            sptr = _stream_ptr(s)
        qs = self._by_ptr.get(sptr) if self._one_device else None
        if qs is None:
            dev = getattr(s, "device_id", -1)
            if dev < 0:
                dev = self._get_device()
            qs = self._queues.get((dev, sptr)) or self._new_queue(dev, sptr, s)
        token = next(self._tokens)
        if sptr and self._capturing(sptr):
            self._refuse_capture(token, name)
            return token
        d = qs.dev
        try:
            ev = d.pool.pop()
        except IndexError:
            ev = self._new_event(d)
        self._record(ev, sptr)
        self._open[token] = (qs, ev, cpu_ns)
        if cpu_ns >= d.anchor_due_ns:
            self._anchor(d, auto=True)
        return token

    def end(self, token: int) -> None:
        got = self._open.get(token)
        if got is None:
            return  # refused (graph capture) at begin
        qs, ev0, cpu_ns = got
        d = qs.dev
        try:
            ev1 = d.pool.pop()
        except IndexError:
            ev1 = self._new_event(d)
        self._record(ev1, qs.sptr)
        qs.last_end = ev1
        self._ended.append((token, qs, ev0, ev1, cpu_ns))
        # left open until it is in ``_ended``: a collect's horizon sees every scope in one of them
        self._open.pop(token, None)
        if len(self._ended) >= HARVEST_EVERY:
            self._exits += 1
            if self._exits % HARVEST_EXITS == 0:
                self._harvest()

    def _harvest(self) -> None:
        """Read the scopes whose events are done, without waiting; keep them for ``collect``."""
        if not self._harvest_lock.acquire(blocking=False):
            return  # another thread is at it
        try:
            self._harvests += 1
            retire = self._harvests % RETIRE_EVERY == 0
            got = self._take_finished(None, limit=HARVEST_BATCH, retire=retire)
            self._harvested.append(got.spans)
            self._harvested_degraded.update(got.degraded)
        finally:
            self._harvest_lock.release()

    # slow paths -----------------------------------------------------------------------------
    def _device(self, index: int) -> _Device:
        d = self._devs.get(index)
        if d is not None:
            return d
        with self._lock:
            d = self._devs.get(index)
            if d is None:
                with self._cp.cuda.Device(index):
                    d = _Device(index, device_name(index), self._cp.cuda.Stream(non_blocking=True))
                    d.pool = [self._rt.eventCreateWithFlags(0) for _ in range(64)]
                    d.created = 64
                self._anchor(d, auto=False)
                self._pending_samples.extend(self._bracket(d))
                self._devs[index] = d
        return d

    def _new_event(self, d: _Device) -> int:
        prev = self._get_device()
        if prev != d.index:
            self._rt.setDevice(d.index)
        try:
            ev: int = self._rt.eventCreateWithFlags(0)
        finally:
            if prev != d.index:
                self._rt.setDevice(prev)
        d.created += 1
        return ev

    def _new_queue(self, dev: int, sptr: int, stream: Any) -> _Queue:
        d = self._device(dev)
        with self._lock:
            qs = self._queues.get((dev, sptr))
            if qs is None:
                qs = _Queue(len(self._queue_list), d, sptr, stream if not isinstance(stream, int) else None)
                self._queue_list.append(qs)
                self._queues[(dev, sptr)] = qs
                if self._one_device:
                    self._by_ptr[sptr] = qs
        return qs

    def _refuse_capture(self, token: int, name: str) -> None:
        self._captured.add(token)
        if not self._captured_noticed:
            self._captured_noticed = True
            notice(
                f"scope {name!r} was entered while its stream was capturing a CUDA graph; scopes "
                "inside graph capture are not timed on the GPU (flagged untimed): trace the graph "
                "launch instead."
            )

    def _anchor(self, d: _Device, *, auto: bool) -> None:
        """Record an anchor event on the backend's own stream of device ``d``."""
        with d.lock:
            now = self.clock()
            if auto and now < d.anchor_due_ns:
                return  # another thread anchored meanwhile
            d.anchor_due_ns = now + self.anchor_every_ns
            ev = d.pool.pop() if d.pool else self._new_event(d)
            self._record(ev, d.stream.ptr)
            d.anchors.append(_Anchor(self.clock(), ev))

    def _wait(self, events: list[tuple[int, str]], deadline: float) -> None:
        """Poll events until done; past ``deadline`` raise one clear error (never hang)."""
        query = self._rt.eventQuery
        spins = 0
        for ev, where in events:
            while query(ev) != 0:
                spins += 1
                if spins > 2000:  # then naps of at most 0.1 ms: finished work is seen within that
                    time.sleep(min(WAIT_NAP_S, 1e-6 * (spins - 2000)))
                if time.monotonic() > deadline:
                    raise GputraceError(
                        f"the GPU did not finish the traced work on {where} within "
                        f"{self.sync_timeout_s:g} s; pass backend_options={{'sync_timeout_s': ...}} "
                        "if that is expected."
                    )

    def _bracket(self, d: _Device) -> list[CalibrationSample]:
        """Samples: an event record bracketed by session-clock reads, on the backend's stream."""
        out: list[tuple[int, int, int]] = []
        deadline = time.monotonic() + self.sync_timeout_s
        query = self._rt.eventQuery
        sptr = d.stream.ptr
        clock = self.clock
        ev_list = [d.pool.pop() if d.pool else self._new_event(d) for _ in range(self.samples)]
        # the anchor issued just before must be done first, so the brackets see an idle stream
        self._wait([(d.anchors[-1].event, f"device {d.index}")], deadline)
        for ev in ev_list:
            t0 = clock()
            self._record(ev, sptr)
            while query(ev) != 0:
                if time.monotonic() > deadline:
                    self._wait([(ev, f"device {d.index}")], deadline)
            t1 = clock()
            out.append((t0, ev, t1))
        out.sort(key=lambda x: x[2] - x[0])
        self._read_anchors(d)
        anchor = d.anchors[-1]
        samples = []
        if anchor.gpu_ns is not None:
            elapsed = self._rt.eventElapsedTime
            for t0, ev, t1 in out[:SAMPLES_KEPT]:
                g = anchor.gpu_ns + ms_to_ns(elapsed(anchor.event, ev))
                samples.append(CalibrationSample(t0, g, t1, d.index))
        d.pool.extend(ev_list)
        return samples

    def _read_anchors(self, d: _Device) -> None:
        """Chain anchors whose event is done: each sits ``elapsed`` after the previous one."""
        query = self._rt.eventQuery
        prev: _Anchor | None = None
        for a in d.anchors:
            if a.gpu_ns is None and query(a.event) == 0:
                if prev is None:
                    a.gpu_ns = 0
                elif prev.gpu_ns is not None:
                    a.gpu_ns = prev.gpu_ns + ms_to_ns(self._rt.eventElapsedTime(prev.event, a.event))
            prev = a

    # sync, calibrate, collect ---------------------------------------------------------------
    def sync(self) -> None:
        deadline = time.monotonic() + self.sync_timeout_s
        waits = [
            (qs.last_end, f"device {qs.dev.index} {_label(qs)}") for qs in self._queue_list if qs.last_end
        ]
        waits += [
            (d.anchors[-1].event, f"device {d.index} (gputrace's stream)")
            for d in self._devs.values()
            if d.anchors
        ]
        self._wait(waits, deadline)
        self._synced_ns = self.clock()

    def calibrate(self) -> list[CalibrationSample]:
        out, self._pending_samples = self._pending_samples, []
        for d in list(self._devs.values()):
            self._anchor(d, auto=False)
            out.extend(self._bracket(d))
        return out

    def collect(self) -> Collected:
        with self._harvest_lock:
            return self._with_harvested(self._take_finished(self._synced_ns or self.clock()))

    def _with_harvested(self, got: Collected) -> Collected:
        """``got`` after the spans harvested at scope exits, with the refused scopes (harvest lock held)."""
        early, self._harvested = self._harvested, []
        got.spans = SpanBatch.concat([*early, got.spans])
        got.degraded.update(self._harvested_degraded)
        self._harvested_degraded = {}
        got.untimed, self._captured = self._captured, set()
        return got

    def waiting_bytes(self) -> int:
        """Bytes of spans read or waiting, not yet collected (the streamer collects early on many)."""
        return (sum(map(len, self._harvested)) + len(self._ended)) * SPAN_BYTES

    def collect_background(self) -> tuple[Collected, int | None]:
        """A collect without a sync (the streamer's timer): the spans of ended scopes whose events
        are done, and the time before which every ended scope's span is in: the earliest entry of
        a scope open or ended unread (a scope is in ``_open`` until it is in ``_ended``), or now."""
        with self._harvest_lock:
            got = self._with_harvested(self._take_finished(None))
            now = self.clock()
            live = [c for _, _, c in list(self._open.values())] + [r[4] for r in list(self._ended)]
        return got, (min(live) - 1 if live else now)

    def _take_finished(self, done_by: int | None, limit: int | None = None, retire: bool = True) -> Collected:
        """Spans of the ended scopes whose end event is done; their events go back to the pool.

        ``done_by``: when those events were known done (the sync's end); None without a sync: the
        clock is read after the last query, and scopes no finished anchor can place yet wait.
        ``limit``: read at most that many of the oldest ended scopes.
        """
        got = Collected()
        n = len(self._ended) if limit is None else min(limit, len(self._ended))
        ended = self._ended[:n]  # other threads may append meanwhile: never swap the list
        query = self._rt.eventQuery
        elapsed = self._rt.eventElapsedTime
        cpu_index: dict[int, tuple[list[int], list[_Anchor]]] = {}
        for d in self._devs.values():
            self._read_anchors(d)
            ready = [a for a in d.anchors if a.gpu_ns is not None]
            cpu_index[d.index] = ([a.cpu_ns for a in ready], ready)
        keep = []
        released: set[int] = set()
        placed: list[tuple[int, int, int, int, int]] = []
        # a stream's events complete in order: its newest end event done, so are the older ones
        newest: dict[int, int] = {}
        queues = len(self._queue_list)
        for rec in reversed(ended):
            newest.setdefault(rec[1].q, rec[3])
            if len(newest) == queues:  # (every queue has its newest: the rest are older)
                break
        queue_done = {q: query(ev) == 0 for q, ev in newest.items()}
        spans = None
        ready1 = next(iter(cpu_index.values()))[1] if len(cpu_index) == 1 else []
        if ended and ready1 and all(queue_done.values()):  # (one device, every scope finished)
            spans = self._place_all(ended, ready1, done_by)
        if spans is not None:
            got.spans = spans
            pool = ended[0][1].dev.pool
            pool.extend(map(_EV0, ended))
            pool.extend(map(_EV1, ended))
            released = set(map(_EV1, ended))
            ended = []
        blocked: set[int] = set()  # queues with an end event not done: the later ones are not either
        for rec in ended:
            token, qs, ev0, ev1, cpu_ns = rec
            d = qs.dev
            cpus, ready = cpu_index[d.index]
            if not queue_done[qs.q] and (qs.q in blocked or query(ev1) != 0):
                blocked.add(qs.q)
                keep.append(rec)  # not finished yet (or a sync timed out): a later collect takes it
                continue
            if not ready and done_by is None:
                keep.append(rec)
                continue
            if not ready:
                got.degraded[token] = "no clock anchor could be read on this device"
            else:
                a = ready[nearest(cpus, cpu_ns)]
                try:
                    start = a.gpu_ns + ms_to_ns(elapsed(a.event, ev0))  # type: ignore[operator]
                    dur = ms_to_ns(elapsed(ev0, ev1))
                    placed.append((token, qs.q, start, start + dur, cpu_ns))
                except Exception as exc:
                    got.degraded[token] = f"reading its CUDA events failed ({type(exc).__name__})"
            d.pool.append(ev0)
            d.pool.append(ev1)
            released.add(ev1)
        if spans is None:
            known_done = self.clock() if done_by is None else done_by
            cols = np.array(placed, np.int64).reshape(-1, 5)
            got.spans = SpanBatch(np.column_stack([cols, np.full(len(cols), known_done, np.int64)]))
        del self._ended[:n]
        self._ended[:0] = keep
        for qs in self._queue_list:
            if qs.last_end in released:
                qs.last_end = 0  # nothing newer was recorded on it: the next sync skips it
        if retire:
            self._retire_anchors()
        return got

    def _place_all(
        self, ended: list[tuple[int, _Queue, int, int, int]], ready: list[_Anchor], done_by: int | None
    ) -> SpanBatch | None:
        """The spans of ``ended`` (all finished, one device, anchors ``ready``): ``_take_finished``'s
        loop with its per-scope reads in C (``map``). None when a read fails: the loop says which."""
        tokens, queues, ev0s, ev1s, cpu_ns = zip(*ended, strict=True)
        cpu = np.fromiter(cpu_ns, np.int64, len(ended))
        at = np.array([a.cpu_ns for a in ready], np.int64)
        hi = np.minimum(np.searchsorted(at, cpu), len(at) - 1)
        lo = np.maximum(hi - 1, 0)
        pick = np.where(at[hi] - cpu < cpu - at[lo], hi, lo)  # (``nearest``: ties to the earlier)
        elapsed = self._rt.eventElapsedTime
        try:
            from_anchor = list(map(elapsed, map([a.event for a in ready].__getitem__, pick.tolist()), ev0s))
            durations = list(map(elapsed, ev0s, ev1s))
        except Exception:
            return None
        start = np.array([a.gpu_ns for a in ready], np.int64)[pick]
        start += np.rint(np.array(from_anchor) * _MS).astype(np.int64)  # (``ms_to_ns``)
        end = start + np.rint(np.array(durations) * _MS).astype(np.int64)
        known_done = self.clock() if done_by is None else done_by
        queue = np.fromiter((qs.q for qs in queues), np.int64, len(ended))
        done = np.full(len(ended), known_done, np.int64)
        return SpanBatch(np.column_stack([np.array(tokens, np.int64), queue, start, end, cpu, done]))

    def _retire_anchors(self) -> None:
        """Return anchors no open or uncollected scope can need to the pool (keep the latest)."""
        live = [c for _, _, c in self._open.values()] + [r[4] for r in self._ended]
        oldest = min(live, default=None)
        for d in self._devs.values():
            with d.lock:
                done = [a for a in d.anchors if a.gpu_ns is not None]
                if len(done) < 2:
                    continue
                cutoff = done[-1].cpu_ns if oldest is None else oldest
                # keep the newest finished anchor at or before the cutoff, and all after it
                drop = [a for a in done[:-1] if a.cpu_ns < cutoff][:-1]
                if not drop:
                    continue
                ids = {id(a) for a in drop}
                d.anchors = [a for a in d.anchors if id(a) not in ids]
                d.pool.extend(a.event for a in drop)

    # facts ----------------------------------------------------------------------------------
    def queues(self) -> list[QueueInfo]:
        return [QueueInfo(qs.dev.index, qs.dev.name, self.name, _label(qs)) for qs in self._queue_list]

    def devices(self) -> list[dict[str, Any]]:
        return [
            {"index": d.index, "name": d.name, "backend": self.name, "timing": "events"}
            for d in self._devs.values()
        ]

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "timing": "events",
            "timing_by_device": {str(d): "events" for d in self._devs},
            "timing_note": self.timing_note,
            "cupy": self._cp.__version__,
            "cuda_runtime": self._rt.runtimeGetVersion(),
            "cuda_driver": self._rt.driverGetVersion(),
            "clock_domain": "cuda-event-chain",
            "clock_domain_note": (
                "GPU times are ns since the device's first anchor event; anchors are chained by "
                "cudaEventElapsedTime and issued at most "
                f"{self.anchor_every_ns / 1e9:g} s apart while scopes run"
            ),
            "calibration": "event record bracketed by session-clock reads, polled to completion",
            "samples_per_calibration": f"the tightest {min(SAMPLES_KEPT, self.samples)} of {self.samples}",
            "empty_span_ns": self.empty_span_ns,
            "events_created": {str(d.index): d.created for d in self._devs.values()},
            "graph_capture": "scopes inside stream capture are refused and flagged untimed",
        }

    def close(self) -> None:
        destroy = self._rt.eventDestroy
        for d in self._devs.values():
            events = list(d.pool) + [a.event for a in d.anchors]
            events += [ev for qs, ev, _ in self._open.values() if qs.dev is d]
            events += [e for r in self._ended if r[1].dev is d for e in (r[2], r[3])]
            for ev in set(events):
                # a context already torn down at exit leaves nothing to free
                with contextlib.suppress(Exception):
                    destroy(ev)
            d.pool = []
            d.anchors = []
        self._open.clear()
        self._ended = []
        self._queues.clear()
        for qs in self._queue_list:
            qs.stream = None


def _stream_ptr(stream: Any) -> int:
    """The raw handle of a stream given as a CuPy stream, a torch stream, or an int."""
    for attr in ("ptr", "cuda_stream", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise GputraceError(
        f"trace(stream=...) needs a CuPy stream, a torch stream or a raw handle, not {type(stream).__name__}."
    )


_NAMED_STREAMS = {0: "default stream", 1: "legacy default stream", 2: "per-thread default stream"}


def _label(qs: _Queue) -> str:
    return _NAMED_STREAMS.get(qs.sptr) or f"stream {qs.sptr:#x}"
