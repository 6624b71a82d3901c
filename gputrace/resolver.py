"""The resolver: a pure function from raw records to a ``Trace``.

It fits each GPU clock onto the session clock, places every GPU span on it, reconstructs nesting
and flags anomalies. Nothing is clamped: a flagged value stays as measured, and every aligned time
carries its uncertainty (docs/accuracy.md).

The clock fit: ``cpu = cpu_ref + slope·(g − gpu_ref)`` by least squares on the calibration windows'
midpoints, weighted by 1/half-width² (windows over ``WIDE_WINDOW``× the lower quartile are left
out). The slope is kept only where the samples pin it better than ``DEFAULT_DRIFT_PPM``, else it is
1 (``method="offset"``). For a linear truth the error at sample ``i`` is at most ``|residual_i| +
half_width_i``, so between the first and last sample at most their largest: ``uncertainty_ns``.
Beyond, the slope's uncertainty adds ``2·U/span`` per ns (``DEFAULT_DRIFT_PPM`` for an offset fit).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from gputrace.clockbound import FeasibleBand, sample_columns
from gputrace.figures import ancestor_pairs, first_submission_ns, op_intervals
from gputrace.flags import anomaly_report, flag
from gputrace.model import (
    NO_TIME,
    ClockFit,
    Mark,
    OpTable,
    ScopeTable,
    SpanTable,
    ThreadInfo,
    Trace,
    canonical_names,
    nest,
)
from gputrace.npstats import distinct
from gputrace.records import Blind, CalibrationSample, OpBatch, RawRecording

__all__ = ["DEFAULT_DRIFT_PPM", "RawRecording", "anomaly_report", "fit_clock", "resolve", "uncertainty_at"]

Fitted = tuple[ClockFit, FeasibleBand | None]  # a device's clock fit and, where the windows allow, its band

# The largest clock drift assumed when a single sample cannot measure it (FACTS: −2 … +44 ppm seen).
DEFAULT_DRIFT_PPM = 50.0


def fit_clock(samples: Sequence[CalibrationSample]) -> ClockFit | None:
    """The GPU→CPU clock mapping fitted over ``samples`` (in any order); None without any."""
    if not samples:
        return None
    cols = sample_columns(samples)
    return _fit_columns(cols[:, 0], cols[:, 1], cols[:, 2])


def _fit_columns(before: np.ndarray, gpu: np.ndarray, after: np.ndarray) -> ClockFit:
    """``fit_clock`` over the samples' columns (CPU before, GPU, CPU after; at least one)."""
    order = np.lexsort((after, before, gpu))
    before, gpu, after = before[order], gpu[order], after[order]
    hw_all = (after - before) / 2.0
    typical = float(np.sort(hw_all)[(len(hw_all) - 1) // 4])  # the lower quartile
    keep = hw_all <= WIDE_WINDOW * max(typical, 0.5)
    before, gpu, after, hw = before[keep], gpu[keep], after[keep], hw_all[keep]
    best = int(np.argmin(hw))
    gpu_ref, cpu_ref0 = int(gpu[best]), int(before[best])
    x = (gpu - gpu_ref).astype(np.float64)
    y = (before - cpu_ref0).astype(np.float64) + hw
    w = 1.0 / (hw + 1.0) ** 2
    xm = float(np.sum(w * x) / np.sum(w))
    ym = float(np.sum(w * y) / np.sum(w))
    sxx = float(np.sum(w * (x - xm) ** 2))
    method = "offset"
    slope, intercept = 1.0, ym - xm
    if len(x) > 1 and sxx > 0:
        fitted = float(np.sum(w * (x - xm) * (y - ym)) / sxx)
        b = np.max(np.abs(y - (ym + fitted * (x - xm))) + hw)
        span = float(np.ptp(x))
        # Keep the measured slope only where the samples pin it down better than the drift we
        # assume anyway; a slope from two close samples would scale every duration by its noise.
        if span > 0 and 2.0 * b / span < DEFAULT_DRIFT_PPM * 1e-6:
            method, slope, intercept = "offset+slope", fitted, ym - fitted * xm
    cpu_ref = cpu_ref0 + round(intercept)
    resid = y - (intercept + slope * x)
    bound = np.abs(resid) + hw
    return ClockFit(
        gpu_ref_ns=gpu_ref,
        cpu_ref_ns=int(cpu_ref),
        slope=slope,
        residual_ns=float(np.max(np.abs(resid))),
        uncertainty_ns=float(np.max(bound)) + 0.5,  # + rounding to integer ns
        samples=len(x),
        first_cpu_ns=int(before.min()),
        last_cpu_ns=int(after.max()),
        method=method,
    )


# Samples wider than this many times the lower quartile of the half-widths are left out of the fit
# (not the median: as many wide windows as tight, a stop woken late under load, would move it).
WIDE_WINDOW = 4.0


def uncertainty_at(fit: ClockFit, cpu_ns: np.ndarray) -> np.ndarray:
    """Alignment uncertainty (ns) of times mapped by ``fit``, growing outside the sampled span."""
    span = fit.last_cpu_ns - fit.first_cpu_ns
    if fit.method == "offset+slope" and span > 0:
        slope_err = 2.0 * fit.uncertainty_ns / span
    else:
        slope_err = DEFAULT_DRIFT_PPM * 1e-6
    dist = np.maximum(fit.first_cpu_ns - cpu_ns, 0) + np.maximum(cpu_ns - fit.last_cpu_ns, 0)
    unc: np.ndarray = np.ceil(fit.uncertainty_ns + slope_err * dist.astype(np.float64)).astype(np.int64)
    return unc


def resolve(raw: RawRecording, *, report: bool = True) -> Trace:
    """Turn raw records into a ``Trace`` (pure: same input, in any order, same output).
    ``report=False`` leaves the header's anomaly list out (a streamed chunk: the session counts)."""
    name_ids: dict[str, int] = {}  # name -> its index, in order of first appearance

    def intern(n: object) -> int:
        return name_ids.setdefault(n if isinstance(n, str) else str(n), len(name_ids))

    live = [(ti, t) for ti, t in enumerate(raw.threads) if len(t.times)]
    args_in: dict[int, dict[str, Any]] = {}  # row in the concatenated input -> args
    n = 0
    for _, t in live:
        args_in.update({n + k: v for k, v in t.args.items()})
        n += len(t.names)
    s = ScopeTable.empty(n)
    tokens = np.zeros(0, np.int64)
    if n:
        allt = np.concatenate([t.times for _, t in live])
        names_a = np.concatenate([_intern_all(t.names, intern) for _, t in live])
        thread_a = np.concatenate([np.full(len(t.names), ti, np.int32) for ti, t in live])
        order = np.lexsort((-allt[:, 1], thread_a, allt[:, 0]))
        allt, s.name, s.thread = allt[order], names_a[order], thread_a[order]
        s.cpu_start_ns = np.ascontiguousarray(allt[:, 0])
        s.cpu_end_ns = np.ascontiguousarray(allt[:, 1])
        tokens = np.ascontiguousarray(allt[:, 2])
        s.flags = allt[:, 3].astype(np.uint32)
        if args_in:
            new_row = np.empty(n, np.int64)
            new_row[order] = np.arange(n)
            s.args = {int(new_row[old]): a for old, a in sorted(args_in.items()) if a}
        nest(s)

    fitted = _fits(raw)
    spans, ops, blind = SpanTable.empty(0), OpTable.empty(0), None
    if raw.ops_timing:
        ops, done_by, blind = _place_ops(raw, s, intern, fitted)
    else:
        spans, done_by = _place_spans(raw, s, tokens, intern, fitted)
    fits = {d: f for d, (f, _) in fitted.items()}
    flag(raw, s, tokens, done_by, blind)
    marks = [
        Mark(name, ts, ti, kind, dict(args))
        for ti, t in enumerate(raw.threads)
        for (name, ts, kind, args) in t.marks
    ]
    marks.sort(key=lambda m: (m.ts_ns, m.thread, m.name))
    names = canonical_names(list(name_ids), s, spans, ops)
    header = dict(raw.header)
    header["clock"] = [dict(device=d, **fits[d].to_dict()) for d in sorted(fits)]
    header["spans_cover_children"] = raw.spans_cover_children or raw.ops_timing
    if raw.ops_timing:
        header["ops"] = {"count": len(ops), "unattributed": int(np.count_nonzero(ops.scope < 0))}
    threads = [ThreadInfo(t.tid, t.name) for t in raw.threads]
    trace = Trace(header, names, threads, list(raw.queues), s, spans, marks, fits, ops)
    if report:
        header["anomalies"] = anomaly_report(trace)
    return trace


def _intern_all(names: list[str], intern: Callable[[object], int]) -> np.ndarray:
    """``intern`` of every name, asked once per distinct name."""
    try:
        distinct = dict.fromkeys(names)
    except TypeError:  # an unhashable name: one by one
        distinct = None
    # (names of other types than str may compare equal across types: 1 == 1.0 == True)
    if distinct is None or not all(type(k) is str for k in distinct):
        return np.fromiter((intern(n) for n in names), np.int32, len(names))
    ids = {k: intern(k) for k in distinct}
    return np.fromiter(map(ids.__getitem__, names), np.int32, len(names))


def clock_fits(samples: list[CalibrationSample]) -> dict[int, ClockFit]:
    """Per device: the clock fitted over ``samples`` alone (a session's final header, a rank's
    offsets against rank 0)."""
    return {d: f for d, (f, _) in _fits(RawRecording(header={}, threads=[], samples=samples)).items()}


def _fits(raw: RawRecording) -> dict[int, Fitted]:
    """Per device: the fitted clock and, where the windows allow, the feasible-set band."""
    if not raw.samples:
        return {}
    cols = sample_columns(raw.samples)
    device = cols[:, 3]
    devices, first = np.unique(device, return_index=True)
    session = (_header_ns(raw.header, "start_ns"), _header_ns(raw.header, "end_ns"))
    out = {}
    for d in devices[np.argsort(first)].tolist():
        mine = cols[device == d] if len(devices) > 1 else cols
        got = _fit_device(np.ascontiguousarray(mine[:, :3]).tobytes(), *session)
        if got is not None:
            out[d] = got
    return out


def _header_ns(header: dict[str, Any], key: str) -> int | None:
    v = header.get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


# A fit is weak (its ClockFit.note says why) when it rests on fewer samples than this, or on
# samples from less than this share of the stretch the session's samples (and the session) span.
MIN_FIT_SAMPLES = 2
MIN_FIT_STRETCH = 0.5


@functools.lru_cache(maxsize=8)
def _fit_device(columns: bytes, start_ns: int | None = None, end_ns: int | None = None) -> Fitted | None:
    """One device's fit and band from its samples' columns (CPU before, GPU, CPU after) as bytes,
    noted as weak where it does not cover the session (``start_ns`` … ``end_ns``, where known).
    Cached: a streamed session fits the same samples for its last chunk and its final header."""
    cols = np.frombuffer(columns, np.int64).reshape(-1, 3)
    if not len(cols):
        return None
    before, gpu, after = cols[:, 0], cols[:, 1], cols[:, 2]
    fit = _fit_columns(before, gpu, after)
    band = FeasibleBand.from_columns(before, gpu, after, fit)
    if band is None:
        fit = replace(fit, bound="residual+window (no linear clock fits every window)")
    else:
        # Centre the line in the band (same slope): the least-squares line can sit off-centre
        # when the windows are lopsided (a GPU that runs late after every submit).
        moved = replace(fit, cpu_ref_ns=fit.cpu_ref_ns + round(band.centre_offset()))
        moved = _with_residual_bound(before, gpu, after, moved)
        band.fit = moved
        tighter = band.span_bound()
        if tighter < moved.uncertainty_ns:
            fit = replace(moved, uncertainty_ns=tighter, bound="feasible set")
        else:
            band.fit = fit
    first = min(int(before.min()), start_ns if start_ns is not None else int(before.min()))
    stretch = max(int(after.max()), end_ns if end_ns is not None else int(after.max())) - first
    own = fit.last_cpu_ns - fit.first_cpu_ns
    note = ""
    if fit.samples < MIN_FIT_SAMPLES:
        note = (
            f"the clock fit rests on {fit.samples} calibration sample: the drift is assumed "
            f"(±{DEFAULT_DRIFT_PPM:g} ppm), not measured"
        )
    elif stretch > 0 and own < MIN_FIT_STRETCH * stretch:
        note = (
            f"the clock fit rests on {fit.samples} calibration samples from {own / 1e6:.3g} ms of "
            f"the {stretch / 1e6:.4g} ms it should cover (the other samples' windows were too wide): "
            "its uncertainty grows away from them"
        )
    if note:
        fit = replace(fit, note=note)
        if band is not None:
            band.fit = fit
    return fit, band


def _with_residual_bound(before: np.ndarray, gpu: np.ndarray, after: np.ndarray, fit: ClockFit) -> ClockFit:
    """``fit`` with its residual and residual+window bound recomputed over the samples."""
    used = (before >= fit.first_cpu_ns) & (before <= fit.last_cpu_ns)
    b, a = before[used], after[used]
    mids = (b + a) / 2.0
    hw = (a - b) / 2.0
    at = fit.to_cpu(gpu[used]).astype(np.float64)
    resid = np.abs(mids - at)
    return replace(fit, residual_ns=float(resid.max()), uncertainty_ns=float(np.max(resid + hw)) + 0.5)


def _place_spans(
    raw: RawRecording, s: ScopeTable, tokens: np.ndarray, intern: Any, fitted: dict[int, Fitted]
) -> tuple[SpanTable, np.ndarray | None]:
    """Align raw GPU spans onto the session clock and hull them per scope; also returns, per
    scope, the CPU time by which its GPU work was known complete."""
    if not len(raw.spans) or not len(s):
        return SpanTable.empty(0), None
    sorted_rows = np.argsort(tokens, kind="stable")
    sorted_tokens = tokens[sorted_rows]
    m = len(raw.spans)
    fields, labels = raw.spans.cols, raw.spans.labels
    label_list = sorted(set(labels or [""]))  # spans sort by label last, as strings
    label_rank = np.zeros(m, np.int64)
    if labels is not None:
        rank_of = {lb: i for i, lb in enumerate(label_list)}
        label_rank = np.fromiter(map(rank_of.__getitem__, labels), np.int64, m)
    # the spans in (token, gpu start, gpu end, queue, label) order: the result never depends on
    # the order the backend delivered them in
    order = np.lexsort((label_rank, fields[:, 1], fields[:, 3], fields[:, 2], fields[:, 0]))
    fields, label_rank = fields[order], label_rank[order]
    tok = fields[:, 0]
    pos = np.searchsorted(sorted_tokens, tok)
    pos_ok = (pos < len(sorted_tokens)) & (sorted_tokens[np.minimum(pos, len(sorted_tokens) - 1)] == tok)
    queue = fields[:, 1].astype(np.int32)
    n_q = len(raw.queues)
    q_device = np.array([q.device for q in raw.queues] + [0], np.int64)
    dev = q_device[np.where((queue >= 0) & (queue < n_q), queue, n_q)]
    c0, c1 = np.full(m, NO_TIME, np.int64), np.full(m, NO_TIME, np.int64)
    for d in distinct(dev).tolist():
        if d in fitted:
            on = dev == d
            c0[on], c1[on] = fitted[d][0].to_cpu(fields[on, 2]), fitted[d][0].to_cpu(fields[on, 3])
    aligned = np.flatnonzero(pos_ok & (c0 != NO_TIME))
    rows = sorted_rows[pos[aligned]]
    by_scope = np.lexsort((c1[aligned], c0[aligned], rows))  # in scope order, as a loaded file has them
    keep = aligned[by_scope]
    ranks = label_rank[keep]
    label_id = np.zeros(len(label_list), np.int32)
    for r in distinct(ranks).tolist():
        label_id[r] = intern(label_list[r])
    table = SpanTable(
        scope=rows[by_scope].astype(np.int64),
        label=label_id[ranks],
        queue=queue[keep],
        submit_ns=fields[keep, 4],
        gpu_start_ns=c0[keep],
        gpu_end_ns=c1[keep],
    )
    done_by = fields[keep, 5]
    if not len(table):
        return table, None
    # Hull per scope (and, where spans belong to the innermost scope, per ancestor too).
    if raw.spans_cover_children:
        own, sel = ancestor_pairs(s.parent, table.scope)
    else:
        own, sel = table.scope, np.arange(len(table))
    sub = np.full(len(s), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(sub, own, table.submit_ns[sel])
    s_done = _hull(
        s, own, table.gpu_start_ns[sel], table.gpu_end_ns[sel], table.queue[sel], done_by[sel],
        lambda q: fitted.get(raw.queues[q].device) if q < len(raw.queues) else None,
    )  # fmt: skip
    s.submit_ns = np.where(s.gpu_end_ns != NO_TIME, sub, NO_TIME)
    return table, s_done


def _hull(
    s: ScopeTable,
    own: np.ndarray,
    g0: np.ndarray,
    g1: np.ndarray,
    queue: np.ndarray,
    done: np.ndarray,
    fit_of: Callable[[int], Fitted | None],
) -> np.ndarray:
    """Each scope's GPU span as the hull of the intervals it owns (``own[i]`` owns ``g0[i]``…
    ``g1[i]`` on ``queue[i]``, known complete by ``done[i]``); its queue is that of its earliest
    interval, its uncertainty that of its queue's clock fit at its start and end. Sets those
    columns of ``s``; returns per scope the time by which its work was known complete."""
    gs = np.full(len(s), np.iinfo(np.int64).max, np.int64)
    ge = np.full(len(s), NO_TIME, np.int64)
    np.minimum.at(gs, own, g0)
    np.maximum.at(ge, own, g1)
    has = ge != NO_TIME
    s.gpu_start_ns = np.where(has, gs, NO_TIME)
    s.gpu_end_ns = np.where(has, ge, NO_TIME)
    first_q = np.full(len(s), -1, np.int32)
    # queue of a scope: that of its earliest interval (reverse assignment keeps the earliest)
    order = np.argsort(g0, kind="stable")[::-1]
    first_q[own[order]] = queue[order]
    s.queue = first_q
    s_done = np.full(len(s), NO_TIME, np.int64)
    np.maximum.at(s_done, own, done)
    unc = np.zeros(len(s), np.int64)
    for q in distinct(first_q[first_q >= 0]).tolist():
        got = fit_of(q)
        if got is None:
            continue
        fit, band = got
        m = first_q == q
        for col in (s.gpu_start_ns[m], s.gpu_end_ns[m]):
            u = uncertainty_at(fit, col)
            if band is not None:  # both bounds hold; keep the tighter one at each time
                u = np.minimum(u, band.bound(col).astype(np.int64))
            unc[m] = np.maximum(unc[m], u)
    s.uncertainty_ns = unc
    return s_done


def _host_fit(fitted: dict[int, Fitted], device: int) -> Fitted | None:
    """``device``'s fit and band; a host-side clock (CUPTI) is one clock for every device."""
    return fitted.get(device) or (fitted[min(fitted)] if fitted else None)


def _place_ops(
    raw: RawRecording, s: ScopeTable, intern: Any, fitted: dict[int, Fitted]
) -> tuple[OpTable, np.ndarray | None, np.ndarray | None]:
    """Align per-operation records, attribute each to the innermost scope open on its launching
    thread when its launch call started, and hull them per scope over its subtree. Returns the
    operations and, per scope, when its work was known complete and whether a blind stretch of the
    source (another tool held it) overlaps its CPU window."""
    batch = OpBatch.concat(raw.batches)
    n_ops = len(batch)
    blind = None
    if raw.blind and len(s):
        blind = _blind_scopes(s, raw.blind, (_host_fit(fitted, 0) or (None,))[0])
    if not n_ops:
        return OpTable.empty(0), None, blind
    # sorted by GPU start (ties: end, device, queue, correlation, name), whatever order the
    # records came in; names interned once per distinct name
    r = batch.rows
    name_rank = np.zeros(max(len(batch.names), 1), np.int64)
    name_rank[np.argsort(np.array(batch.names, dtype=object))] = np.arange(len(batch.names))
    order = np.lexsort(
        (name_rank[r["name"]], r["correlation"], r["queue"], r["device"], r["gpu_end_ns"], r["gpu_start_ns"])
    )
    r = np.take(r, order)  # (a structured array's ``r[order]`` copies field by field: 20x slower)
    ids = _intern_all(batch.names, intern) if batch.names else np.zeros(1, np.int32)
    ops = OpTable.empty(n_ops)
    for c in ("kind", "queue", "correlation", "bytes", "grid", "block", "graph_id", "graph_node_id"):
        setattr(ops, c, np.ascontiguousarray(r[c], getattr(ops, c).dtype))
    ops.name, ops.call_name = ids[r["name"]].astype(np.int32), ids[r["call_name"]].astype(np.int32)
    dev, tid = r["device"].astype(np.int64), r["call_tid"]
    for d in distinct(dev).tolist():
        fit_band = _host_fit(fitted, d)
        # no calibration at all: keep the raw clock (the header says so)
        to = fit_band[0].to_cpu if fit_band else np.asarray
        for col in ("gpu_start_ns", "gpu_end_ns", "call_start_ns", "call_end_ns"):
            rows = dev == d if col.startswith("gpu") else (dev == d) & (tid >= 0)
            getattr(ops, col)[rows] = to(r[col][rows])
    # launching thread -> row of raw.threads
    by_tid = {t.tid: i for i, t in enumerate(raw.threads)}
    uniq_tid, tid_inv = np.unique(tid, return_inverse=True)
    ops.thread = np.array([by_tid.get(t, -1) for t in uniq_tid.tolist()], np.int32)[tid_inv.reshape(-1)]
    ops.scope = _attribute(s, ops.thread, ops.call_start_ns)
    # a reused pthread id: try the other threads that had it
    if batch.tid_alt:
        for k in np.flatnonzero((ops.scope < 0) & np.isin(tid, list(batch.tid_alt))).tolist():
            for alt in batch.tid_alt.get(int(tid[k]), ()):
                th = by_tid.get(alt, -1)
                if th < 0:
                    continue
                got = _attribute(s, np.array([th], np.int32), ops.call_start_ns[k : k + 1])
                if got[0] >= 0:
                    ops.thread[k], ops.scope[k] = th, got[0]
                    break
    own, sel = ancestor_pairs(s.parent, ops.scope)  # hull per scope over its subtree
    if not len(own):
        return ops, None, blind
    s_done = _hull(
        s, own, ops.gpu_start_ns[sel], ops.gpu_end_ns[sel], ops.queue[sel], r["done_by_ns"][sel],
        lambda q: _host_fit(fitted, raw.queues[q].device if q < len(raw.queues) else 0),
    )  # fmt: skip
    if raw.source_error_ns:  # the source's own error in its GPU times, beyond the clock fit
        s.uncertainty_ns = np.where(
            s.gpu_start_ns != NO_TIME, s.uncertainty_ns + raw.source_error_ns, s.uncertainty_ns
        )
    # submission: the launch call of the scope's first operation (the entry where none was seen)
    s.submit_ns = np.where(s.gpu_end_ns != NO_TIME, s.cpu_start_ns, NO_TIME)
    s.submit_ns = first_submission_ns(s, op_intervals(s, ops))
    return ops, s_done, blind


def _blind_scopes(s: ScopeTable, stretches: list[Blind], fit: ClockFit | None) -> np.ndarray:
    """Per scope, whether its CPU window overlaps a stretch the timing source was blind in."""
    out = np.zeros(len(s), bool)
    if fit is None:
        return out
    b0 = fit.to_cpu(np.array([b.start_ns for b in stretches], np.int64))
    b1 = fit.to_cpu(np.array([b.end_ns for b in stretches], np.int64))
    order = np.argsort(b0, kind="stable")
    b0, b1 = b0[order], np.maximum.accumulate(b1[order])  # union of the stretches, sorted
    last = np.searchsorted(b0, s.cpu_end_ns, side="right") - 1  # last stretch starting in time
    out[:] = (last >= 0) & (b1[np.maximum(last, 0)] >= s.cpu_start_ns)
    return out


def _attribute(s: ScopeTable, thread: np.ndarray, call_ns: np.ndarray) -> np.ndarray:
    """Row of the innermost scope of ``thread`` whose CPU window holds ``call_ns`` (−1: none): the
    latest-entered one at or before ``call_ns``, or one of its ancestors (scopes nest)."""
    out = np.full(len(thread), -1, np.int64)
    parent = s.parent
    ends = s.cpu_end_ns
    for th in distinct(thread[thread >= 0]).tolist():
        rows = np.flatnonzero(s.thread == th)
        if not len(rows):
            continue
        m = np.flatnonzero((thread == th) & (call_ns != NO_TIME))
        pos = np.searchsorted(s.cpu_start_ns[rows], call_ns[m], side="right") - 1
        cand = np.where(pos >= 0, rows[np.maximum(pos, 0)], -1)
        # the latest-entered scope had already ended: walk up to the ancestor still open, all
        # such calls at once, one level of nesting a step
        t = call_ns[m]
        late = np.flatnonzero((cand >= 0) & (ends[np.maximum(cand, 0)] < t))
        while len(late):
            cand[late] = parent[cand[late]]
            late = late[(cand[late] >= 0) & (ends[np.maximum(cand[late], 0)] < t[late])]
        out[m] = cand
    return out
