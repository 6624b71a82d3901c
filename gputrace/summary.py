"""The numbers a person needs from a trace: pure functions from a ``Trace`` to a JSON-ready dict.

>>> import gputrace
>>> from gputrace.clock import FakeClock
>>> with gputrace.session(backend="fake", clock=FakeClock(0, 1_000), quiet=True) as s:
...     for _ in range(4):
...         with gputrace.trace("matmul"):
...             pass
>>> row = summarize(s.trace)["rows"][0]
>>> row["name"], row["calls"], row["warm_calls"], row["gpu_ns"]["median"]
('matmul', 4, 3, 20000.0)

Durations are integer or float **nanoseconds** (``gputrace.render`` shows human units); each
figure is defined once, in ``gputrace.figures`` (docs/metrics.md). ``summarize --format json`` writes
this dict, schema ``"gputrace-summary/1"`` (fields are only ever added). Null means "no such value".

Top level: ``schema``, ``file``, ``source`` ("gputrace", or "chrome": another tool's trace), ``note``
(about the source), ``backend``, ``scopes`` (count), ``session_ns``, ``sort`` (the rows' key: by
default ``busy_total``, ``cpu_total`` without GPU times, ``self_cpu_total`` for another tool's trace),
``group`` (trailing numbers folded), ``gpu_busy_ns`` (summed over streams), ``timing`` (per device
``{"device", "timing"}``: cupti or events), ``cupti_dropped_records``, ``ops_unattributed``.

``rows``: one per scope name and GPU stream (CPU-only scopes: ``device``/``queue`` null). A name's
first call is ``cold``; the others are *warm*; *timed* calls have a non-empty GPU span.

- ``name``, ``device``, ``device_name``, ``queue``; ``calls``, ``warm_calls``, ``timed_calls`` (warm),
  ``empty`` (GPU span held no work), ``untimed``, ``errors`` (the scope raised);
- ``cold``: ``{"cpu_ns", "gpu_ns", "queue_gap_ns"}`` of the first call, null if it is in another row;
- ``cpu_ns``: CPU enqueue window, ``{"median", "p95"}`` (warm), ``"total"`` (all calls);
- ``gpu_ns``: GPU span (first start to last end), ``{"median", "p95", "min", "max"}`` (warm timed),
  ``"total"`` (all timed calls);
- ``gpu_busy_ns``: busy time (union of the subtree's GPU intervals), ``{"median"`` (warm) ``, "total"}``;
  ``gpu_share``: the row's busy time on its stream over that stream's (shares can add up past 1);
- ``self_ns``: exclusive time, ``{"cpu_median", "cpu_total", "gpu_median", "gpu_total"}`` (GPU: busy
  time not covered by child scopes);
- ``host_wait_ns``, ``launches``: over warm timed calls, the stream's host-wait idle that the row's
  work ended, and its GPU intervals (operations, spans or 1 a call);
- ``if_launches_free``: ``{"calls", "median_ns", "span_median_ns", "launch_ns", "assumes"}`` for the
  warm calls whose GPU waited for the host at least as long as it worked: busy time plus one
  calibrated CUDA graph launch or WebGPU submit, where below the measured span (needs a calibration
  of the trace's backend);
- ``queue_gap_ns``: submission → GPU start of warm timed calls, ``{"median", "p95"}``;
- ``gpu_over_cpu``: GPU median / CPU median (≫ 1: a wall clock without sync measures enqueueing);
- ``spread``: interquartile range / median of warm times (GPU where any), ``noisy`` above
  ``NOISY_SPREAD`` with ``MIN_CALLS_FOR_SPREAD`` calls or more;
- ``outliers``; ``flags``: count per flag name; ``launch_bound`` (null without a calibration of the
  trace's backend): each launch's work is shorter than one launch costs the CPU and the GPU waited
  for the host at least as long as it worked;
- ``ops`` (traces with operations): per operation name launched by the scope itself, ``{"name",
  "kind", "calls", "gpu_ns": {"median", "total"}, "launch_to_start_ns": {"median"}}``, largest first.

``idle``: per stream ``figures.stream_idle``'s ``{"device", "device_name", "queue", "window_ns",
"busy_ns", "idle_ns", "waiting_for_host_ns", "between_queued_work_ns", "unknown_ns", "from"}``.
``anomalies``: ``[{"kind", "name", "count", "examples": [{"scope", "cpu_start_ns", "cpu_ns",
"gpu_ns", "queue_gap_ns", "uncertainty_ns"}], "meaning", "what_to_do"}]``, most frequent first.
``clock``: ``{"devices": [header clock fits], "max_uncertainty_ns", "note"}``; ``host``: ``{"name",
"cpu_count", "loadavg_start", "loadavg_end", "high", "note"}``; ``calibration``: the header's or
null; ``ranks``: a merged trace's per-rank view (``gputrace.rankview``), else null.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace import figures
from gputrace.durations import fmt_ns
from gputrace.flags import EXPLAIN
from gputrace.model import ANOMALY_FLAGS, I64, NO_TIME, Flag, Trace, flag_names
from gputrace.npstats import Grouped
from gputrace.rankview import rank_view
from gputrace.records import OP_KINDS

SCHEMA = "gputrace-summary/1"
NOISY_SPREAD = 0.10  # interquartile range above 10 % of the median: too noisy to compare closely
MIN_CALLS_FOR_SPREAD = 4
HIGH_LOAD_PER_CPU = 0.8  # 1-minute load average per CPU above which CPU-side times are suspect
MAX_EXAMPLES = 3

# sort key -> the row field it sorts by (see ``field``)
SORT_KEYS = {
    "gpu_total": "gpu_ns.total", "gpu_median": "gpu_ns.median", "gpu_p95": "gpu_ns.p95",
    "gpu_max": "gpu_ns.max", "cpu_median": "cpu_ns.median", "cpu_total": "cpu_ns.total",
    "gap_median": "queue_gap_ns.median", "self_cpu_total": "self_ns.cpu_total",
    "self_gpu_total": "self_ns.gpu_total", "busy_total": "gpu_busy_ns.total", "calls": "calls",
    "spread": "spread", "name": "name",
}  # fmt: skip

# "self": exclusive GPU busy where the trace has GPU times, else exclusive CPU time
SORT_ALIASES = {"self": ("self_gpu_total", "self_cpu_total")}

# kind -> what to do; a flag's meaning is what the trace file says of it (``gputrace.flags.EXPLAIN``)
TO_DO = {
    "empty_gpu_span": "launch the work inside the scope on the traced stream (wgpu: submit before it ends)",
    "gpu_exceeds_wall": "distrust these calls; sync more often and check the clock uncertainty",
    "start_before_submit": "call gputrace.sync() more often so the clock fit is refreshed",
    "overlap": "trace concurrent work on separate streams; check for nested passes",
    "outlier": "look at what else ran at these times; compare medians, not single calls",
    "degraded": "see the gputrace warning printed during the run",
    "launch_bound": figures.GENERIC_ADVICE,  # replaced by the backend's own (gputrace.figures.ADVICE)
    "noisy": "run more iterations, check the host load, and compare medians with care",
}
MEANING = {
    **EXPLAIN,
    "launch_bound": "each launch's GPU work is shorter than one calibrated launch costs the CPU, and the "
    "GPU waited for the host at least as long as it worked: launch overhead dominates",
    "noisy": "warm calls spread by more than 10 % (interquartile range / median)",
}


def _num(x: float, kind: Callable[[float], Any] = float) -> Any:
    """``x`` as ``kind``, or None where it is NaN (a statistic of no values)."""
    return None if np.isnan(x) else kind(x)


def summarize(
    trace: Trace,
    *,
    sort: str | None = None,
    top: int | None = None,
    name: str | None = None,
    file: str | None = None,
    group: bool = False,
) -> dict[str, Any]:
    """The summary of ``trace`` (see the module docstring for every field).

    ``sort`` is one of ``SORT_KEYS`` (largest first; "name" alphabetical; by default GPU total, or
    CPU total when the trace has no GPU times), ``top`` keeps the first N entries of every list
    (rows, idle streams, anomalies), ``name`` keeps names matching a glob pattern (``"matmul*"``)
    or containing it, ``group`` folds trailing numbers (``ProfilerStep#12`` → ``ProfilerStep#*``).
    """
    if sort is not None and sort not in SORT_KEYS and sort not in SORT_ALIASES:
        choices = ", ".join([*SORT_KEYS, *SORT_ALIASES])
        raise ValueError(f"unknown sort key {sort!r}; choose one of {choices}")
    if group:
        trace = fold_numbers(trace)
    iv = figures.intervals(trace)
    idle = figures.stream_idle(trace, iv)
    busy = sum(i["busy_ns"] for i in idle)
    queued = figures.queued_ns(trace, iv)  # from the first operation's launch call where seen
    rows = _rows(trace, idle, iv, queued)
    found = [a for a in anomalies(trace, rows, queued) if name is None or _matches(a["name"], name)]
    has_gpu = any(r["gpu_ns"] for r in rows)
    if sort in SORT_ALIASES:
        sort = SORT_ALIASES[sort][0 if has_gpu else 1]
    if sort is None:  # another tool's trace (PyTorch's) in key_averages' order: self time first
        foreign = trace.header.get("source") == "chrome"
        sort = "self_cpu_total" if foreign else "busy_total" if has_gpu else "cpu_total"
    if name is not None:
        rows = [r for r in rows if _matches(r["name"], name)]
    if sort == "name":
        rows = sorted(rows, key=lambda r: (r["name"], r["device"] is not None, r["queue"] or ""))
    else:  # largest first, rows without the value last; ties by name and stream
        path = SORT_KEYS[sort]
        rows = sorted(
            rows, key=lambda r: (field(r, path) is None, -(field(r, path) or 0), r["name"], r["queue"] or "")
        )
    if top is not None:
        rows, idle, found = rows[: max(top, 0)], idle[: max(top, 0)], found[: max(top, 0)]
    header = trace.header
    start, end = header.get("start_ns"), header.get("end_ns")
    return {
        "schema": SCHEMA,
        "file": file,
        "source": str(header.get("source", "gputrace")),
        "note": header.get("source_note"),
        "backend": header.get("backend"),
        "scopes": len(trace),
        "session_ns": int(end) - int(start) if isinstance(start, int) and isinstance(end, int) else None,
        "sort": sort,
        "group": group,
        "gpu_busy_ns": busy,
        "rows": rows,
        "idle": idle,
        "anomalies": found,
        "clock": clock_section(trace),
        "host": host_section(trace),
        "calibration": figures.header_calibration(trace),
        "ranks": rank_view(trace),
        "timing": [  # per device, the timing source that timed it, where the header says
            {"device": d.get("index"), "timing": d["timing"]}
            for d in header.get("devices") or []
            if isinstance(d, dict) and "timing" in d
        ],
        "cupti_dropped_records": (header.get("backend_info") or {}).get("cupti_dropped_records"),
        "ops_unattributed": (header.get("ops") or {}).get("unattributed"),
    }


def _matches(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern) or pattern in name


_TRAILING_NUMBER = re.compile(r"\d+$")


def fold_numbers(trace: Trace) -> Trace:
    """``trace`` with trailing numbers in names folded (``ProfilerStep#12`` → ``ProfilerStep#*``);
    the first call of a folded name stays its only cold call."""
    index = {n: i for i, n in enumerate(trace.names)}  # kept in place: other tables index them
    for n in trace.names:
        index.setdefault(_TRAILING_NUMBER.sub("*", n), len(index))
    names = list(index)
    to_new = np.array([index[_TRAILING_NUMBER.sub("*", n)] for n in trace.names] or [0], np.int32)
    s = trace.scopes
    new_name = to_new[s.name]
    flags = s.flags.copy()
    cold = np.flatnonzero(flags & np.uint32(Flag.COLD))
    if len(cold):  # scopes are ordered by CPU start: keep the cold flag on the first of each name
        _, first = np.unique(new_name[cold], return_index=True)
        demote = np.setdiff1d(cold, cold[first])
        flags[demote] &= np.uint32(~int(Flag.COLD) & 0xFFFFFFFF)
    scopes = dataclasses.replace(s, name=new_name, flags=flags)
    return dataclasses.replace(trace, names=names, scopes=scopes)


def field(row: dict[str, Any], path: str) -> Any:
    """The value at ``path`` in a summary row (``"gpu_ns.median"``: ``row["gpu_ns"]["median"]``),
    None where a part is missing or null."""
    v: Any = row
    for k in path.split("."):
        v = v.get(k) if isinstance(v, dict) else None
    return v


def _rows(
    trace: Trace, idle: list[dict[str, Any]], iv: figures.Intervals, queued: I64
) -> list[dict[str, Any]]:
    s = trace.scopes
    nq = len(trace.queues)
    flags = s.flags.astype(np.int64)
    has_gpu = s.gpu_start_ns != NO_TIME
    queue = np.where(has_gpu & (s.queue >= 0) & (s.queue < nq), s.queue.astype(np.int64), -1)
    keys, group = np.unique(s.name.astype(np.int64) * (nq + 1) + (queue + 1), return_inverse=True)
    group = group.astype(np.int64)
    g = len(keys)
    warm = (flags & int(Flag.COLD)) == 0
    timed = has_gpu & ((flags & int(Flag.EMPTY)) == 0)
    gw = warm & timed
    cpu_ns = s.cpu_end_ns - s.cpu_start_ns
    gpu_ns = np.where(has_gpu, s.gpu_end_ns - s.gpu_start_ns, 0)
    gap_known = timed & (queued != NO_TIME)
    gap_ns = np.where(gap_known, queued, 0)
    busy_ns = figures.busy_ns(trace, iv)
    self_gpu, self_cpu = figures.self_gpu_ns(trace, iv), figures.self_cpu_ns(trace)
    stream_busy = {(q["device"], q["queue"]): q["busy_ns"] for q in idle}

    def by(rows: npt.NDArray[np.bool_], values: I64) -> Grouped:
        return Grouped(group[rows], values[rows], g)

    def total(rows: npt.NDArray[np.bool_] | slice, values: I64) -> I64:
        # float64 sums are exact for totals below 2**53 ns (104 days)
        weights = values[rows].astype(np.float64)
        return np.rint(np.bincount(group[rows], weights=weights, minlength=g)).astype(np.int64)

    calls = np.bincount(group, minlength=g)
    cpu_w, gpu_w, gap_w = by(warm, cpu_ns), by(gw, gpu_ns), by(warm & gap_known, gap_ns)
    cpu_total, gpu_total = total(slice(None), cpu_ns), total(timed, gpu_ns)
    counts = {bit: np.bincount(group[(flags & int(bit)) != 0], minlength=g) for bit in Flag}
    cpu_med, cpu_p95 = cpu_w.q(0.5), cpu_w.q(0.95)
    gpu_med, gpu_p95, gpu_min, gpu_max = gpu_w.q(0.5), gpu_w.q(0.95), gpu_w.q(0.0), gpu_w.q(1.0)
    gap_med, gap_p95 = gap_w.q(0.5), gap_w.q(0.95)
    use_gpu = gpu_w.counts > 0  # the spread of GPU times where there are any
    spread_med = np.where(use_gpu, gpu_med, cpu_med)
    iqr = np.where(use_gpu, gpu_w.q(0.75) - gpu_w.q(0.25), cpu_w.q(0.75) - cpu_w.q(0.25))
    n_spread = np.where(use_gpu, gpu_w.counts, cpu_w.counts)
    busy_med, busy_total = by(gw, busy_ns).q(0.5), total(timed, busy_ns)
    own_total = total(timed, figures.busy_ns(trace, iv, own_stream=True))
    self_gpu_med, self_gpu_total = by(gw, self_gpu).q(0.5), total(timed, self_gpu)
    self_cpu_med, self_cpu_total = by(warm, self_cpu).q(0.5), total(slice(None), self_cpu)
    waited_w, launches_w = total(gw, figures.host_wait_ns(trace, iv)), total(gw, figures.launches(trace, iv))
    cal = figures.calibration_for(trace)
    bound = figures.launch_bound(total(gw, busy_ns), launches_w, waited_w, cal) if cal is not None else None
    free = figures.free_launch_cost(cal, figures.trace_backend(trace)) if cal is not None else None
    est_ns, est_ok = figures.launch_free_ns(trace, iv)
    est_w = by(gw & est_ok, est_ns)
    est_med, est_span = est_w.q(0.5), by(gw & est_ok, gpu_ns).q(0.5)
    cold_rows = np.flatnonzero(~warm)
    cold_of = dict(zip(group[cold_rows].tolist(), cold_rows.tolist(), strict=True))

    out = []
    for gi in range(g):
        name_idx, q = divmod(int(keys[gi]), nq + 1)
        qi = trace.queues[q - 1] if q else None
        spread = float(iqr[gi] / spread_med[gi]) if n_spread[gi] >= 2 and spread_med[gi] > 0 else None
        row_cold = None
        if gi in cold_of:
            r = cold_of[gi]
            row_cold = {"cpu_ns": int(cpu_ns[r]), "gpu_ns": int(gpu_ns[r]) if timed[r] else None,
                        "queue_gap_ns": int(gap_ns[r]) if gap_known[r] else None}  # fmt: skip
        estimate = None
        if free is not None and est_w.counts[gi]:  # warm calls the estimate applies to
            estimate = {
                "calls": int(est_w.counts[gi]),
                "median_ns": float(est_med[gi]),
                "span_median_ns": float(est_span[gi]),
                "launch_ns": free[0],
                "assumes": f"launches free: each call's GPU busy time plus {free[1]} "
                f"({fmt_ns(free[0])}, calibrated), its work back to back",
            }
        sb = stream_busy.get((qi.device, qi.label)) if qi else None
        out.append(
            {
                "name": trace.names[name_idx],
                "device": qi.device if qi else None,
                "device_name": qi.device_name if qi else None,
                "queue": qi.label if qi else None,
                "calls": int(calls[gi]),
                "warm_calls": int(cpu_w.counts[gi]),
                "timed_calls": int(gpu_w.counts[gi]),
                "empty": int(counts[Flag.EMPTY][gi]),
                "untimed": int(counts[Flag.UNTIMED][gi]),
                "errors": int(counts[Flag.ERROR][gi]),
                "cold": row_cold,
                "cpu_ns": {
                    "median": _num(cpu_med[gi]), "p95": _num(cpu_p95[gi]), "total": int(cpu_total[gi])},
                "gpu_ns": None if not gpu_w.counts[gi] and not gpu_total[gi] else {  # warm times or none
                    "median": _num(gpu_med[gi]), "p95": _num(gpu_p95[gi]), "min": _num(gpu_min[gi], int),
                    "max": _num(gpu_max[gi], int), "total": int(gpu_total[gi])},
                "gpu_share": float(own_total[gi] / sb) if sb and own_total[gi] else None,
                "gpu_busy_ns": None if not gpu_w.counts[gi] and not busy_total[gi] else {
                    "median": _num(busy_med[gi]), "total": int(busy_total[gi])},
                "self_ns": {
                    "cpu_median": _num(self_cpu_med[gi]), "cpu_total": int(self_cpu_total[gi]),
                    "gpu_median": _num(self_gpu_med[gi]) if gpu_w.counts[gi] else None,
                    "gpu_total": int(self_gpu_total[gi]) if gpu_total[gi] or busy_total[gi] else None,
                },
                "host_wait_ns": int(waited_w[gi]) if use_gpu[gi] else None,
                "launches": int(launches_w[gi]) if use_gpu[gi] else None,
                "if_launches_free": estimate,
                "queue_gap_ns": None if not gap_w.counts[gi] else {
                    "median": float(gap_med[gi]), "p95": float(gap_p95[gi])},
                "gpu_over_cpu": float(gpu_med[gi] / cpu_med[gi])
                if use_gpu[gi] and cpu_w.counts[gi] and cpu_med[gi] > 0 else None,
                "spread": spread,
                "noisy": bool(spread is not None and spread > NOISY_SPREAD
                              and n_spread[gi] >= MIN_CALLS_FOR_SPREAD),
                "outliers": int(counts[Flag.OUTLIER][gi]),
                "flags": {flag_names(int(b))[0]: int(counts[b][gi]) for b in Flag if counts[b][gi]},
                "launch_bound": bool(bound[gi]) if bound is not None and use_gpu[gi] else None,
            }
        )  # fmt: skip
    if len(trace.ops):
        _add_ops(trace, out, group)
    return out


def anomalies(trace: Trace, rows: list[dict[str, Any]], queued: I64) -> list[dict[str, Any]]:
    """Anomalies per (kind, name) with example scopes, meaning and advice; most frequent first.
    ``queued``: per scope, ``gputrace.figures.queued_ns``."""
    s = trace.scopes
    flags = s.flags.astype(np.int64)
    found: list[tuple[str, str, int, list[dict[str, Any]], dict[str, Any]]] = []  # kind, name, count, ...
    for bit in [b for b in Flag if int(b) & int(ANOMALY_FLAGS)]:
        hit = np.flatnonzero(flags & int(bit))
        names, count = np.unique(s.name[hit], return_counts=True)
        for nm, c in zip(names.tolist(), count.tolist(), strict=True):
            ex = [_example(trace, int(r), queued) for r in hit[s.name[hit] == nm][:MAX_EXAMPLES]]
            found.append((flag_names(int(bit))[0], trace.names[nm], c, ex, {}))
    advice = figures.ADVICE.get(figures.trace_backend(trace) or "", figures.GENERIC_ADVICE)
    for r in rows:
        numbers = {"gpu_median_ns": field(r, "gpu_ns.median"), "cpu_median_ns": r["cpu_ns"]["median"],
                   "spread": r["spread"]}  # fmt: skip
        more = {"queue": r["queue"], "numbers": numbers}
        if r["launch_bound"]:
            found.append(("launch_bound", r["name"], r["timed_calls"], [], more | {"what_to_do": advice}))
        if r["noisy"]:
            found.append(("noisy", r["name"], r["warm_calls"], [], more))
    out: list[dict[str, Any]] = [
        {"kind": k, "name": n, "count": c, "examples": ex, "meaning": MEANING[k], "what_to_do": TO_DO[k]}
        | more
        for k, n, c, ex, more in found
    ]
    out.sort(key=lambda a: (-a["count"], a["kind"], a["name"]))
    return out


def _example(trace: Trace, r: int, queued: I64) -> dict[str, Any]:
    sc = trace.scope(r)
    gap = int(queued[r])
    return {
        "scope": r,
        "cpu_start_ns": sc.cpu_start_ns - trace.base_ns,
        "cpu_ns": sc.cpu_ns,
        "gpu_ns": sc.gpu_ns,
        "queue_gap_ns": None if gap == NO_TIME else gap,  # gputrace.figures.queued_ns
        "uncertainty_ns": sc.uncertainty_ns,
    }


def clock_section(trace: Trace) -> dict[str, Any]:
    """The clock fits from the header and the largest per-scope alignment uncertainty."""
    s = trace.scopes
    has_gpu = s.gpu_start_ns != NO_TIME
    fits = [dict(c) for c in trace.header.get("clock", []) if isinstance(c, dict)]
    max_unc = int(s.uncertainty_ns[has_gpu].max()) if has_gpu.any() else None
    if not has_gpu.any():
        note = "no GPU times in this trace: nothing to align."
    elif trace.header.get("source") == "chrome":
        note = "the other tool placed GPU times on its CPU clock; their uncertainty is not recorded."
    elif not fits:
        note = "GPU times carry no clock fit in this trace: treat their placement as unknown."
    else:
        note = f"GPU times are placed on the CPU clock within ±{fmt_ns(max_unc)}."
    return {"devices": fits, "max_uncertainty_ns": max_unc, "note": note}


def host_section(trace: Trace) -> dict[str, Any]:
    """The host and its load average at start and end; ``high`` when CPU times are suspect."""
    host = trace.header.get("host")
    host = host if isinstance(host, dict) else {}
    cpus = host.get("cpu_count")
    loads = [
        float(la[0]) for la in (host.get("loadavg_start"), host.get("loadavg_end"))
        if isinstance(la, list) and la and isinstance(la[0], (int, float))
    ]  # fmt: skip
    high = bool(isinstance(cpus, int) and cpus > 0 and loads and max(loads) > HIGH_LOAD_PER_CPU * cpus)
    note = None
    if high:
        note = (f"the host was busy (load {max(loads):.2f} on {cpus} CPUs): CPU-side times and "
                "launch gaps may be inflated; GPU times are not affected.")  # fmt: skip
    elif not loads:
        note = "the trace does not record the host load."
    fields = ("name", "cpu_count", "loadavg_start", "loadavg_end")
    return {**{k: host.get(k) for k in fields}, "high": high, "note": note}


def _add_ops(trace: Trace, rows: list[dict[str, Any]], group: I64) -> None:
    """Each row's ``ops`` (the module docstring); ``group`` is each scope's row."""
    ops = trace.ops
    own = np.flatnonzero(ops.scope >= 0)
    if not len(own):
        return
    kinds = ops.kind[own].astype(np.int64)
    names = ops.name[own].astype(np.int64)
    code = (group[ops.scope[own]] * max(len(trace.names), 1) + names) * (int(kinds.max()) + 1) + kinds
    order = np.argsort(code, kind="stable")  # (row, operation name, kind) as one integer
    cuts = np.flatnonzero(np.diff(code[order])) + 1
    dur = ops.gpu_end_ns - ops.gpu_start_ns
    lag = np.where(ops.call_start_ns != NO_TIME, ops.gpu_start_ns - ops.call_start_ns, NO_TIME)
    for ks in sorted(np.split(own[order], cuts), key=lambda ks: int(ks[0])):  # as first launched
        k0 = int(ks[0])
        seen = lag[ks][lag[ks] != NO_TIME]
        kind = int(ops.kind[k0])
        rows[int(group[ops.scope[k0]])].setdefault("ops", []).append(
            {
                "name": trace.names[int(ops.name[k0])],
                "kind": OP_KINDS[kind] if 0 <= kind < len(OP_KINDS) else "kernel",
                "calls": len(ks),
                "gpu_ns": {"median": float(np.median(dur[ks])), "total": int(dur[ks].sum())},
                "launch_to_start_ns": {"median": float(np.median(seen))} if len(seen) else None,
            }
        )
    for row in rows:
        if "ops" in row:
            row["ops"].sort(key=lambda o: (-o["gpu_ns"]["total"], o["name"]))
