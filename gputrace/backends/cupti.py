"""CUPTI timing for the cuda backend: every kernel, memcpy and memset, attributed to its scope.

An *activity source* (NVIDIA's ``cupti-python`` here, ``gputrace.backends.cupti_fake`` in tests)
delivers activity records: per GPU operation its name, device, stream, GPU start/end and the
correlation id of the API call that launched it; per API call its thread and CPU start/end.
This backend joins operations to their launch calls by correlation id and hands them to the
resolver, which attributes each to the innermost scope open on the launching thread when the call
started (the call's start inside the scope's CPU window). The recorder's hot path is untouched:
this backend is not ``timed``, so scopes cost what CPU-only scopes cost, and nothing is pushed or
popped per scope (measured against CUPTI's external-correlation push/pop in
``benchmarks/bench_cuda.py``; docs/cupti.md).

Clocks: CUPTI's timestamps (CLOCK_REALTIME ns on Linux) are mapped onto the session clock by
brackets ``(clock(), get_timestamp(), clock())`` taken at start, at every sync, at stop and at each
buffer CUPTI completes; the resolver fits them like any GPU clock and states the uncertainty.

Coexistence: CUPTI has one set of activity callbacks per process. When another client
(torch.profiler's Kineto, Nsight) registers its own, ours stop receiving records, without error.
Every sync checks that the API record of its own synchronize call arrived; when it did not, the
stretch since the last good check is *blind* (scopes in it with no GPU work are flagged
``untimed``, not empty), one notice says so, and the callbacks are registered again once the other
tool is no longer active.
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from gputrace.backends.base import Backend, CalibrationSample, Clock, Collected
from gputrace.errors import GputraceError, notice, report_internal
from gputrace.gcpause import gc_paused
from gputrace.model import QueueInfo
from gputrace.records import OP_KERNEL, OP_MEMCPY, OP_MEMSET, Blind, RawOp

# Linux OS thread ids stay below 2**22 (pid_max). CUPTI's default thread id is pthread_self(), an
# address, of which its records keep the low 32 bits.
_MAX_OS_TID = 1 << 22
SAMPLES_PER_CALIBRATION = 6
SAMPLES_KEPT = 2
BUFFER_BYTES = 1 << 18  # one CUPTI activity buffer: about 1,000 kernel records (reading one holds the GIL)
FLUSH_PERIOD_MS = 200  # CUPTI flushes its buffers in the background at least this often
RATE_TOLERANCE = 0.05  # a source clock within 5% of one tick per ns counts ns
RATE_PROBE_NS = 2_000  # the first look at the source's rate spans at least this
RATE_SPAN_NS = 20_000_000  # and the measurement, when it does not count ns
# CUPTI maps each GPU timestamp onto its CPU clock itself; that mapping's error is not in the
# clock fit's. Measured on the H200 against each kernel's own %globaltimer reads mapped by an
# independent ping-pong fit (benchmarks/bench_cuda.py --only alignment, 1,300 kernels): up to
# 0.67 µs. Stated uncertainties of CUPTI GPU times include this allowance (docs/cupti.md).
SOURCE_ERROR_NS = 1_000
YIELD_EVERY = 255  # a buffer callback lets the program run every 256 records (a mask)
SETTLE_S = 1.0  # a drain waits at most this long for a buffer callback in flight
LOST_GAP_NS = 1_000_000  # lost launch calls closer than this make one blind stretch
MAX_BLIND_LISTED = 64  # blind stretches listed in the header (the count is exact)

# An operation record: (kind, name, device, stream_id, correlation, gpu_start, gpu_end, bytes,
#   grid_x, grid_y, grid_z, block_x, block_y, block_z, graph_id, graph_node_id)
OpTuple = tuple[int, str, int, int, int, int, int, int, int, int, int, int, int, int, int, int]
# An API call record: (correlation, tid, start, end, domain, cbid); domain 0 driver, 1 runtime
CallTuple = tuple[int, int, int, int, int, int]


class ActivitySource(Protocol):
    """What the backend asks of an activity source (real CUPTI or the test fake)."""

    name: str

    def start(self) -> None:
        """Enable the activity kinds and register the buffer callbacks."""

    def timestamp(self) -> int:
        """The source's clock now (ns)."""
        ...

    def sync(self) -> tuple[int, int, int]:
        """Wait for all GPU work; returns (OS tid, start, end) on the source clock of a window
        in which this thread made an API call the source should have recorded (the canary)."""
        ...

    def drain(self) -> tuple[list[OpTuple], list[CallTuple]]:
        """Flush and take every record delivered so far."""
        ...

    def call_name(self, domain: int, cbid: int) -> str: ...

    def dropped(self) -> int:
        """Records the source dropped so far (full buffers)."""
        ...

    def other_client_active(self) -> str | None:
        """Why another CUPTI client is active now (so registering would break it), or None."""
        ...

    def reclaim(self) -> None:
        """Register the callbacks and enable the kinds again (after another client took them)."""

    def devices(self) -> dict[int, str]:
        """Device index -> name."""
        ...

    def stop(self) -> None: ...

    def info(self) -> dict[str, Any]: ...


