"""Flagging: what in a resolved recording is suspicious, and what each flag means. A flag explains,
it never clamps: every flagged value stays as measured. ``flag`` sets the flags after the resolver
placed GPU times; ``anomaly_report`` writes the header's ``anomalies`` (also for other tools' and
merged traces, with ``flag_outliers``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gputrace.model import ANOMALY_FLAGS, FLAG_NAMES, NO_TIME, Flag, ScopeTable, Trace, flag_names
from gputrace.npstats import ended_before, median
from gputrace.records import RawRecording

# Outliers: |x − median| > max(OUTLIER_SIGMAS · 1.4826 · MAD, OUTLIER_MIN_REL · median)
OUTLIER_SIGMAS = 5.0
OUTLIER_MIN_REL = 0.10
OUTLIER_MIN_CALLS = 5
MAX_ANOMALY_ITEMS = 1000


def flag(
    raw: RawRecording,
    s: ScopeTable,
    tokens: np.ndarray,
    done_by: np.ndarray | None,
    blind: np.ndarray | None = None,
) -> None:
    """Set every scope's flags in place (``s.flags``). ``blind``: per scope, True where a source
    that observes every scope (CUPTI) could not see it (another tool held it): untimed, not empty."""
    if not len(s):
        return
    flags = s.flags.astype(np.int64)
    has_gpu = s.gpu_start_ns != NO_TIME
    timed = np.ones(len(s), bool) if raw.ops_timing else tokens > 0
    if blind is not None:
        flags[blind & ~has_gpu] |= int(Flag.UNTIMED)
    # untimed / degraded reported by the backend
    if raw.untimed:
        flags[np.isin(tokens, np.fromiter(raw.untimed, np.int64))] |= int(Flag.UNTIMED)
    if raw.degraded:
        for row in np.flatnonzero(np.isin(tokens, np.fromiter(raw.degraded, np.int64))).tolist():
            flags[row] |= int(Flag.DEGRADED)
            s.args.setdefault(row, {})["degraded"] = raw.degraded[int(tokens[row])]
    untimed = (flags & int(Flag.UNTIMED)) != 0
    # cold: the first call of each name
    _, first = np.unique(s.name, return_index=True)
    flags[first] |= int(Flag.COLD)
    # empty: a timed scope with no GPU work, or a GPU span no longer than the backend's floor
    gpu_dur = np.where(has_gpu, s.gpu_end_ns - s.gpu_start_ns, 0)
    empty = timed & ~untimed & (~has_gpu | (gpu_dur <= raw.empty_span_ns))
    if raw.spans_cover_children:
        empty &= ~has_gpu  # scopes without any pass are empty; a pass always holds work
    empty &= (flags & int(Flag.DEGRADED)) == 0
    if raw.problem:  # GPU times were lost, not absent: say so instead of "nothing launched"
        for row in np.flatnonzero(empty).tolist():
            flags[row] |= int(Flag.DEGRADED)
            s.args.setdefault(row, {})["degraded"] = raw.problem
    else:
        flags[empty] |= int(Flag.EMPTY)
    if has_gpu.any():
        g = np.flatnonzero(has_gpu)
        if done_by is not None:  # impossible: the GPU took longer than submission to completion
            flags[g[gpu_dur[g] > done_by[g] - s.submit_ns[g]]] |= int(Flag.GPU_EXCEEDS_WALL)
        flags[g[s.gpu_start_ns[g] < s.submit_ns[g] - s.uncertainty_ns[g]]] |= int(Flag.START_BEFORE_SUBMIT)
        flag_overlaps(s, g, flags)
    flag_outliers(s, has_gpu, flags)
    s.flags = flags.astype(np.uint32)


def flag_overlaps(s: ScopeTable, g: np.ndarray, flags: np.ndarray) -> None:
    """Spans on one in-order queue must nest or follow each other; partial overlaps are flagged."""
    rows = g[np.lexsort((-s.gpu_end_ns[g], s.gpu_start_ns[g], s.queue[g]))]
    if len(rows) < 2:
        return
    q, st, en = s.queue[rows], s.gpu_start_ns[rows], s.gpu_end_ns[rows]
    # No walk when each span starts after every earlier one of its queue ended (``before``: their
    # latest end), or lies inside the one before it: then nothing overlaps.
    before = ended_before(en, np.flatnonzero(np.diff(q, prepend=q[0] - 1) != 0).tolist(), NO_TIME)
    inside = np.zeros(len(rows), bool)
    inside[1:] = (q[1:] == q[:-1]) & (en[:-1] > st[1:]) & (en[1:] <= en[:-1])
    if np.all(inside | (before <= st)):
        return
    starts, ends = s.gpu_start_ns.tolist(), s.gpu_end_ns.tolist()
    stack: list[int] = []
    cur_q = None
    for row, qq in zip(rows.tolist(), q.tolist(), strict=True):
        if qq != cur_q:
            stack, cur_q = [], qq
        while stack and ends[stack[-1]] <= starts[row]:
            stack.pop()
        if stack and ends[row] > ends[stack[-1]]:
            flags[row] |= int(Flag.OVERLAP)
            flags[stack[-1]] |= int(Flag.OVERLAP)
            continue  # keep the stack as it was: the overlapping span is not nested
        stack.append(row)


def flag_outliers(s: ScopeTable, has_gpu: np.ndarray, flags: np.ndarray) -> None:
    """Per name, excluding the cold call: GPU duration (else CPU duration) far from the median."""
    dur = np.where(has_gpu, s.gpu_end_ns - s.gpu_start_ns, s.cpu_end_ns - s.cpu_start_ns)
    warm_rows = np.flatnonzero((flags & int(Flag.COLD)) == 0)
    # the warm rows of each name, in row order: one sort instead of a pass per name
    by_name = warm_rows[np.argsort(s.name[warm_rows], kind="stable")]
    _, first, counts = np.unique(s.name[by_name], return_index=True, return_counts=True)
    for a, c in zip(first.tolist(), counts.tolist(), strict=True):
        if c < OUTLIER_MIN_CALLS:
            continue
        rows = by_name[a : a + c]
        # compare like with like: GPU times only with GPU times
        gpu_rows = rows[has_gpu[rows]]
        rows = gpu_rows if len(gpu_rows) >= OUTLIER_MIN_CALLS else rows[~has_gpu[rows]]
        if len(rows) < OUTLIER_MIN_CALLS:
            continue
        x = dur[rows].astype(np.float64)
        med = median(x)
        mad = median(np.abs(x - med))
        limit = max(OUTLIER_SIGMAS * 1.4826 * mad, OUTLIER_MIN_REL * abs(med))
        flags[rows[np.abs(x - med) > limit]] |= int(Flag.OUTLIER)


EXPLAIN = {
    "empty_gpu_span": "no GPU work ran inside this scope: nothing was launched, or it was never "
    "flushed/submitted",
    "gpu_exceeds_wall": "the GPU duration is longer than the wall time from submission to completion: "
    "clock skew or a bad timestamp",
    "start_before_submit": "the GPU started before the CPU submitted the work, beyond the alignment "
    "uncertainty: clock skew",
    "overlap": "two spans on one in-order queue partially overlap: timestamps from overlapping passes "
    "or a clock glitch",
    "outlier": "far from the other calls of this name: contention, a clock change, or different work",
    "degraded": "gputrace failed while recording this scope; its times may be partial",
}


def flag_counts(flags: np.ndarray) -> dict[str, int]:
    """How many scopes carry each flag (flags no scope carries left out)."""
    counts = {name: int(np.count_nonzero(flags & int(bit))) for bit, name in FLAG_NAMES.items()}
    return {name: c for name, c in counts.items() if c}


def anomaly_report(trace: Trace) -> dict[str, Any]:
    """Counts per flag and the first ``MAX_ANOMALY_ITEMS`` anomalous scopes, with their numbers."""
    s = trace.scopes
    counts = flag_counts(s.flags)
    rows = np.flatnonzero(s.flags & int(ANOMALY_FLAGS))
    shown = rows[:MAX_ANOMALY_ITEMS]
    names = trace.names
    items = []
    cols = ("name", "flags", "cpu_start_ns", "cpu_end_ns", "submit_ns", "gpu_start_ns", "gpu_end_ns")
    rows_of = [getattr(s, c)[shown].tolist() for c in (*cols, "uncertainty_ns")]
    for row, name, flags, start, end, submit, g0, g1, unc in zip(shown.tolist(), *rows_of, strict=True):
        kinds = [k for k in flag_names(flags) if k in EXPLAIN]
        has_gpu = g0 != NO_TIME and g1 != NO_TIME
        items.append(
            {
                "scope": row,
                "name": names[name],
                "kinds": kinds,
                "cpu_start_ns": start,
                "cpu_ns": end - start,
                "gpu_ns": g1 - g0 if has_gpu else None,
                "queue_gap_ns": g0 - submit if g0 != NO_TIME and submit != NO_TIME else None,
                "uncertainty_ns": unc,
                "explain": [EXPLAIN[k] for k in kinds],
            }
        )
    return {"counts": counts, "items": items, "truncated": max(0, len(rows) - MAX_ANOMALY_ITEMS)}
