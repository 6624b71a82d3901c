"""The per-rank view of a merged trace: GPU busy per rank, time in collectives, the slowest rank per step.

A scope belongs to the rank whose process recorded it (``header["processes"]``). Collectives are
GPU intervals (the CPU window of a scope without GPU time) named like one (``COLLECTIVE``); steps
are ``ProfilerStep#N`` scopes (matched by N), else the top-level name every rank repeats most
often (matched by occurrence). A step's work is its span minus its time in collectives, and its
slowest rank the one with the most work: the others wait for it. docs/ranks.md states the rules.

>>> import gputrace
>>> with gputrace.session(backend="fake", quiet=True) as s:
...     with gputrace.trace("step"):
...         pass
>>> rank_view(s.trace) is None      # one process: no per-rank view
True
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np

from gputrace.durations import fmt_ns
from gputrace.figures import union_by_group
from gputrace.model import NO_TIME, Trace

COLLECTIVE = re.compile(
    r"^nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast", re.IGNORECASE
)
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
MAX_STEP_ROWS = 50


def rank_view(trace: Trace) -> dict[str, Any] | None:
    """The per-rank view of a merged trace, or ``None`` for a trace of one process."""
    procs = trace.header.get("processes")
    if not isinstance(procs, list) or len(procs) < 2:
        return None
    tid_proc = {int(t): k for k, p in enumerate(procs) for t in p.get("tids") or []}
    thread_proc = np.array([tid_proc.get(th.tid, -1) for th in trace.threads] or [-1], np.int64)
    s, sp = trace.scopes, trace.spans
    scope_proc = thread_proc[s.thread]
    # every GPU interval: (owning scope row, start, end, name); a collective scope without GPU
    # time (a CPU-only trace, a blocking CPU collective) counts by its CPU window, as collective only
    is_coll = np.array([bool(COLLECTIVE.search(n)) for n in trace.names] or [False], bool)
    has_gpu = s.gpu_start_ns != NO_TIME
    g_scope = np.flatnonzero(has_gpu)
    c_scope = np.flatnonzero(~has_gpu & is_coll[s.name])
    rows = np.concatenate([g_scope, sp.scope, c_scope]).astype(np.int64)
    g0 = np.concatenate([s.gpu_start_ns[g_scope], sp.gpu_start_ns, s.cpu_start_ns[c_scope]]).astype(np.int64)
    g1 = np.concatenate([s.gpu_end_ns[g_scope], sp.gpu_end_ns, s.cpu_end_ns[c_scope]]).astype(np.int64)
    coll = np.concatenate([is_coll[s.name[g_scope]], is_coll[sp.label], np.ones(len(c_scope), bool)])
    on_gpu = np.concatenate([np.ones(len(g_scope) + len(sp), bool), np.zeros(len(c_scope), bool)])
    g_proc = scope_proc[rows]
    n, known = len(procs), g_proc >= 0
    busy = union_by_group(g_proc[known & on_gpu], g0[known & on_gpu], g1[known & on_gpu], n)
    in_coll = union_by_group(g_proc[known & coll], g0[known & coll], g1[known & coll], n)
    scopes = np.bincount(scope_proc[scope_proc >= 0], minlength=n)
    start, end = trace.header.get("start_ns"), trace.header.get("end_ns")
    window = int(end) - int(start) if isinstance(start, int) and isinstance(end, int) else 0
    merged = trace.header.get("merged") or []
    out_ranks = []
    for k, p in enumerate(procs):
        off = merged[k].get("offset") if k < len(merged) and isinstance(merged[k], dict) else None
        out_ranks.append({
            "rank": p.get("rank"), "label": p.get("label"), "scopes": int(scopes[k]),
            "gpu_busy_ns": int(busy[k]), "collective_ns": int(in_coll[k]),
            "placed_by": (off or {}).get("method"), "uncertainty_ns": (off or {}).get("uncertainty_ns"),
            "gpu_busy_share": int(busy[k]) / window if window > 0 else None,
        })  # fmt: skip
    return {
        "ranks": out_ranks,
        "window_ns": window,
        "steps": _steps(trace, procs, scope_proc, rows, g1, g0, coll),
        "rule": "slowest rank of a step: the most work (step span minus time in collectives)",
    }


def _steps(
    trace: Trace, procs: list[Any], scope_proc: np.ndarray, rows: np.ndarray,
    g1: np.ndarray, g0: np.ndarray, coll: np.ndarray,
) -> dict[str, Any] | None:  # fmt: skip
    s = trace.scopes
    n = len(procs)
    keyed: dict[int, dict[Any, int]] = {k: {} for k in range(n)}  # proc -> step key -> scope row
    prof = {i: int(m.group(1)) for i, name in enumerate(trace.names) if (m := PROFILER_STEP.match(name))}
    if prof:  # name id -> N
        step_name = "ProfilerStep#N"
        for row in np.flatnonzero(np.isin(s.name, list(prof))).tolist():
            if scope_proc[row] >= 0:  # (a thread no process lists belongs to no rank)
                keyed[int(scope_proc[row])].setdefault(prof[int(s.name[row])], row)
    else:
        top = s.depth == 0
        per_proc = [Counter(s.name[top & (scope_proc == k)].tolist()) for k in range(n)]
        common = set.intersection(*(set(c) for c in per_proc))
        candidates = [(least, i) for i in common if (least := min(c[i] for c in per_proc)) >= 2]
        if not candidates:
            return None
        _, name_id = max(candidates, key=lambda c: (c[0], -c[1]))
        step_name = trace.names[name_id]
        for k in range(n):  # the j-th such scope of each rank
            keyed[k] = dict(enumerate(np.flatnonzero(top & (scope_proc == k) & (s.name == name_id)).tolist()))
    keys = sorted(set.intersection(*(set(v) for v in keyed.values())))
    if not keys:
        return None
    out_rows = []
    slowest: Counter[Any] = Counter()
    for key in keys:
        per_rank = []
        for k in range(n):
            row = keyed[k][key]
            t0, t1 = int(s.cpu_start_ns[row]), int(s.cpu_end_ns[row])
            inside = np.flatnonzero(
                (s.thread == s.thread[row]) & (s.cpu_start_ns >= t0) & (s.cpu_start_ns <= t1)
            )
            mine = np.isin(rows, inside)
            end = max(t1, int(g1[mine].max())) if mine.any() else t1
            mc = np.flatnonzero(mine & coll)
            c = int(union_by_group(np.zeros(len(mc), np.int64), g0[mc], g1[mc], 1)[0])
            per_rank.append({"rank": procs[k].get("rank"), "span_ns": end - t0, "collective_ns": c,
                             "work_ns": end - t0 - c})  # fmt: skip
        work = [r["work_ns"] for r in per_rank]
        worst = per_rank[int(np.argmax(work))]["rank"]
        slowest[worst] += 1
        lead = sorted(work)[-1] - sorted(work)[-2]
        out_rows.append({"step": key, "slowest_rank": worst, "lead_ns": lead, "ranks": per_rank})
    return {
        "name": step_name,
        "count": len(keys),
        "slowest_counts": {str(r): c for r, c in slowest.most_common()},
        "rows": out_rows[:MAX_STEP_ROWS],
    }


def lines(view: dict[str, Any]) -> list[str]:
    """The view as text lines for the summary table."""
    out = []
    for r in view["ranks"]:
        share = f" ({r['gpu_busy_share']:.0%})" if r.get("gpu_busy_share") is not None else ""
        placed = r.get("placed_by") or "?"
        if r.get("uncertainty_ns") is not None:
            placed += f" ±{fmt_ns(r['uncertainty_ns'])}"
        out.append(f"{r['label']}: GPU busy {fmt_ns(r['gpu_busy_ns'])}{share}, in collectives "
                   f"{fmt_ns(r['collective_ns'])}, {r['scopes']} scopes; placed by {placed}")  # fmt: skip
    st = view.get("steps")
    if st is None:
        out.append("steps: none found (no ProfilerStep#N, no top-level scope every rank repeats).")
        return out
    counts = ", ".join(f"rank {r} in {c}" for r, c in st["slowest_counts"].items())
    out.append(f"slowest rank per step ({st['name']}, {st['count']} steps): {counts}; {view['rule']}")
    for row in st["rows"][:10]:
        works = " · ".join(f"r{x['rank']} {fmt_ns(x['work_ns'])}" for x in row["ranks"])
        out.append(f"    step {row['step']}: slowest rank {row['slowest_rank']} "
                   f"(+{fmt_ns(row['lead_ns'])}); work {works}")  # fmt: skip
    return out
