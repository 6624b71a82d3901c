"""The format-neutral plan of a trace file: where each scope, wait and operation is drawn.

Both writers follow it (``chrome`` for JSON, ``pftrace`` from the same events), so the two
formats draw the same tracks and carry the same args:
- each traced process (pid = its OS pid) has a thread track per Python thread; each GPU is a
  process (pid = ``GPU_PID_BASE + device``) with a track per stream/queue (tid = queue + 1) and
  an operations track per stream (tid = ``OP_TID_BASE + queue``) where the trace has operations;
- slices that would partially overlap on one track move to an overflow lane of it
  (tid + n · ``OVERLAP_TID_STEP``, named "(overlap n)"): ``LaneCarry``;
- times are relative to ``export_base_ns`` (never negative); the header is ``file_header``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace.model import FORMAT_VERSION, NO_TIME, QueueInfo, Trace

GPU_PID_BASE = 1 << 30  # GPU "processes"; real pids stay below 2**22 on Linux
OVERLAP_TID_STEP = 1 << 24  # overflow lane n of a track: tid + n·step (Linux tids stay below 2**22)
EXAMPLES_IN_HEADER = 20  # anomaly examples kept in the file's header (counts stay exact)
OP_TID_BASE = 1 << 20  # a stream's operations track: OP_TID_BASE + queue (+ overflow lanes)
OP_FLOW_BASE = 1 << 40  # flow ids of launch call -> operation, apart from the scope flows
OP_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # PyTorch's categories, which HTA reads


def stream_number(label: str, queue: int) -> int:
    """The stream id a queue label names ("stream 7" -> 7), else the queue index."""
    head, _, num = label.rpartition(" ")
    return int(num) if head == "stream" and num.isdigit() else queue


# an operation more than this far from the file's zero is not on its time line (never aligned)
MAX_OP_NS = 10**15


def export_base_ns(trace: Trace) -> int:
    """The zero of the file's time axis: session start, or anything earlier (no negative ts)."""
    s = trace.scopes
    base = int(trace.header.get("start_ns", trace.header["base_ns"]))
    cands = [base]
    for col in (s.cpu_start_ns, s.submit_ns, s.gpu_start_ns, s.gpu_end_ns):
        v = col[col != NO_TIME]
        if len(v):
            cands.append(int(v.min()))
    if len(trace.spans):
        cands.append(int(trace.spans.gpu_start_ns.min()))
        cands.append(int(trace.spans.gpu_end_ns.min()))
    cands.extend(m.ts_ns for m in trace.marks[:1])
    return min(cands)