def probe() -> str | None:
    """Why CUPTI through cupti-python cannot be used here, or None. Never raises."""
    try:
        from cupti import cupti  # noqa: F401
    except ImportError as exc:
        return f"cupti-python is not installed ({exc}); pip install 'gputrace[cuda13]'"
    except Exception as exc:
        return f"importing cupti-python failed ({type(exc).__name__}: {exc})"
    why = torch_profiler_active()
    if why is not None:
        return why
    return None


def torch_loaded() -> str | None:
    """Why ``timing="auto"`` leaves CUPTI alone in a program that imported torch, or None.

    Measured on the H200 (torch 2.11): a torch.profiler started while gputrace holds CUPTI's
    activity callbacks records no kernels at all, and a CUPTI session started after
    torch.profiler ran in the process loses records when Kineto tears CUPTI down. CUPTI is one
    per process, so the cooperative choice in a torch program is events; ``timing="cupti"``
    still forces it.
    """
    import sys

    if "torch" in sys.modules:
        return (
            "torch is loaded, and torch.profiler loses its kernels when started during a "
            "CUPTI-timed session (timing='cupti' forces CUPTI)"
        )
    return None


def torch_profiler_active() -> str | None:
    """Why torch.profiler holds CUPTI right now, or None (never imports torch)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch._C._autograd._profiler_enabled():
            return "torch.profiler is recording and holds CUPTI"
    except Exception:
        return None
    return None


class CuptiBackend(Backend):
    """Per-operation GPU timing from an activity source; see the module docstring."""

    name = "cuda"
    timed = False  # scopes need no token: operations are attributed by thread and CPU window
    ops_timing = True
    spans_cover_children = True  # a scope's GPU span hulls the operations of its subtree
    empty_span_ns = 0
    source_error_ns = SOURCE_ERROR_NS

    def __init__(
        self, clock: Clock, *, source: ActivitySource, samples: int = SAMPLES_PER_CALIBRATION
    ) -> None:
        super().__init__(clock)
        self.source = source
        self.samples = max(1, int(samples))
        self._queues: dict[tuple[int, int], int] = {}
        self._queue_list: list[QueueInfo] = []
        self._calls_prev: dict[int, CallTuple] = {}
        self._calls_now: dict[int, CallTuple] = {}
        self._canary: tuple[int, int, int] | None = None
        self._good_until: int | None = None  # source clock: last time records were known to arrive
        self._blind_noticed = False
        self._blind: list[Blind] = []
        self._matched: set[int] = set()  # correlation ids of calls whose operations arrived
        self._launch_kind: dict[tuple[int, int], bool] = {}
        self._orphans = 0
        self._orphans_noticed = False
        self._bg_samples: list[CalibrationSample] = []
        self._lock = threading.Lock()
        self._ops_total = 0
        # pthread id (CUPTI's default thread id) -> OS tids seen with it (ids are reused)
        self._native: dict[int, list[int]] = {}
        self._learn_threads()
        self._dev_names = source.devices()
        # source ticks -> ns: (tick_ref, ns_ref, ticks per ns); None while CUPTI counts ns
        self._rate_map: tuple[int, int, float] | None = None
        source.start()
        self._check_rate()
        self._good_until = self._source_ns(source.timestamp())

    # calibration ----------------------------------------------------------------------------
    def _brackets(self, n: int, *, raw: bool = False) -> list[tuple[int, int, int]]:
        clock, ts = self.clock, self.source.timestamp
        out = []
        for _ in range(n):
            t0 = clock()
            g = ts()
            t1 = clock()
            out.append((t0, g, t1))
        if not raw and self._rate_map is not None:
            out = [(t0, self._source_ns(g), t1) for t0, g, t1 in out]
        out.sort(key=lambda x: x[2] - x[0])
        return out

    def _check_rate(self) -> None:
        """Find whether the source's clock counts ns. CUPTI counts CLOCK_REALTIME ns unless a tool
        registered its own timestamp callback: torch.profiler's Kineto does, and leaves it in place
        after it stops (measured on the H200: TSC ticks, 2.1 per ns). Then every source time is
        converted to ns by the rate measured here, before the clock fit sees it.

        A first look costs nothing (brackets already taken); only when it rules out one tick per
        ns is the rate measured over ``RATE_SPAN_NS``.
        """
        a = self._brackets(1, raw=True)[0]
        b = self._brackets(1, raw=True)[0]
        for _ in range(64):  # a few µs apart, so the two windows' widths do not dominate
            if b[0] - a[2] > RATE_PROBE_NS:
                break
            b = self._brackets(1, raw=True)[0]
        lo = (b[1] - a[1]) / max(b[2] - a[0], 1)  # ticks per ns, bounded by the windows
        hi = (b[1] - a[1]) / max(b[0] - a[2], 1)
        self._rate_map = None
        if lo <= 1.0 + RATE_TOLERANCE and hi >= 1.0 - RATE_TOLERANCE:
            return  # one tick per ns, within what the brackets can tell
        # the tightest of several brackets at each end: one preempted read would skew the rate
        # (its error is the two windows over the span: ~0.2 µs / 20 ms = 1e-5 when tight)
        a = self._brackets(SAMPLES_PER_CALIBRATION, raw=True)[0]
        time.sleep(RATE_SPAN_NS / 1e9)
        c = self._brackets(SAMPLES_PER_CALIBRATION, raw=True)[0]
        rate = (c[1] - a[1]) / (((c[0] + c[2]) - (a[0] + a[2])) / 2)
        if rate <= 0:
            return
        self._rate_map = (a[1], (a[0] + a[2]) // 2, rate)
        notice(
            f"CUPTI's clock counts {rate:.4f} ticks per ns (another tool, such as torch.profiler, "
            "registered its own timestamp source); gputrace converts its times by that rate."
        )

    def _source_ns(self, ticks: int) -> int:
        m = self._rate_map
        if m is None:
            return ticks
        return m[1] + round((ticks - m[0]) / m[2])

    def calibrate(self) -> list[CalibrationSample]:
        best = self._brackets(self.samples)[:SAMPLES_KEPT]
        with self._lock:
            out, self._bg_samples = self._bg_samples, []
        devs = sorted(self._dev_names) or [0]
        out.extend(CalibrationSample(t0, g, t1, d) for d in devs for t0, g, t1 in best)
        return out

    def _learn_threads(self) -> None:
        """Remember each live thread's pthread id -> OS thread id (the trace names threads by OS
        id; CUPTI by pthread id unless a tool changed the type). Learned from the recorder's
        thread buffers and the live threads, at every buffer, sync and collect."""
        native = self._native
        pairs = [(b.ident, b.tid) for b in list(self.recorder.buffers)] if self.recorder is not None else []
        pairs += [(t.ident, t.native_id) for t in threading.enumerate() if t.ident and t.native_id]
        for ident, tid in pairs:
            seen = native.setdefault(ident & 0xFFFFFFFF, [])  # CUPTI keeps 32 bits of it
            if tid not in seen:
                seen.append(tid)

    def _os_tids(self, tid: int) -> list[int]:
        """The OS thread ids a CUPTI thread id (either kind) may stand for; [] when unknown."""
        got = self._native.get(tid & 0xFFFFFFFF)
        if got:
            return got
        return [tid] if 0 <= tid < _MAX_OS_TID else []

    def background_sample(self) -> None:
        """One bracket, taken from CUPTI's own thread when it hands over a buffer: keeps the
        clock fit fresh in long runs without syncs; and the threads' ids learned."""
        self._learn_threads()
        t0, g, t1 = self._brackets(1)[0]
        with self._lock:
            self._bg_samples.extend(CalibrationSample(t0, g, t1, d) for d in sorted(self._dev_names) or [0])

    # sync and collect -----------------------------------------------------------------------
    def sync(self) -> None:
        self._learn_threads()
        tid, t0, t1 = self.source.sync()
        self._canary = (tid, self._source_ns(t0), self._source_ns(t1))

    def collect(self) -> Collected:
        got = Collected(ops_timing=True)
        ops, calls = self.source.drain()
        if self._rate_map is not None:
            ops, calls = self._ops_in_ns(ops, calls)
        self._learn_threads()
        done_by = self.clock()
        now = self._calls_now
        for call in calls:
            now[call[0]] = call
        synced = self._canary  # a sync just waited for all GPU work and flushed CUPTI
        self._check_canary(calls, got)
        prev = self._calls_prev
        if ops:
            got.ops = self._join(ops, now, prev, done_by)
        # A call's operations arrive by the collect after it at the latest, and by this one when
        # a sync came after the call: a launch call whose operations did not arrive by then lost
        # them (another CUPTI client tore activity tracing down, or buffers overflowed).
        due = list(prev.values())
        if synced is not None:
            due += [c for c in now.values() if c[3] <= synced[1]]
        self._lost_operations(due, got)
        matched = self._matched
        self._matched = {c for c in matched if c in now}
        self._calls_prev, self._calls_now = now, {}
        self._ops_total += len(got.ops)
        return got

    def _ops_in_ns(self, ops: list[OpTuple], calls: list[CallTuple]) -> tuple[list[OpTuple], list[CallTuple]]:
        f = self._source_ns
        ops = [(*o[:5], f(o[5]), f(o[6]), *o[7:]) for o in ops]  # type: ignore[misc]
        calls = [(c[0], c[1], f(c[2]), f(c[3]), c[4], c[5]) for c in calls]
        return ops, calls

    def _is_launch(self, call: CallTuple) -> bool:
        key = (call[4], call[5])
        got = self._launch_kind.get(key)
        if got is None:
            name = self.source.call_name(call[4], call[5])
            got = any(k in name for k in ("Launch", "Memcpy", "Memset")) and "HostFunc" not in name
            self._launch_kind[key] = got
        return got

    def _lost_operations(self, due: list[CallTuple], got: Collected) -> None:
        """Launch calls whose operations never arrived: their stretches of time are blind (scopes
        there with no GPU work are flagged untimed, not empty), counted, and noticed once."""
        matched, is_launch = self._matched, self._is_launch
        lost = sorted((c for c in due if c[0] not in matched and is_launch(c)), key=lambda c: c[2])
        if not lost:
            return
        self._orphans += len(lost)
        matched.update(c[0] for c in lost)  # counted once
        why = (
            "CUPTI recorded launch calls but not the GPU operations they launched (another CUPTI "
            "client, such as torch.profiler, tore activity tracing down, or buffers overflowed)"
        )
        # one stretch per run of lost calls less than LOST_GAP_NS apart
        stretches = []
        start, end = lost[0][2], lost[0][3]
        for c in lost[1:]:
            if c[2] - end > LOST_GAP_NS:
                stretches.append(Blind(start, end, why))
                start = c[2]
            end = max(end, c[3])
        stretches.append(Blind(start, end, why))
        got.blind.extend(stretches)
        self._blind.extend(stretches[-MAX_BLIND_LISTED:])
        del self._blind[:-MAX_BLIND_LISTED]
        if not self._orphans_noticed:
            self._orphans_noticed = True
            notice(f"{why}; scopes around those calls with no other GPU work are flagged untimed.")

    def _join(
        self, ops: list[OpTuple], now: dict[int, CallTuple], prev: dict[int, CallTuple], done_by: int
    ) -> list[RawOp]:
        """Operations joined to their launch calls by correlation id."""
        out: list[RawOp] = []
        append = out.append
        queues = self._queues
        get_now, get_prev = now.get, prev.get
        name_of = self.source.call_name
        names: dict[tuple[int, int], str] = {}
        tid_cache: dict[int, tuple[int, tuple[int, ...]]] = {}
        matched_add = self._matched.add
        for o in ops:
            kind, name, dev, sid, corr, g0, g1, nbytes, gx, gy, gz, bx, by, bz, gid, nid = o
            q = queues.get((dev, sid))
            if q is None:
                q = self._new_queue(dev, sid)
            c = get_now(corr) or get_prev(corr)
            if c is None:
                append(RawOp(kind, name, dev, q, corr, g0, g1, -1, 0, 0, "", nbytes,
                             (gx, gy, gz), (bx, by, bz), gid, nid, done_by))  # fmt: skip
                continue
            key = (c[4], c[5])
            cname = names.get(key)
            if cname is None:
                cname = names[key] = name_of(c[4], c[5])
            matched_add(corr)
            t = tid_cache.get(c[1])
            if t is None:
                tids = self._os_tids(c[1])
                t = tid_cache[c[1]] = (tids[-1] if tids else -1, tuple(tids[:-1]))
            append(RawOp(kind, name, dev, q, corr, g0, g1, t[0], c[2], c[3], cname, nbytes,
                         (gx, gy, gz), (bx, by, bz), gid, nid, done_by, t[1]))  # fmt: skip
        return out

    def _check_canary(self, calls: Sequence[CallTuple], got: Collected) -> None:
        canary, self._canary = self._canary, None
        if canary is None:
            return
        tid, t0, t1 = canary
        # the canary is among the last calls delivered: look from the end
        if any(t0 <= c[2] <= t1 and tid in self._os_tids(c[1]) for c in reversed(calls)):
            self._good_until = t1
            return
        since = self._good_until if self._good_until is not None else t0
        other = self.source.other_client_active()
        why = other or "another CUPTI client (torch.profiler, Nsight) took CUPTI's activity callbacks over"
        got.blind.append(Blind(since, t1, why))
        self._blind.append(got.blind[-1])
        if not self._blind_noticed:
            self._blind_noticed = True
            notice(
                f"CUPTI records stopped arriving ({why}); scopes in that stretch are flagged untimed"
                + ("" if other else ", and gputrace took CUPTI back")
                + "."
            )
        if other is None:
            try:
                self.source.reclaim()
                self._check_rate()
                self._good_until = self._source_ns(self.source.timestamp())
            except Exception as exc:
                report_internal(
                    "cupti:reclaim", f"re-registering with CUPTI failed ({type(exc).__name__}: {exc})."
                )

    def _new_queue(self, dev: int, sid: int) -> int:
        with self._lock:
            q = self._queues.get((dev, sid))
            if q is None:
                q = self._queues[(dev, sid)] = len(self._queue_list)
                name = self._dev_names.get(dev, f"CUDA device {dev}")
                self._queue_list.append(QueueInfo(dev, name, self.name, f"stream {sid}"))
        return q

    # facts ----------------------------------------------------------------------------------
    def queues(self) -> list[QueueInfo]:
        return list(self._queue_list)

    def devices(self) -> list[dict[str, Any]]:
        return [
            {"index": d, "name": n, "backend": self.name, "timing": "cupti"}
            for d, n in sorted(self._dev_names.items())
        ]

    def info(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "name": self.name,
            "timing": "cupti",
            "timing_by_device": {str(d): "cupti" for d in sorted(self._dev_names)},
            "clock_domain": "cupti",
            "clock_domain_note": "CUPTI timestamps (CLOCK_REALTIME ns); CPU and GPU times of every "
            "operation share that clock",
            "calibration": "cupti.get_timestamp() bracketed by session-clock reads",
            "attribution": "innermost scope open on the launching thread at the launch call's start",
            "cupti_dropped_records": self.source.dropped(),
            "ops_recorded": self._ops_total,
            "blind": [{"start_ns": b.start_ns, "end_ns": b.end_ns, "why": b.why} for b in self._blind],
            "launch_calls_without_operations": self._orphans,
            "source_error_ns": self.source_error_ns,
            "source_error_note": "CUPTI's own GPU-to-CPU timestamp mapping, measured up to 0.67 µs "
            "on the H200; included in every stated GPU-time uncertainty",
            "source_ticks_per_ns": 1.0 if self._rate_map is None else self._rate_map[2],
            "graph_launches": "kernels replayed from CUDA graphs are recorded with graph and node ids",
        }
        facts.update(self.source.info())
        return facts

    def close(self) -> None:
        self.source.stop()


