"""The derived figures, one definition each (docs/metrics.md): busy, idle, share, submission,
queued, self time, launch-bound and the launch-free estimate; ``summarize``, the trace args and the
viewer read them, so the three agree.

Each is computed from the trace's *GPU intervals*, the finest it holds: its operations (CUPTI), else
its GPU spans below scope level (a wgpu pass, a CUDA event pair), else the scopes' own GPU spans.
Each interval has an owner scope, a stream and a submission (an operation's launch call start, a
span's submit time, the scope's entry otherwise).

>>> import gputrace
>>> from gputrace.clock import FakeClock
>>> with gputrace.session(backend="fake", clock=FakeClock(0, 1_000), quiet=True) as s:
...     with gputrace.trace("a"):
...         pass
>>> busy_ns(s.trace).tolist(), [q["busy_ns"] for q in stream_idle(s.trace)]
([20000], [20000])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace.model import I64, NO_TIME, OpTable, ScopeTable, Trace
from gputrace.npstats import distinct, interval_union


@dataclass(frozen=True)
class Intervals:
    """The trace's GPU intervals (see the module docstring), one row each."""

    owner: I64  # scope row, or -1 (an operation launched outside every scope)
    queue: I64
    start_ns: I64
    end_ns: I64
    submit_ns: I64  # NO_TIME where unknown
    source: str  # "operations", "spans" or "scopes"


def intervals(trace: Trace) -> Intervals:
    """The finest GPU intervals ``trace`` holds."""
    s, ops, sp = trace.scopes, trace.ops, trace.spans
    if len(ops):
        return op_intervals(s, ops)
    # the spans, and the timed scopes with no span in their subtree (all of them without spans)
    timed = np.flatnonzero(s.gpu_start_ns != NO_TIME)
    covered = np.zeros(len(s), bool)
    covered[ancestor_pairs(s.parent, sp.scope.astype(np.int64))[0]] = True
    timed = timed[~covered[timed]]
    return Intervals(
        np.concatenate([sp.scope.astype(np.int64), timed]),
        np.concatenate([sp.queue.astype(np.int64), s.queue[timed].astype(np.int64)]),
        np.concatenate([sp.gpu_start_ns, s.gpu_start_ns[timed]]),
        np.concatenate([sp.gpu_end_ns, s.gpu_end_ns[timed]]),
        np.concatenate([sp.submit_ns, s.submit_ns[timed]]),
        "spans" if len(sp) else "scopes",
    )


def op_intervals(s: ScopeTable, ops: OpTable) -> Intervals:
    """The operations as GPU intervals; an operation whose launch call was not seen is submitted
    at its scope's entry (the finest time left)."""
    own = ops.scope.astype(np.int64)
    sub = ops.call_start_ns.astype(np.int64).copy()
    unseen = (sub == NO_TIME) & (own >= 0)
    sub[unseen] = s.cpu_start_ns[own[unseen]]
    return Intervals(own, ops.queue.astype(np.int64), ops.gpu_start_ns, ops.gpu_end_ns, sub, "operations")


def ancestor_pairs(parent: I64, owner: I64, *, strict: bool = False) -> tuple[I64, I64]:
    """(ancestor, interval row) pairs: every interval paired with its owner's ancestors (and the
    owner itself unless ``strict``)."""
    rows = np.flatnonzero(owner >= 0)
    cur = owner[rows]
    anc, idx = [], []
    while len(cur):  # one level up per round, the owners first (left out if strict)
        anc.append(cur)
        idx.append(rows)
        cur = parent[cur]
        keep = cur >= 0
        cur, rows = cur[keep], rows[keep]
    none = np.zeros(0, np.int64)  # no pair at all: empty columns
    return np.concatenate([none, *anc[strict:]]), np.concatenate([none, *idx[strict:]])


