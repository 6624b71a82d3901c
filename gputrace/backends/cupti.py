"""CUPTI timing for the cuda backend: every kernel, memcpy and memset, attributed to its scope.

An *activity source* (libcupti through ctypes, ``cupti_lib``; in tests ``tests/cupti_fake.py``,
which writes real CUPTI record bytes) delivers operations and API calls decoded in bulk. They are
joined by correlation id with numpy (no Python object per record) and handed to the resolver as
one batch, which attributes each operation to the innermost scope open on the launching thread
when its call started. The backend is not ``timed``: nothing is pushed or popped per scope
(measured against CUPTI's external-correlation push/pop in ``benchmarks/bench_cuda.py``). How
CUPTI's clock is bracketed, and the *blind* stretches left when another CUPTI client takes the
callbacks: docs/cupti.md.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Protocol

import numpy as np

from gputrace.backends import cupti_records as cr
from gputrace.backends.base import Backend, CalibrationSample, Clock, Collected
from gputrace.backends.cupti_records import CALLS, NameTable
from gputrace.errors import GputraceError, notice, report_internal
from gputrace.model import QueueInfo
from gputrace.records import OP_ROWS, Blind, OpBatch

# Linux OS thread ids stay below 2**22 (pid_max); CUPTI's default is pthread_self()'s low 32 bits.
_MAX_OS_TID = 1 << 22
SAMPLES_PER_CALIBRATION = 6
SAMPLES_KEPT = 2
RATE_TOLERANCE = 0.05  # a source clock within 5% of one tick per ns counts ns
RATE_PROBE_NS = 2_000  # the first look at the source's rate spans at least this
RATE_SPAN_NS = 20_000_000  # and the measurement, when it does not count ns
# CUPTI's own GPU-to-CPU timestamp mapping, outside the clock fit: up to 0.67 µs measured on the
# H200 (benchmarks/bench_cuda.py --only alignment); every stated uncertainty includes this allowance.
SOURCE_ERROR_NS = 1_000
LOST_GAP_NS = 1_000_000  # lost launch calls closer than this make one blind stretch
HORIZON_MARGIN_NS = 10_000  # a streamed scope ends at least this long before the horizon
MAX_BLIND_LISTED = 64  # blind stretches listed in the header (the count is exact)


class ActivitySource(Protocol):
    """What the backend asks of an activity source (real CUPTI or the test fake).

    ``drain`` forces a flush and takes every record so far: operations (``cupti_records.OPS``,
    names indexing ``names``) and API calls (``CALLS``); work still running comes with zero times
    (``cupti_records.unfinished``). ``sync`` waits for all GPU work and returns (OS tid, start,
    end), on the source clock, of a window in which this thread made a recorded API call (the canary).
    """

    name: str
    names: NameTable  # operation and call names by index

    def start(self) -> None: ...  # enable the activity kinds, register the buffer callbacks
    def timestamp(self) -> int: ...  # the source's clock now (ns)
    def sync(self) -> tuple[int, int, int]: ...
    def drain(self) -> tuple[np.ndarray, np.ndarray]: ...
    def call_name(self, domain: int, cbid: int) -> str: ...
    def waiting_bytes(self) -> int: ...  # bytes of records delivered and not yet drained
    def dropped(self) -> int: ...  # records dropped so far (full buffers)
    def other_client_active(self) -> str | None: ...  # why another client is active now (or None)
    def reclaim(self) -> None: ...  # start again, after another client took the callbacks
    def devices(self) -> dict[int, str]: ...  # device index -> name
    def stop(self) -> None: ...
    def info(self) -> dict[str, Any]: ...


def probe() -> str | None:
    """Why CUPTI cannot be used here, or None. Never raises; loads nothing."""
    try:
        from gputrace.backends.cupti_lib import NOT_FOUND, find_libcupti

        if find_libcupti() is None:
            return NOT_FOUND
    except Exception as exc:
        return f"looking for libcupti failed ({type(exc).__name__}: {exc})"
    return torch_profiler_active()


def torch_loaded() -> str | None:
    """Why ``timing="auto"`` leaves CUPTI alone in a program that imported torch, or None: CUPTI is
    one per process, and torch.profiler loses its kernels to a CUPTI-timed session (docs/cupti.md)."""
    if "torch" in sys.modules:
        return (
            "torch is loaded, and torch.profiler loses its kernels when started during a "
            "CUPTI-timed session (timing='cupti' forces CUPTI)"
        )
    return None


def torch_profiler_active() -> str | None:
    """Why torch.profiler holds CUPTI right now, or None (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        recording = torch._C._autograd._profiler_enabled()
    except Exception:
        return None
    return "torch.profiler is recording and holds CUPTI" if recording else None


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
        self._collect_lock = threading.Lock()  # a sync's collect and the streamer's, one at a time
        self._prev_pending_starts = np.zeros(0, np.int64)  # launch calls still waiting for operations
        self._calls_prev = np.zeros(0, CALLS)  # the previous collect's API calls
        self._prev_matched = np.zeros(0, bool)  # which of them had their operations arrive
        self._canary: tuple[int, int, int] | None = None
        self._good_until: int | None = None  # source clock: last time records were known to arrive
        self._blind_noticed = False
        self._blind: list[Blind] = []
        self._launch_kind: dict[int, bool] = {}  # by ``_call_keys``
        self._orphans = 0
        self._orphans_noticed = False
        self._bg_samples: list[CalibrationSample] = []
        self._incomplete = 0  # operation records that came without GPU times (left out)
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
        """Find whether the source's clock counts ns (not when torch.profiler's Kineto left its own
        timestamp source registered: TSC ticks, docs/cupti.md); if not, measure its rate over
        ``RATE_SPAN_NS``, by which every source time is then converted before the clock fit."""
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

    def _samples(self, brackets: list[tuple[int, int, int]]) -> list[CalibrationSample]:
        return [
            CalibrationSample(t0, g, t1, d) for d in sorted(self._dev_names) or [0] for t0, g, t1 in brackets
        ]

    def calibrate(self) -> list[CalibrationSample]:
        best = self._samples(self._brackets(self.samples)[:SAMPLES_KEPT])
        with self._lock:
            out, self._bg_samples = self._bg_samples, []
        return out + best

    def _learn_threads(self) -> None:
        """Map each live thread's pthread id (CUPTI's thread id unless a tool changed it) to its OS
        id (the trace's), from the recorder's thread buffers and live threads; at every buffer,
        sync and collect."""
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
        got = self._samples(self._brackets(1))
        with self._lock:
            self._bg_samples.extend(got)

    # sync and collect -----------------------------------------------------------------------
    def sync(self) -> None:
        self._learn_threads()
        tid, t0, t1 = self.source.sync()
        self._canary = (tid, self._source_ns(t0), self._source_ns(t1))

    def waiting_bytes(self) -> int:
        """Bytes of records delivered and not yet collected (the streamer collects early on many)."""
        return int(self.source.waiting_bytes())

    def collect(self) -> Collected:
        with self._collect_lock:
            return self._collect(background=False)

    def collect_background(self) -> tuple[Collected, int | None]:
        """A collect without a sync (the streamer's timer), and the session-clock time before
        which every launch call's operations have arrived (scopes that ended before it are
        complete and can be written), or None when there is no such time yet."""
        with self._collect_lock:
            mark = self._brackets(1)[0]  # before the drain: records up to here are flushed
            got = self._collect(background=True)
            pending = self._prev_pending_starts
            until_src = min(mark[1], int(pending.min())) if len(pending) else mark[1]
            # onto the session clock through the bracket (CUPTI's clock counts ns); the margin
            # covers the bracket's width and the two clocks' drift since (NTP slews ≤ 500 ppm)
            margin = (mark[2] - mark[0]) + (mark[1] - until_src) // 2000 + HORIZON_MARGIN_NS
            return got, mark[0] + (until_src - mark[1]) - margin

    def _collect(self, *, background: bool) -> Collected:
        got = Collected(ops_timing=True)
        # Every drain forces CUPTI's buffers out (why: docs/cupti.md, "Nothing lost silently"): work
        # still running comes with zero times, is matched to its launch call, left out and counted.
        ops, calls = self.source.drain()
        unfinished = cr.unfinished(ops)
        m = self._rate_map  # (as ``_source_ns``, over whole columns)
        if m is not None:
            for arr in (ops, calls):
                for f in ("start", "end"):
                    arr[f] = m[1] + np.round((arr[f] - m[0]) / m[2]).astype(np.int64)
        self._learn_threads()
        done_by = self.clock()
        now = _last_per_correlation(calls)
        now_matched = np.zeros(len(now), bool)
        synced = self._canary  # a sync just waited for all GPU work and flushed CUPTI
        self._check_canary(calls, got)
        prev, prev_matched = self._calls_prev, self._prev_matched
        if len(ops):
            # (records of unfinished work still match their launch calls, which then wait no more)
            batch = self._join(ops, now, now_matched, prev, prev_matched, done_by)
            n_bad = int(np.count_nonzero(unfinished))
            if n_bad:
                batch = batch.take(np.flatnonzero(~unfinished))
                self._incomplete += n_bad
                if self._incomplete == n_bad:
                    report_internal(
                        "cupti:incomplete",
                        f"CUPTI handed over {n_bad} operation records without their GPU times (work "
                        "still running at a forced flush); they are left out, counted in the header "
                        "(cupti_incomplete_records).",
                    )
            got.batches.append(batch)
        # A call's operations arrive by the next collect, or by this one when a sync followed the
        # call: a launch call whose operations did not lost them (another client, full buffers).
        if background:
            # no sync came: a launch whose operations have not arrived may still be queued on
            # the GPU; it waits for a later collect (at the latest the next sync's) to be judged
            keep = ~prev_matched & self._launches(prev)
            now = cr.concat([now, prev[keep]])
            now_matched = np.concatenate([now_matched, np.zeros(int(keep.sum()), bool)])
        else:
            due = [prev[~prev_matched]]
            if synced is not None:
                ended = (now["end"] <= synced[1]) & ~now_matched
                due.append(now[ended])
                now_matched |= ended  # counted once
            self._lost_operations(cr.concat(due), got)
        self._calls_prev, self._prev_matched = now, now_matched
        waiting = ~now_matched & self._launches(now)
        self._prev_pending_starts = now["start"][waiting]
        self._ops_total += len(ops) - int(np.count_nonzero(unfinished))
        return got

    def _is_launch(self, key: int) -> bool:
        got = self._launch_kind.get(key)
        if got is None:
            name = self._call_name(key)
            got = self._launch_kind[key] = (
                any(k in name for k in ("Launch", "Memcpy", "Memset")) and "HostFunc" not in name
            )
        return got

    def _call_name(self, key: int) -> str:  # of the API call ``_call_keys`` packed into ``key``
        return self.source.call_name(key >> 32, key & 0xFFFFFFFF)

    def _launches(self, calls: np.ndarray) -> np.ndarray:
        """Which calls launch GPU work (their operations are expected)."""
        return cr.per_unique(_call_keys(calls), self._is_launch, bool)

    def _lost_operations(self, due: np.ndarray, got: Collected) -> None:
        """Launch calls whose operations never arrived: their stretches of time are blind (scopes
        there with no GPU work are flagged untimed, not empty), counted, and noticed once."""
        lost = due[self._launches(due)]
        if not len(lost):
            return
        lost = lost[np.argsort(lost["start"], kind="stable")]
        self._orphans += len(lost)
        why = (
            "CUPTI recorded launch calls but not the GPU operations they launched (another CUPTI "
            "client, such as torch.profiler, tore activity tracing down, or buffers overflowed)"
        )
        # one stretch per run of lost calls less than LOST_GAP_NS apart
        end = np.maximum.accumulate(lost["end"])
        cut = np.flatnonzero(lost["start"][1:] - end[:-1] > LOST_GAP_NS) + 1
        first = np.concatenate([[0], cut])
        last = np.concatenate([cut - 1, [len(lost) - 1]])
        stretches = [
            Blind(int(lost["start"][i]), int(end[j]), why)
            for i, j in zip(first.tolist(), last.tolist(), strict=True)
        ]
        got.blind.extend(stretches)
        self._blind.extend(stretches[-MAX_BLIND_LISTED:])
        del self._blind[:-MAX_BLIND_LISTED]
        if not self._orphans_noticed:
            self._orphans_noticed = True
            notice(f"{why}; scopes around those calls with no other GPU work are flagged untimed.")

    def _join(
        self,
        ops: np.ndarray,
        now: np.ndarray,
        now_matched: np.ndarray,
        prev: np.ndarray,
        prev_matched: np.ndarray,
        done_by: int,
    ) -> OpBatch:
        """Operations joined to their launch calls by correlation id, in bulk (this collect's
        calls first, then the previous collect's)."""
        rows = np.zeros(len(ops), OP_ROWS)
        for f_out, f_in in (("kind", "kind"), ("device", "device"), ("correlation", "correlation"),
                            ("gpu_start_ns", "start"), ("gpu_end_ns", "end"), ("bytes", "bytes"),
                            ("grid", "grid"), ("block", "block"), ("graph_id", "graph_id"),
                            ("graph_node_id", "graph_node_id")):  # fmt: skip
            rows[f_out] = ops[f_in]
        names = self.source.names
        rows["name"] = ops["name"]
        rows["done_by_ns"] = done_by
        # queues: one per (device, stream), few
        pair = ops["device"].astype(np.int64) << 40 | ops["stream"]
        rows["queue"] = cr.per_unique(pair, self._queue_of, np.int32)
        rows["call_tid"] = -1
        rows["call_name"] = names.index("")
        # calls by correlation: this collect's win over the previous one's
        pool = cr.concat([now, prev])
        if not len(pool):
            return OpBatch(rows, names.names, {})
        which = np.concatenate([np.arange(len(now)), -1 - np.arange(len(prev))])
        order = np.argsort(pool["correlation"], kind="stable")
        corr_sorted = pool["correlation"][order]
        first = np.concatenate([[True], corr_sorted[1:] != corr_sorted[:-1]])
        order, corr_sorted = order[first], corr_sorted[first]
        j = np.searchsorted(corr_sorted, ops["correlation"])
        jc = np.minimum(j, len(corr_sorted) - 1)
        hit = (j < len(corr_sorted)) & (corr_sorted[jc] == ops["correlation"])
        if not hit.any():
            return OpBatch(rows, names.names, {})
        at = order[jc[hit]]
        c, w = np.take(pool, at), which[at]  # (np.take: a structured fancy index is 15x slower)
        now_matched[w[w >= 0]] = True
        prev_matched[-1 - w[w < 0]] = True
        rows["call_start_ns"][hit] = c["start"]
        rows["call_end_ns"][hit] = c["end"]
        rows["call_name"][hit] = cr.per_unique(_call_keys(c), self._call_name_index, np.int32)
        alts: dict[int, tuple[int, ...]] = {}

        def os_tid(tid: int) -> int:  # the latest OS thread with this id; the others go in ``alts``
            tids = self._os_tids(tid)
            if len(tids) > 1:
                alts[tids[-1]] = tuple(tids[:-1])
            return tids[-1] if tids else -1

        rows["call_tid"][hit] = cr.per_unique(c["tid"], os_tid, np.int64)
        return OpBatch(rows, names.names, alts)

    def _call_name_index(self, key: int) -> int:
        return self.source.names.index(self._call_name(key))

    def _check_canary(self, calls: np.ndarray, got: Collected) -> None:
        canary, self._canary = self._canary, None
        if canary is None:
            return
        tid, t0, t1 = canary
        inside = calls[(calls["start"] >= t0) & (calls["start"] <= t1)]
        # (a set, not np.unique: that would import numpy.ma, 26 ms)
        if any(tid in self._os_tids(t) for t in set(inside["tid"].tolist())):
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

    def _queue_of(self, pair: int) -> int:
        """The queue of a (device << 40 | stream) pair, made at its first operation."""
        dev, sid = pair >> 40, pair & ((1 << 40) - 1)
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
            "cupti_incomplete_records": self._incomplete,
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


def create(clock: Clock, **options: Any) -> CuptiBackend:
    """The CUPTI-timed cuda backend over libcupti (raises ``GputraceError`` with the reason when
    it cannot be: no libcupti, an unknown CUPTI version, CUPTI refusing to start)."""
    t0 = time.perf_counter_ns()
    from gputrace.backends.cupti_lib import LibCuptiSource

    t_import = time.perf_counter_ns()
    why = torch_profiler_active()
    if why is not None:
        raise GputraceError(why)
    src_opts = {k: options.pop(k) for k in ("buffer_bytes", "flush_period_ms", "api_filter") if k in options}
    source = LibCuptiSource(**src_opts)
    t1 = time.perf_counter_ns()
    backend = CuptiBackend(clock, source=source, **options)
    global _self_checked
    if not _self_checked:  # once per process: the library and its layouts do not change
        try:
            problem = source.self_check()
        except Exception as exc:
            problem = f"it raised {type(exc).__name__}: {exc}"
        if problem is not None:
            backend.close()
            raise GputraceError(f"CUPTI's start-up self-check failed ({problem})")
        _self_checked = True
    source._on_buffer = backend.background_sample
    took = {"import": t_import - t0, "load": t1 - t_import, "total": time.perf_counter_ns() - t0}
    source.start_ms.update({part: ns / 1e6 for part, ns in took.items()})
    return backend


_self_checked = False  # the start-up self-check passed in this process
SELF_CHECK_BYTES = 4_099  # the start-up check's memset: an odd size no other operation has


def self_check_problem(
    ops: np.ndarray, calls: np.ndarray, *, nbytes: int, device: int, tids: tuple[int, ...],
    t0: int, t1: int, call_name: Any = None,
) -> str | None:  # fmt: skip
    """What is wrong with the start-up check's records, or None: one memset of ``nbytes`` on
    ``device``, launched by this thread (``tids``: its pthread and OS ids) between ``t0`` and ``t1``
    (source clock) and synced, must decode to exactly those values, joined to its launch call, in
    the window and in order (start ≤ end; the call first). A layout read wrong fails one of these."""
    from gputrace.records import OP_MEMSET

    mine = ops[(ops["kind"] == OP_MEMSET) & (ops["bytes"] == nbytes)]
    if len(mine) != 1:
        return f"{len(mine)} memset records of the {nbytes}-byte check came back, not 1"
    op = mine[0]
    if int(op["device"]) != device:
        return f"the check's memset came back on device {int(op['device'])}, not {device}"
    if not t0 <= int(op["start"]) <= int(op["end"]) <= t1:
        return "the check's memset came back with times outside its launch and sync"
    call = calls[calls["correlation"] == op["correlation"]]
    if not len(call):
        return "the check's memset came back without its launch call (correlation ids disagree)"
    c = call[-1]
    # (the call's end is not compared with the memset's: a first memset in the process returns
    # late, after lazy loading, long after its operation ran; seen on the H200)
    if not (t0 <= int(c["start"]) <= int(op["start"]) and int(c["start"]) <= int(c["end"]) <= t1):
        return "the check's launch call came back with times outside its window"
    if int(c["tid"]) & 0xFFFFFFFF not in {t & 0xFFFFFFFF for t in tids}:
        return "the check's launch call came back on another thread"
    if call_name is not None and "Memset" not in call_name(int(c["domain"]), int(c["cbid"])):
        return "the check's launch call came back as another API call"
    return None


def _call_keys(calls: np.ndarray) -> np.ndarray:
    """Each API call's (domain, callback id) packed into one integer."""
    keys: np.ndarray = calls["domain"].astype(np.int64) << 32 | calls["cbid"]
    return keys


def _last_per_correlation(calls: np.ndarray) -> np.ndarray:
    """One call per correlation id, the last delivered (as the dict this replaced kept it)."""
    if len(calls) < 2:
        return calls
    c = calls["correlation"]
    if np.all(c[1:] > c[:-1]):
        return calls
    rev = calls[::-1]
    _, first = np.unique(rev["correlation"], return_index=True)
    out: np.ndarray = np.take(rev, np.sort(first)[::-1])
    return out