# the real source ------------------------------------------------------------------------------
class CuptiSource:
    """NVIDIA's cupti-python activity API (``pip install 'gputrace[cuda13]'``)."""

    name = "cupti-python"

    def __init__(
        self,
        *,
        buffer_bytes: int = BUFFER_BYTES,
        flush_period_ms: int = FLUSH_PERIOD_MS,
        api_filter: bool = True,
    ) -> None:
        import cupy
        from cupti import cupti

        self._c = cupti
        self._cp = cupy
        self.buffer_bytes = int(buffer_bytes)
        self.flush_period_ms = int(flush_period_ms)
        self.api_filter = bool(api_filter)
        self.api_records = 0
        self.start_ms: dict[str, float] = {}
        self._lock = threading.Lock()
        self._ops: list[OpTuple] = []
        self._calls: list[CallTuple] = []
        self._on_buffer: Any = None  # called (without the lock) after each completed buffer
        self._names: dict[tuple[int, int], str] = {}
        self._started = False
        self._inflight = 0  # buffer callbacks running on CUPTI's thread
        k = cupti.ActivityKind
        self._kinds = [k.CONCURRENT_KERNEL, k.MEMCPY, k.MEMSET, k.RUNTIME, k.DRIVER]
        self._kernel_kind = int(k.CONCURRENT_KERNEL)
        self._memcpy_kind = int(k.MEMCPY)
        self._memset_kind = int(k.MEMSET)
        self._runtime_kind = int(k.RUNTIME)
        self._driver_kind = int(k.DRIVER)

    # CUPTI's thread ---------------------------------------------------------------------------
    def _requested(self) -> tuple[int, int]:
        return self.buffer_bytes, 0

    def _completed(self, activities: Any) -> None:
        # Thousands of activity objects are alive until this returns: a collection triggered by
        # the tuples made here would promote them all (measured: 16–19 ms gen-2 pauses in the
        # program's loop on the H200). Paused while they live, they die young.
        with self._lock:
            self._inflight += 1
        try:
            with gc_paused():
                self._take_buffer(activities)
        finally:
            with self._lock:
                self._inflight -= 1

    def _take_buffer(self, activities: Any) -> None:
        try:
            ops: list[OpTuple] = []
            calls: list[CallTuple] = []
            kk, mc, ms, rt, dr = (
                self._kernel_kind,
                self._memcpy_kind,
                self._memset_kind,
                self._runtime_kind,
                self._driver_kind,
            )
            pause = time.sleep
            for i, a in enumerate(activities):
                if not i & YIELD_EVERY:
                    # hand the GIL to the program for a moment: reading a whole 1 MB buffer
                    # at once held it ~5 ms (a 5 ms stall in the traced loop, measured)
                    pause(0)
                kind = a.kind
                if kind in (dr, rt):
                    calls.append(
                        (a.correlation_id, a.thread_id, a.start, a.end, 1 if kind == rt else 0, a.cbid)
                    )
                elif kind == kk:
                    ops.append((OP_KERNEL, a.name, a.device_id, a.stream_id, a.correlation_id, a.start,
                                a.end, 0, a.grid_x, a.grid_y, a.grid_z, a.block_x, a.block_y, a.block_z,
                                a.graph_id, a.graph_node_id))  # fmt: skip
                elif kind == mc:
                    ops.append((OP_MEMCPY, _memcpy_name(a.copy_kind), a.device_id, a.stream_id,
                                a.correlation_id, a.start, a.end, a.bytes, 0, 0, 0, 0, 0, 0,
                                a.graph_id, a.graph_node_id))  # fmt: skip
                elif kind == ms:
                    ops.append((OP_MEMSET, "Memset", a.device_id, a.stream_id, a.correlation_id, a.start,
                                a.end, a.bytes, 0, 0, 0, 0, 0, 0, a.graph_id, a.graph_node_id))  # fmt: skip
            with self._lock:
                self._ops.extend(ops)
                self._calls.extend(calls)
                self.api_records += len(calls)
            cb = self._on_buffer
            if cb is not None:
                cb()
        except Exception as exc:  # never raise into CUPTI's thread
            report_internal("cupti:buffer", f"reading a CUPTI buffer failed ({type(exc).__name__}: {exc}).")

    # the backend's calls ----------------------------------------------------------------------
    def start(self) -> None:
        c = self._c
        try:
            # The thread id type is left as it is (pthread_self() by default): it is one setting
            # for the whole process, which other CUPTI clients (torch.profiler's Kineto) rely on.
            # The backend maps the ids.
            c.activity_register_callbacks(self._requested, self._completed)
            for k in self._kinds:
                c.activity_enable(k)
            if self.api_filter:
                self._filter_api()
            with contextlib.suppress(Exception):
                c.activity_flush_period(self.flush_period_ms)
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.stop()
            raise GputraceError(f"CUPTI could not be enabled ({type(exc).__name__}: {exc})") from None
        self._started = True

    def reclaim(self) -> None:
        self.start()

    def _filter_api(self, restore: bool = False) -> None:
        """Record only the API calls that launch GPU work or synchronize (the canary): every
        recorded call costs CUPTI time in the program and a Python object in the callback.
        ``restore``: record every call again."""
        c = self._c
        keep = re.compile(r"Launch|Memcpy|Memset|Synchronize")
        for enum_, enable in (
            (c.DriverApiTraceCbid, c.activity_enable_driver_api),
            (c.RuntimeApiTraceCbid, c.activity_enable_runtime_api),
        ):
            for m in enum_:
                if m.name in ("INVALID", "SIZE", "FORCE_INT"):
                    continue
                with contextlib.suppress(Exception):
                    enable(int(m), 1 if restore or keep.search(m.name) else 0)

    def timestamp(self) -> int:
        ts: int = self._c.get_timestamp()
        return ts

    def sync(self) -> tuple[int, int, int]:
        rt = self._cp.cuda.runtime
        t0 = self._c.get_timestamp()
        prev = rt.getDevice()
        try:
            for d in range(rt.getDeviceCount()):
                rt.setDevice(d)
                rt.deviceSynchronize()
        finally:
            rt.setDevice(prev)
        t1 = self._c.get_timestamp()
        return threading.get_native_id(), t0, t1

    def drain(self) -> tuple[list[OpTuple], list[CallTuple]]:
        self._c.activity_flush_all(1)  # forced: incomplete buffers too
        # a buffer CUPTI's own thread was reading when the flush came is taken too: its records
        # would otherwise wait for a collect that, at stop, never comes
        deadline = time.monotonic() + SETTLE_S
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.0002)
        with self._lock:
            ops, self._ops = self._ops, []
            calls, self._calls = self._calls, []
        return ops, calls

    def call_name(self, domain: int, cbid: int) -> str:
        key = (domain, cbid)
        name = self._names.get(key)
        if name is None:
            c = self._c
            dom = c.CallbackDomain.RUNTIME_API if domain == 1 else c.CallbackDomain.DRIVER_API
            try:
                # "cudaMemcpyAsync_v3020" -> "cudaMemcpyAsync", as PyTorch (and HTA) name calls
                name = re.sub(r"_v\d+$", "", str(c.get_callback_name(dom, cbid)))
            except Exception:
                name = f"{'runtime' if domain == 1 else 'driver'} api {cbid}"
            self._names[key] = name
        return name

    def dropped(self) -> int:
        import ctypes

        n = ctypes.c_size_t(0)
        try:
            self._c.activity_get_num_dropped_records(0, 0, ctypes.addressof(n))
        except Exception:
            return 0
        return int(n.value)

    def other_client_active(self) -> str | None:
        return torch_profiler_active()

    def devices(self) -> dict[int, str]:
        rt = self._cp.cuda.runtime
        out = {}
        for d in range(rt.getDeviceCount()):
            raw = rt.getDeviceProperties(d).get("name", b"")
            out[d] = (raw.decode() if isinstance(raw, bytes) else str(raw)) or f"CUDA device {d}"
        return out

    def stop(self) -> None:
        c = self._c
        with contextlib.suppress(Exception):
            c.activity_flush_all(1)
        if self.api_filter:  # per-call settings are process-wide: leave them as CUPTI had them
            self._filter_api(restore=True)
        for k in self._kinds:
            with contextlib.suppress(Exception):
                c.activity_disable(k)
        self._started = False

    def info(self) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "timing_source": self.name,
            "cupti_buffer_bytes": self.buffer_bytes,
            "cupti_api_filter": self.api_filter,
            "cupti_api_records": self.api_records,
            "cupti_start_ms": dict(self.start_ms),
        }
        with contextlib.suppress(Exception):
            import importlib.metadata as md

            facts["cupti_python"] = md.version("cupti-python")
        return facts