def union_by_group(group: I64, start: I64, end: I64, n_groups: int) -> I64:
    """Per group, the length of the union of its intervals (time at least one of them ran).

    >>> union_by_group(np.array([0, 0, 0, 1]), np.array([0, 5, 2, 0]), np.array([4, 6, 3, 7]), 2).tolist()
    [5, 7]
    """
    out = np.zeros(n_groups, np.int64)
    if not len(group):
        return out
    order = np.lexsort((start, group))
    g, st = group[order], start[order]
    en = np.maximum(end[order], st)  # a negative duration (flagged) covers nothing
    run = en.copy()  # running max of the ends within each group (Hillis-Steele scan)
    k = 1
    while k < len(run):
        same = g[k:] == g[:-k]
        run[k:] = np.where(same, np.maximum(run[k:], run[:-k]), run[k:])
        k *= 2
    prev = np.empty_like(run)
    prev[0] = NO_TIME
    prev[1:] = np.where(g[1:] == g[:-1], run[:-1], NO_TIME)
    new = np.maximum(en - np.maximum(st, prev), 0)
    np.add.at(out, g, new)
    return out


def busy_ns(trace: Trace, iv: Intervals | None = None, *, own_stream: bool = False) -> I64:
    """Per scope, its GPU busy time: the union of the GPU intervals of its subtree (with
    ``own_stream``, of those on the scope's own stream: the share's numerator)."""
    iv = intervals(trace) if iv is None else iv
    anc, idx = ancestor_pairs(trace.scopes.parent, iv.owner)
    if own_stream:
        mine = iv.queue[idx] == trace.scopes.queue[anc]
        anc, idx = anc[mine], idx[mine]
    return union_by_group(anc, iv.start_ns[idx], iv.end_ns[idx], len(trace.scopes))


def self_gpu_ns(trace: Trace, iv: Intervals | None = None) -> I64:
    """Per scope, its exclusive GPU busy time: busy time not covered by its children's busy time."""
    iv = intervals(trace) if iv is None else iv
    s = trace.scopes
    anc, idx = ancestor_pairs(s.parent, iv.owner, strict=True)
    below = union_by_group(anc, iv.start_ns[idx], iv.end_ns[idx], len(s))
    return busy_ns(trace, iv) - below


def self_cpu_ns(trace: Trace) -> I64:
    """Per scope, its exclusive CPU time: its CPU window less its children's windows (as
    ``torch.profiler``'s ``key_averages`` counts self CPU time)."""
    s = trace.scopes
    own: I64 = (s.cpu_end_ns - s.cpu_start_ns).astype(np.int64)
    out: I64 = own.copy()
    cpu_work = np.ones(len(s), bool)
    if trace.header.get("source") == "chrome":
        # another tool's kernels are scopes whose CPU window is their launch call's: CPU time
        # that the launch call already counts, so they neither have nor take self CPU time
        cpu_work = s.gpu_start_ns == NO_TIME
        out[~cpu_work] = 0
    child = np.flatnonzero((s.parent >= 0) & cpu_work)
    np.subtract.at(out, s.parent[child], own[child])
    return out


def submission_ns(trace: Trace, iv: Intervals | None = None) -> I64:
    """Per scope, when its GPU work was submitted: the submission of the first GPU interval of its
    subtree (by GPU start; for operations, that launch call's start), or the scope's own
    submission where it has none. ``NO_TIME`` without GPU work."""
    return first_submission_ns(trace.scopes, intervals(trace) if iv is None else iv)


def first_submission_ns(s: ScopeTable, iv: Intervals) -> I64:
    """``submission_ns`` over the tables (the resolver calls it before a ``Trace`` exists)."""
    out: I64 = s.submit_ns.copy()
    if iv.source == "scopes":
        return out
    anc, idx = ancestor_pairs(s.parent, iv.owner)
    if not len(anc):
        return out
    order = np.lexsort((iv.start_ns[idx], anc))
    anc, idx = anc[order], idx[order]
    first = np.r_[True, anc[1:] != anc[:-1]]  # each scope's first interval by GPU start (sorted: no unique)
    sub = iv.submit_ns[idx[first]]
    who = anc[first]
    known = sub != NO_TIME
    out[who[known]] = sub[known]
    return np.where(s.gpu_start_ns != NO_TIME, out, NO_TIME)


