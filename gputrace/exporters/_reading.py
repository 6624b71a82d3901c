"""What the readers of every format share: the span table of a trace read back, and whether its
scopes nest at all.

A file holds a GPU pass as its own event, or, where it is its scope's whole GPU slice, folded into
that slice (``args.pass`` in JSON, a ``pass`` annotation in ``.pftrace``). Either way the model
gets one span per pass, plus, where spans do not merely hull passes (cuda), one scope-level span
per GPU scope that has no pass of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from gputrace.model import NO_TIME, ScopeTable, SpanTable
from gputrace.npstats import distinct

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
# a format's passes as columns: scope row, label id, GPU start, GPU end, submission
Passes = tuple[I64, I32, I64, I64, I64]


def with_folded(s: ScopeTable, passes: Passes, fold_rows: I64, fold_labels: I32) -> Passes:
    """``passes`` and the folded ones: a folded pass has its scope's GPU times and submission."""
    if not len(fold_rows):
        return passes
    rows, label, g0, g1, sub = passes
    return (
        np.concatenate([rows, fold_rows]).astype(np.int64),
        np.concatenate([label, fold_labels]).astype(np.int32),
        np.concatenate([g0, s.gpu_start_ns[fold_rows]]),
        np.concatenate([g1, s.gpu_end_ns[fold_rows]]),
        np.concatenate([sub, s.submit_ns[fold_rows]]),
    )


def span_table(
    s: ScopeTable, passes: Passes, covers_children: bool, unlabelled: Callable[[], int]
) -> SpanTable:
    """The spans: every pass, then a scope-level span for each GPU scope without a pass (none
    where spans only hull passes: ``covers_children``), labelled ``unlabelled()``; sorted by
    scope, GPU start and end."""
    rows, label, g0, g1, sub = passes
    with_pass = np.zeros(len(s), bool)
    with_pass[rows] = True
    unl = rows[:0] if covers_children else np.flatnonzero((s.gpu_start_ns != NO_TIME) & ~with_pass)
    unl_label = unlabelled() if len(unl) else 0
    sc = np.concatenate([rows, unl]).astype(np.int64)
    g0 = np.concatenate([g0, s.gpu_start_ns[unl]])
    g1 = np.concatenate([g1, s.gpu_end_ns[unl]])
    if len(rows):
        order: npt.NDArray[np.intp] | slice = np.lexsort((g1, g0, sc))
    else:  # scope-level spans only: one per scope, already in scope order
        order = slice(None)
    return SpanTable(
        scope=sc[order],
        label=np.concatenate([label, np.full(len(unl), unl_label, np.int32)])[order].astype(np.int32),
        queue=s.queue[sc][order].astype(np.int32),
        submit_ns=np.concatenate([sub, s.submit_ns[unl]])[order].astype(np.int64),
        gpu_start_ns=g0[order].astype(np.int64),
        gpu_end_ns=g1[order].astype(np.int64),
    )


def no_nesting(s: ScopeTable) -> bool:
    """True when no scope starts before an earlier scope of its thread has ended (no parents)."""
    for th in distinct(s.thread).tolist():
        rows = np.flatnonzero(s.thread == th)
        ends = np.maximum.accumulate(s.cpu_end_ns[rows])
        if (s.cpu_start_ns[rows][1:] < ends[:-1]).any():
            return False
    return True