_MEMCPY_NAMES = {1: "Memcpy HtoD", 2: "Memcpy DtoH", 3: "Memcpy HtoA", 4: "Memcpy AtoH", 5: "Memcpy AtoA",
                 6: "Memcpy AtoD", 7: "Memcpy DtoA", 8: "Memcpy DtoD", 9: "Memcpy HtoH",
                 10: "Memcpy PtoP"}  # fmt: skip


def _memcpy_name(copy_kind: int) -> str:
    """PyTorch's names for memcpy kinds (CUpti_ActivityMemcpyKind), as HTA expects them."""
    return _MEMCPY_NAMES.get(int(copy_kind), "Memcpy")


def create(clock: Clock, **options: Any) -> CuptiBackend:
    """The CUPTI-timed cuda backend (raises ``GputraceError`` with the reason when it cannot be)."""
    t0 = time.perf_counter_ns()
    why = probe()  # imports cupti-python
    if why is not None:
        raise GputraceError(why)
    # Importing cupti-python creates ~10^5 objects. Left young, they are promoted while the
    # program runs until one full collection walks them all: measured on the H200, a 16–19 ms
    # pause inside the traced loop. One collection now, at start, makes them old at once.
    gc.collect()
    t1 = time.perf_counter_ns()
    src_opts = {k: options.pop(k) for k in ("buffer_bytes", "flush_period_ms", "api_filter") if k in options}
    source = CuptiSource(**src_opts)
    backend = CuptiBackend(clock, source=source, **options)
    source._on_buffer = backend.background_sample
    source.start_ms = {"import": (t1 - t0) / 1e6, "enable": (time.perf_counter_ns() - t1) / 1e6}
    return backend