def with_launch_submissions(trace: Trace) -> Trace:
    """``trace`` with each scope's submission as ``submission_ns`` defines it where it has
    operations: a file written when the submission was the scope's entry reads as today's."""
    if len(trace.ops):
        trace.scopes.submit_ns = submission_ns(trace)
    return trace


def queued_ns(trace: Trace, iv: Intervals | None = None) -> I64:
    """Per scope, GPU start − submission (``NO_TIME`` where either is unknown)."""
    sub = submission_ns(trace, iv)
    g0 = trace.scopes.gpu_start_ns
    ok = (sub != NO_TIME) & (g0 != NO_TIME)
    return np.where(ok, g0 - sub, NO_TIME)


@dataclass(frozen=True)
class Gaps:
    """The idle gaps of every stream, each charged to the interval that ended it."""

    queue: I64
    start_ns: I64
    end_ns: I64
    closer: I64  # row of the interval (in ``Intervals``) whose start ended the gap
    host: npt.NDArray[np.bool_]  # the GPU waited for the host: submitted after the gap opened
    known: npt.NDArray[np.bool_]  # the closing interval's submission is known


def gaps(iv: Intervals) -> Gaps:
    """Idle gaps per stream, classified as HTA 0.5 does: waiting for the host when the work that
    ends the gap was submitted after it opened, else between queued work."""
    e = np.zeros(0, np.int64)
    parts = [(e, e, e, e)]  # (queue, start, end, closer) per stream; no GPU interval: empty columns
    for q in distinct(iv.queue).tolist():
        rows = np.flatnonzero(iv.queue == q)
        # of intervals that start together, the one that ends last (even before its start) opens a block
        rows = rows[np.argsort(-iv.end_ns[rows], kind="stable")]
        st = iv.start_ns[rows]
        b0, b1, first = interval_union(st, np.maximum(iv.end_ns[rows], st))  # gaps lie between blocks
        parts.append((np.full(len(b0) - 1, q, np.int64), b1[:-1], b0[1:], rows[first[1:]]))
    queue, g0, g1, closer = (np.concatenate(x) for x in zip(*parts, strict=True))
    sub = iv.submit_ns[closer]
    known = sub != NO_TIME
    return Gaps(queue, g0, g1, closer, known & (sub > g0), known)


def stream_idle(trace: Trace, iv: Intervals | None = None) -> list[dict[str, Any]]:
    """Per stream: its window (first GPU start to last GPU end), busy (union of its GPU
    intervals), idle = window − busy, split into waiting for the host, between queued work, and
    unknown (the closing work's submission is not known)."""
    iv = intervals(trace) if iv is None else iv
    gp = gaps(iv)
    out = []
    for qi, q in enumerate(trace.queues):
        rows = np.flatnonzero(iv.queue == qi)
        if not len(rows):
            continue
        st = iv.start_ns[rows]
        window = int(np.maximum(iv.end_ns[rows], st).max() - st.min())
        mine = gp.queue == qi
        length = gp.end_ns[mine] - gp.start_ns[mine]
        idle = int(length.sum())  # the window less the union of the intervals: the gaps between its blocks
        host = int(length[gp.host[mine]].sum())
        unknown = int(length[~gp.known[mine]].sum())
        out.append(
            {
                "device": q.device,
                "device_name": q.device_name,
                "queue": q.label,
                "window_ns": window,
                "busy_ns": window - idle,
                "idle_ns": idle,
                "waiting_for_host_ns": host,
                "between_queued_work_ns": idle - host - unknown,
                "unknown_ns": unknown,
                "from": iv.source,
            }
        )
    return out


def host_wait_ns(trace: Trace, iv: Intervals | None = None) -> I64:
    """Per scope, how long its stream sat idle waiting for the host right before work of the
    scope's subtree (the gaps such work ended that were host waits)."""
    iv = intervals(trace) if iv is None else iv
    gp = gaps(iv)
    h = np.flatnonzero(gp.host)
    anc, idx = ancestor_pairs(trace.scopes.parent, iv.owner[gp.closer[h]])
    out = np.zeros(len(trace.scopes), np.int64)
    np.add.at(out, anc, (gp.end_ns - gp.start_ns)[h][idx])
    return out