class LaneCarry:
    """Lanes of a file's tracks, so each lane holds only nested or disjoint slices; for GPU tracks
    kept across a streamed file's chunks (a fresh one serves a single batch, e.g. interleaved
    coroutines on one CPU thread).

    Each lane holds the slices still open at the end of the last chunk, as (start, end): a slice
    of a later chunk never partially overlaps one already written on its track. Across a chunk
    boundary the clock fit changes (each chunk uses the fit known when it was written), which can
    move back-to-back GPU work written in two chunks into a partial overlap of tens of ns.
    """

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], list[list[tuple[int, int]]]] = {}

    def lanes(
        self, key: tuple[str, int], st: npt.NDArray[np.int64], en: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """Lane per slice [st, en) (en >= st) of one track: nested or disjoint within a lane."""
        n = len(st)
        out = np.zeros(n, np.int64)
        stacks = self.open.setdefault(key, [])
        if not n:
            return out
        order = np.lexsort((-en, st))
        ss, ee = st[order], en[order]
        first = int(ss[0])
        for stack in stacks:
            while stack and stack[-1][1] <= first:
                stack.pop()
        if not any(stacks) and (n < 2 or (ss[1:] >= np.maximum.accumulate(ee)[:-1]).all()):
            # the usual case: an in-order queue, nothing earlier still open
            if not stacks:
                stacks.append([])
            stacks[0].append((int(ss[-1]), int(ee[-1])))
            return out
        sl, el = ss.tolist(), ee.tolist()
        for j, i in enumerate(order.tolist()):
            a, b = sl[j], el[j]
            for li, stack in enumerate(stacks):
                while stack and stack[-1][1] <= a:
                    stack.pop()
                if not stack or (stack[-1][0] <= a and stack[-1][1] >= b):
                    stack.append((a, b))
                    out[i] = li
                    break
            else:
                stacks.append([(a, b)])
                out[i] = len(stacks) - 1
        return out


def queue_dict(q: QueueInfo) -> dict[str, Any]:
    return {"device": q.device, "device_name": q.device_name, "backend": q.backend, "label": q.label}


def fold_passes(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A scope whose one pass is its whole GPU slice (same start, end, submission and queue: a
    wgpu scope with one timed pass) has that pass written as an argument of its GPU slice
    (``pass``: the label) rather than as a second slice of the same extent.

    ``rows``: the scopes with a GPU slice, ascending. Returns, per row of ``rows``, the folded
    pass's label (-1: none), and the spans still written as pass slices (in scope order)."""
    sp, s = trace.spans, trace.scopes
    label = np.full(len(rows), -1, np.int64)
    if not len(sp) or not len(rows):
        return label, np.zeros(0, np.int64)
    unlabelled = trace.names.index("") if "" in trace.names else -1
    k = np.flatnonzero(sp.label != unlabelled)
    k = k[np.argsort(sp.scope[k], kind="stable")]
    pos = np.searchsorted(rows, sp.scope[k])
    ok = (pos < len(rows)) & (rows[np.minimum(pos, len(rows) - 1)] == sp.scope[k])
    k, pos = k[ok], pos[ok]
    r = rows[pos]
    same = (
        (np.bincount(pos, minlength=len(rows))[pos] == 1)
        & (sp.gpu_start_ns[k] == s.gpu_start_ns[r])
        & (sp.gpu_end_ns[k] == s.gpu_end_ns[r])
        & (sp.submit_ns[k] == s.submit_ns[r])
        & (sp.queue[k] == s.queue[r])
    )
    label[pos[same]] = sp.label[k[same]]
    return label, k[~same]


def capped_header(header: dict[str, Any]) -> dict[str, Any]:
    """The header as written: anomaly counts stay exact, examples are capped at
    ``EXAMPLES_IN_HEADER`` (each flagged slice carries its own flags; a reader that wants every
    example rebuilds the list from them)."""
    out = dict(header)
    an = out.get("anomalies")
    if isinstance(an, dict) and isinstance(an.get("items"), list) and len(an["items"]) > EXAMPLES_IN_HEADER:
        items = an["items"]
        extra = int(an.get("truncated", 0)) + len(items) - EXAMPLES_IN_HEADER
        out["anomalies"] = dict(an, items=items[:EXAMPLES_IN_HEADER], truncated=extra)
    return out


def file_header(trace: Trace, base_ns: int | None = None) -> dict[str, Any]:
    """The header written beside ``trace``'s events: its own, with the threads and queues listed."""
    header = dict(trace.header, format_version=FORMAT_VERSION)  # as written now, whatever it was read from
    header["base_ns"] = export_base_ns(trace) if base_ns is None else base_ns
    header["threads"] = [{"tid": t.tid, "name": t.name} for t in trace.threads]
    header["queues"] = [queue_dict(q) for q in trace.queues]
    return capped_header(header)


def process_label(rank: Any, host: Any, pid: int, pid_is_real: bool) -> str:
    parts = []
    if rank is not None:
        parts.append(f"rank {rank}")
    if host:
        parts.append(str(host))
    if not parts:
        return f"python {pid}"
    label = " · ".join(parts)
    return f"{label} (pid {pid})" if pid_is_real and pid else label
