"""Builders of traces shared by test modules (so no test module imports another)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gputrace import figures
from gputrace.model import NO_TIME, OpTable, Trace, canonical_names
from tests.test_exporter import record_story


def ops_trace(tmp_path: Path) -> Trace:
    """The session story with per-operation records (where the model has them): kernels and a
    copy per GPU scope, launch calls seen or not, a graph launch running two kernels, a call
    outside every scope, another thread's launch."""
    base = record_story(tmp_path / "story.json")
    s = base.scopes
    rows = np.flatnonzero(s.has_gpu())
    names = [*list(base.names), "k_add", "k_mul", "cudaLaunchKernel", "cuGraphLaunch", "memcpy"]
    idx = {n: i for i, n in enumerate(names)}
    if "" not in idx:
        names.append("")
        idx[""] = len(names) - 1
    recs = []
    for j, r in enumerate(rows.tolist()):
        g0, g1 = int(s.gpu_start_ns[r]), int(s.gpu_end_ns[r])
        c0 = int(s.cpu_start_ns[r]) + 100
        kind = 1 if j % 4 == 3 else 0
        seen = j % 5 != 4
        recs.append((r, kind, idx["memcpy" if kind else "k_add"], int(s.queue[r]), int(s.thread[r]), 1000 + j,
                     c0 if seen else NO_TIME, c0 + 50 if seen else NO_TIME, g0, g1 if j % 7 else g0,
                     4096 * kind, (0, 0, 0) if kind else (256, 1, 1), (0, 0, 0) if kind else (128, 1, 1),
                     0, 0,
                     idx["cudaLaunchKernel"] if seen else idx[""]))  # fmt: skip
        if j == 2:  # a graph launch: two kernels from one call
            for node in (1, 2):
                recs.append((r, 0, idx["k_mul"], int(s.queue[r]), int(s.thread[r]), 5000, c0, c0 + 80,
                             g1 + 10 * node, g1 + 10 * node + 5, 0, (8, 2, 1), (32, 1, 1), 7, node,
                             idx["cuGraphLaunch"]))  # fmt: skip
    r0 = int(rows[0])
    recs.append((-1, 0, idx["k_add"], int(s.queue[r0]), 0, 9000, 10, 20, 30, 40, 0, (1, 1, 1), (1, 1, 1),
                 0, 0, idx["cudaLaunchKernel"]))  # fmt: skip
    recs.sort(key=lambda x: x[8])
    n = len(recs)
    ops = OpTable.empty(n)
    for col, k in (("scope", 0), ("kind", 1), ("name", 2), ("queue", 3), ("thread", 4), ("correlation", 5),
                   ("call_start_ns", 6), ("call_end_ns", 7), ("gpu_start_ns", 8), ("gpu_end_ns", 9),
                   ("bytes", 10), ("graph_id", 13), ("graph_node_id", 14), ("call_name", 15)):  # fmt: skip
        setattr(ops, col, np.array([x[k] for x in recs], getattr(ops, col).dtype))
    ops.grid = np.array([x[11] for x in recs], np.int64)
    ops.block = np.array([x[12] for x in recs], np.int64)
    spans = base.spans
    names = canonical_names(names, s, spans, ops)  # type: ignore[call-arg]
    trace = Trace(base.header, names, base.threads, base.queues, s, spans, base.marks, base.clock_fits, ops)  # type: ignore[call-arg]
    # each scope submitted at its first launch call, as the resolver (and every reader) sets it;
    # a pass submitted with its scope moves with it (the file says nothing of its own submission)
    before = s.submit_ns.copy()
    figures.with_launch_submissions(trace)
    along = spans.submit_ns == before[spans.scope]
    spans.submit_ns[along] = s.submit_ns[spans.scope[along]]
    return trace