def launches(trace: Trace, iv: Intervals | None = None) -> I64:
    """Per scope, how many GPU intervals its subtree holds (operations, spans or its own span)."""
    iv = intervals(trace) if iv is None else iv
    anc, _ = ancestor_pairs(trace.scopes.parent, iv.owner)
    return np.bincount(anc, minlength=len(trace.scopes)).astype(np.int64)


# launch-bound and the launch-free estimate --------------------------------------------------------

ADVICE = {
    "cuda": "capture the loop in a CUDA graph (one launch replays all of it), or fuse the kernels; "
    "keep tiny work on the CPU",
    "wgpu": "record more work per command buffer and submit less often (fewer, larger submits), "
    "put more dispatches in one pass; keep tiny work on the CPU",
}
GENERIC_ADVICE = "launch fewer, larger pieces of work; keep tiny work on the CPU"


def trace_backend(trace: Trace) -> str | None:
    """The GPU backend that ran ``trace``'s work ("cuda", "wgpu", …), or None."""
    b = trace.header.get("backend")
    if isinstance(b, str):
        return b
    return trace.queues[0].backend if trace.queues else None


def header_calibration(trace: Trace) -> dict[str, Any] | None:
    """The header's calibration (``gputrace calibrate``) if it holds the launch costs."""
    cal = trace.header.get("calibration")
    if not isinstance(cal, dict):
        return None
    try:
        float(cal["launch_cpu_ns"]), float(cal["launch_gpu_ns"])
    except (KeyError, TypeError, ValueError):
        return None
    return cal


def calibration_for(trace: Trace) -> dict[str, Any] | None:
    """The header's calibration when it was measured on the backend that ran the trace."""
    cal = header_calibration(trace)
    if cal is not None and cal.get("backend") not in (None, trace_backend(trace)):
        return None  # another backend's launch cost says nothing about this one
    return cal


def free_launch_cost(cal: dict[str, Any], backend: str | None) -> tuple[float, str]:
    """The one launch left when launches are made free, and what it is: a CUDA graph launch
    (calibrated ``graph_launch_ns``, else one kernel launch) or one WebGPU submit."""
    if backend == "cuda" and isinstance(cal.get("graph_launch_ns"), (int, float)):
        return float(cal["graph_launch_ns"]), "one CUDA graph launch"
    what = {"cuda": "one launch (no graph launch calibrated)", "wgpu": "one submit"}.get(backend or "")
    return float(cal["launch_cpu_ns"]), what or "one launch"


def launch_bound(busy: I64, n_launches: I64, waited: I64, cal: dict[str, Any]) -> npt.NDArray[np.bool_]:
    """Per row, launch-bound: the work per launch is shorter than one launch (CUDA) or submit
    (WebGPU) costs the CPU (calibrated ``launch_cpu_ns``), and the GPU waited for the host at
    least as long as it worked."""
    per_launch = busy / np.maximum(n_launches, 1)
    return (n_launches > 0) & (busy > 0) & (per_launch < float(cal["launch_cpu_ns"])) & (waited >= busy)


def launch_free_ns(trace: Trace, iv: Intervals | None = None) -> tuple[I64, npt.NDArray[np.bool_]]:
    """Per scope, what its GPU work would take if its launches were free: its busy time plus the
    one launch left (``free_launch_cost``), where the GPU waited for the host at least as long as
    it worked and that estimate is below the measured span. Returns (estimate, where it applies);
    nothing applies without a calibration of the trace's backend."""
    n = len(trace.scopes)
    cal = calibration_for(trace)
    if cal is None:
        return np.zeros(n, np.int64), np.zeros(n, bool)
    iv = intervals(trace) if iv is None else iv
    cost, _ = free_launch_cost(cal, trace_backend(trace))
    s = trace.scopes
    busy = busy_ns(trace, iv)
    est = busy + round(cost)
    span = s.gpu_end_ns - s.gpu_start_ns
    ok = (s.gpu_start_ns != NO_TIME) & (busy > 0) & (host_wait_ns(trace, iv) >= busy) & (est < span)
    return est, ok
