"""Chrome/Perfetto JSON exporter.

Layout (see docs/trace-format.md):
- the traced process (pid = its OS pid): one thread track per Python thread, a ``cat: "cpu"`` X
  slice per scope spanning its CPU enqueue window;
- one process per GPU (pid = ``GPU_PID_BASE + device``), a thread track per stream/queue with a
  ``cat: "gpu"`` X slice per scope (and, for wgpu, one child slice per pass);
- the submission → GPU start wait as async ``b``/``e`` events named "queued · <stream>", so
  overlapping waits on one stream stack instead of being dropped;
- a v1 flow (``s`` inside the CPU slice, ``f`` with ``"bp": "e"`` inside the GPU slice, id = scope
  index) from each scope to its GPU slice;
- a queue-depth counter per stream; instants for syncs, marks and anomalies.

Times are µs relative to ``header["base_ns"]`` (exact ns as ≤ 3 decimals). Slices that would
partially overlap on one track move to an extra track named "(overlap n)".
"""

from __future__ import annotations

import contextlib
import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gputrace.model import ANOMALY_FLAGS, NO_TIME, Trace, flag_names

GPU_PID_BASE = 1 << 30  # GPU "processes"; real pids stay below 2**22 on Linux
OVERLAP_TID_STEP = 1 << 24  # overflow lane n of a track: tid + n·step (Linux tids stay below 2**22)


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
    if len(trace.ops):
        seen = trace.ops.call_start_ns[trace.ops.call_start_ns != NO_TIME]
        cands.extend(int(c.min()) for c in (trace.ops.gpu_start_ns, seen) if len(c))
    return min(cands)


def _us(ns: np.ndarray, base: int) -> list[float]:
    return ((ns - base) / 1000.0).tolist()  # type: ignore[no-any-return]


def _lanes(starts: list[int], ends: list[int], order: list[int]) -> list[int]:
    """Lane per interval so each lane only holds nested or disjoint intervals."""
    lanes = [0] * len(starts)
    stacks: list[list[int]] = []
    for i in order:
        st, en = starts[i], ends[i]
        for li, stack in enumerate(stacks):
            while stack and ends[stack[-1]] <= st:
                stack.pop()
            if not stack or ends[stack[-1]] >= en:
                stack.append(i)
                lanes[i] = li
                break
        else:
            stacks.append([i])
            lanes[i] = len(stacks) - 1
    return lanes


def to_events(trace: Trace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The trace as Chrome trace events plus the header to write beside them."""
    s = trace.scopes
    header = dict(trace.header)
    base = export_base_ns(trace)
    header["base_ns"] = base
    header["threads"] = [{"tid": t.tid, "name": t.name} for t in trace.threads]
    header["queues"] = [
        {"device": q.device, "device_name": q.device_name, "backend": q.backend, "label": q.label}
        for q in trace.queues
    ]
    pid = int(header.get("pid") or 1)
    names = trace.names
    ev: list[dict[str, Any]] = []
    # -- metadata
    label = f"python {pid}" if header.get("rank") is None else f"python {pid} (rank {header['rank']})"
    ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
    ev.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": 0}})
    for t in trace.threads:
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": t.tid, "args": {"name": t.name}})

    n = len(s)
    tids = [trace.threads[i].tid for i in range(len(trace.threads))]
    cpu_tid = [tids[i] for i in s.thread.tolist()] if n else []
    # CPU tracks: properly nested by construction; interleaved coroutines may partially overlap
    bad = (s.parent >= 0) & (s.cpu_end_ns > s.cpu_end_ns[np.maximum(s.parent, 0)]) if n else np.zeros(0, bool)
    if bad.any():
        for th in np.unique(s.thread[bad]).tolist():
            rows = np.flatnonzero(s.thread == th)
            lanes = _lanes(s.cpu_start_ns[rows].tolist(), s.cpu_end_ns[rows].tolist(), list(range(len(rows))))
            for r, ln in zip(rows.tolist(), lanes, strict=True):
                if ln:
                    cpu_tid[r] = tids[th] + ln * OVERLAP_TID_STEP
            for ln in range(1, max(lanes) + 1):
                ev.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": tids[th] + ln * OVERLAP_TID_STEP,
                        "args": {"name": f"{trace.threads[th].name} (overlap {ln})"},
                    }
                )
    ts = _us(s.cpu_start_ns, base)
    dur = ((s.cpu_end_ns - s.cpu_start_ns) / 1000.0).tolist()
    name_str = [names[i] for i in s.name.tolist()]
    first = len(ev)
    ev.extend(
        [
            {"ph": "X", "cat": "cpu", "name": nm, "pid": pid, "tid": tid, "ts": t0, "dur": d}
            for nm, tid, t0, d in zip(name_str, cpu_tid, ts, dur, strict=True)
        ]
    )
    for i in sorted(set(s.args) | set(np.flatnonzero(s.flags).tolist())):
        ev[first + i]["args"] = _cpu_args(s.args.get(i), int(s.flags[i]))
    has_gpu = s.gpu_start_ns != NO_TIME

    _gpu_events(trace, base, pid, cpu_tid, name_str, has_gpu, ev)
    if len(trace.ops):
        _op_events(trace, base, pid, cpu_tid, ev)

    # -- instants: marks and syncs on their thread
    for m in trace.marks:
        e = {
            "ph": "i",
            "s": "t",
            "cat": m.kind,
            "name": m.name,
            "pid": pid,
            "tid": tids[m.thread],
            "ts": (m.ts_ns - base) / 1000.0,
        }
        if m.args:
            e["args"] = dict(m.args)
        ev.append(e)
    return ev, header


def _cpu_args(a: dict[str, Any] | None, flags: int) -> dict[str, Any]:
    out = dict(a) if a else {}
    if flags:
        out["flags"] = flag_names(flags)
    return out


def _gpu_events(
    trace: Trace,
    base: int,
    pid: int,
    cpu_tid: list[int],
    name_str: list[str],
    has_gpu: np.ndarray,
    ev: list[dict[str, Any]],
) -> None:
    s = trace.scopes
    rows = np.flatnonzero(has_gpu)
    if not len(rows) and not trace.queues:
        return
    queues = trace.queues
    devices = sorted({q.device for q in queues})
    for d in devices:
        dname = next((q.device_name for q in queues if q.device == d), "GPU")
        backend = next((q.backend for q in queues if q.device == d), "")
        gpid = GPU_PID_BASE + d
        ev.append(
            {
                "ph": "M",
                "name": "process_name",
                "pid": gpid,
                "tid": 0,
                "args": {"name": f"GPU {d} · {dname} · {backend}"},
            }
        )
        ev.append(
            {
                "ph": "M",
                "name": "process_sort_index",
                "pid": gpid,
                "tid": 0,
                "args": {"sort_index": 1 + d},
            }
        )
    for qi, q in enumerate(queues):
        ev.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": GPU_PID_BASE + q.device,
                "tid": qi + 1,
                "args": {"name": q.label},
            }
        )
    if not len(rows):
        return
    st, en = s.gpu_start_ns.tolist(), s.gpu_end_ns.tolist()
    sub = s.submit_ns.tolist()
    c0, c1 = s.cpu_start_ns.tolist(), s.cpu_end_ns.tolist()
    qcol, flags, unc = s.queue.tolist(), s.flags.tolist(), s.uncertainty_ns.tolist()
    # lanes per queue: a GPU slice that would partially overlap goes to an overflow track
    gtid: dict[int, int] = {}
    for qi in np.unique(s.queue[rows]).tolist():
        qrows = rows[s.queue[rows] == qi].tolist()
        order = sorted(range(len(qrows)), key=lambda k: (st[qrows[k]], -en[qrows[k]]))
        lanes = _lanes([st[r] for r in qrows], [en[r] for r in qrows], order)
        dev = queues[qi].device if qi >= 0 else 0
        for r, ln in zip(qrows, lanes, strict=True):
            gtid[r] = qi + 1 + ln * OVERLAP_TID_STEP
        for ln in range(1, max(lanes) + 1):
            ev.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": GPU_PID_BASE + dev,
                    "tid": qi + 1 + ln * OVERLAP_TID_STEP,
                    "args": {"name": f"{queues[qi].label} (overlap {ln})"},
                }
            )
    # passes (labelled spans) as children of their scope's GPU slice
    sp = trace.spans
    passes: dict[int, list[int]] = {}
    if len(sp):
        unlabelled = trace.names.index("") if "" in trace.names else -1
        for k in np.flatnonzero(sp.label != unlabelled).tolist():
            passes.setdefault(int(sp.scope[k]), []).append(k)
    depth_events: list[tuple[int, int, int, int]] = []  # (ts, +1/-1, queue, order)
    timing = (trace.header.get("backend_info") or {}).get("timing")  # which source timed the GPU
    busy = trace.busy_ns().tolist() if len(trace.ops) else None  # summed operation time per scope
    for r in rows.tolist():
        qi = qcol[r]
        dev = queues[qi].device if 0 <= qi < len(queues) else 0
        gpid = GPU_PID_BASE + dev
        t0 = (st[r] - base) / 1000.0
        gpu_ns = en[r] - st[r]
        gap = st[r] - sub[r] if sub[r] != NO_TIME else None
        a: dict[str, Any] = {
            "scope": r,
            "gpu_us": gpu_ns / 1000.0,
            "cpu_enqueue_us": (c1[r] - c0[r]) / 1000.0,
            "uncertainty_us": unc[r] / 1000.0,
        }
        if gap is not None:
            a["submit_to_start_us"] = gap / 1000.0
            a["submit_ts"] = (sub[r] - base) / 1000.0
        if flags[r]:
            a["flags"] = flag_names(flags[r])
        if timing:
            a["timing"] = timing
        if busy is not None:
            a["gpu_busy_us"] = busy[r] / 1000.0
        ev.append(
            {
                "ph": "X",
                "cat": "gpu",
                "name": name_str[r],
                "pid": gpid,
                "tid": gtid[r],
                "ts": t0,
                "dur": max(gpu_ns, 0) / 1000.0,
                "args": a,
            }
        )
        for k in passes.get(r, []):
            ev.append(
                {
                    "ph": "X",
                    "cat": "gpu.pass",
                    "name": trace.names[int(sp.label[k])],
                    "pid": gpid,
                    "tid": gtid[r],
                    "ts": (int(sp.gpu_start_ns[k]) - base) / 1000.0,
                    "dur": max(int(sp.gpu_end_ns[k] - sp.gpu_start_ns[k]), 0) / 1000.0,
                    "args": {"scope": r, "submit_ts": (int(sp.submit_ns[k]) - base) / 1000.0}
                    if int(sp.submit_ns[k]) != NO_TIME
                    else {"scope": r},
                }
            )
        # flow CPU scope -> GPU slice (source inside the CPU slice, target inside the GPU slice)
        src = sub[r] if sub[r] != NO_TIME and c0[r] <= sub[r] <= c1[r] else c0[r]
        ev.append(
            {
                "ph": "s",
                "cat": "launch",
                "name": "launch",
                "id": r,
                "pid": pid,
                "tid": cpu_tid[r],
                "ts": (src - base) / 1000.0,
            }
        )
        ev.append(
            {
                "ph": "f",
                "bp": "e",
                "cat": "launch",
                "name": "launch",
                "id": r,
                "pid": gpid,
                "tid": gtid[r],
                "ts": t0,
            }
        )
        if gap is not None and gap >= 0:
            qname = f"queued · {queues[qi].label}" if 0 <= qi < len(queues) else "queued"
            qargs = {"scope": r, "name": name_str[r], "submit_to_start_us": gap / 1000.0}
            ev.append(
                {
                    "ph": "b",
                    "cat": "queued",
                    "name": qname,
                    "id": r,
                    "pid": gpid,
                    "tid": qi + 1,
                    "ts": (sub[r] - base) / 1000.0,
                    "args": qargs,
                }
            )
            ev.append(
                {
                    "ph": "e",
                    "cat": "queued",
                    "name": qname,
                    "id": r,
                    "pid": gpid,
                    "tid": qi + 1,
                    "ts": t0,
                }
            )
        if gap is not None:
            depth_events.append((sub[r], 1, qi, r))
            depth_events.append((max(en[r], sub[r]), -1, qi, r))
        if flags[r] & int(ANOMALY_FLAGS):
            ev.append(
                {
                    "ph": "i",
                    "s": "t",
                    "cat": "anomaly",
                    "name": "anomaly: " + ", ".join(k for k in flag_names(flags[r] & int(ANOMALY_FLAGS))),
                    "pid": gpid,
                    "tid": gtid[r],
                    "ts": t0,
                    "args": {"scope": r},
                }
            )
    # queue depth: work submitted but not finished, per stream (top-level scopes only count once)
    depth_events.sort(key=lambda x: (x[0], x[1]))
    depth: dict[int, int] = {}
    parent = s.parent.tolist()
    for t, delta, qi, r in depth_events:
        p = parent[r]
        if p >= 0 and has_gpu[p] and qcol[p] == qi:
            continue  # a nested scope's work is already counted by its parent
        depth[qi] = depth.get(qi, 0) + delta
        dev = queues[qi].device if 0 <= qi < len(queues) else 0
        label = queues[qi].label if 0 <= qi < len(queues) else "queue"
        ev.append(
            {
                "ph": "C",
                "name": f"queue depth · {label}",
                "pid": GPU_PID_BASE + dev,
                "ts": (t - base) / 1000.0,
                "args": {"depth": depth[qi]},
            }
        )


def dumps(trace: Trace) -> bytes:
    events, header = to_events(trace)
    doc: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms", "gputrace": header}
    out = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if len(trace.ops):
        # Holistic Trace Analysis finds the rank with the regex '"rank":\s+(\d+)' (PyTorch writes
        # indented JSON), so this one key keeps its space.
        out = out[:-1] + b',"distributedInfo": {"rank": %d}}' % int(header.get("rank") or 0)
    return out


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as Chrome/Perfetto JSON (gzip when the name ends in ``.gz``)."""
    return write_bytes(dumps(trace), path)


def write_bytes(data: bytes, path: str | os.PathLike[str]) -> Path:
    """Write a serialised trace to ``path``, gzipped when the name ends in ``.gz``."""
    p = Path(path)
    tmp = p.with_name(p.name + ".partial")
    try:
        if p.name.endswith(".gz"):
            with gzip.open(tmp, "wb", compresslevel=5) as f:
                f.write(data)
        else:
            tmp.write_bytes(data)
        tmp.replace(p)  # a crash mid-write never leaves a truncated trace under the real name
    except BaseException:  # a full disk, a directory in the way: no half-written file is left
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return p


# Per-operation events (CUPTI timing) -------------------------------------------------------------
OP_TID_BASE = 1 << 20  # a stream's operations track: OP_TID_BASE + queue (+ overflow lanes)
OP_FLOW_BASE = 1 << 40  # flow ids of launch call -> operation, apart from the scope flows
OP_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # PyTorch's categories, which HTA reads


def stream_number(label: str, queue: int) -> int:
    """The stream id a queue label names ("stream 7" -> 7), else the queue index."""
    head, _, num = label.rpartition(" ")
    return int(num) if head == "stream" and num.isdigit() else queue


def _op_events(trace: Trace, base: int, pid: int, cpu_tid: list[int], ev: list[dict[str, Any]]) -> None:
    """Each operation as a GPU slice on its stream's operations track, its launch call as a CPU
    slice inside its scope (once per call: a graph launch runs many operations), and a flow from
    call to operation; with the fields HTA reads."""
    ops, names, queues = trace.ops, trace.names, trace.queues
    n = len(ops)
    st, en = ops.gpu_start_ns.tolist(), ops.gpu_end_ns.tolist()
    c0, c1 = ops.call_start_ns.tolist(), ops.call_end_ns.tolist()
    scope, qcol, thr = ops.scope.tolist(), ops.queue.tolist(), ops.thread.tolist()
    kinds, corrs = ops.kind.tolist(), ops.correlation.tolist()
    op_names = [names[i] for i in ops.name.tolist()]
    call_names = [names[i] for i in ops.call_name.tolist()]
    grids, blocks, nbytes = ops.grid.tolist(), ops.block.tolist(), ops.bytes.tolist()
    gids, nids = ops.graph_id.tolist(), ops.graph_node_id.tolist()
    sc0, sc1 = trace.scopes.cpu_start_ns.tolist(), trace.scopes.cpu_end_ns.tolist()
    tids = [t.tid for t in trace.threads]
    dev_of = [q.device for q in queues]
    stream_of = [stream_number(q.label, qi) for qi, q in enumerate(queues)]
    op_tid = [0] * n
    by_q: dict[int, list[int]] = {}
    for k, qi in enumerate(qcol):
        by_q.setdefault(qi, []).append(k)
    for qi, rows in sorted(by_q.items()):
        # rows are in GPU start order already; an overlap (concurrent graph branches) gets a lane
        lanes = _lanes([st[k] for k in rows], [en[k] for k in rows], list(range(len(rows))))
        dev = dev_of[qi] if 0 <= qi < len(queues) else 0
        label = queues[qi].label if 0 <= qi < len(queues) else "stream ?"
        for k, ln in zip(rows, lanes, strict=True):
            op_tid[k] = OP_TID_BASE + qi + ln * OVERLAP_TID_STEP
        for ln in range(max(lanes) + 1):
            ev.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": GPU_PID_BASE + dev,
                    "tid": OP_TID_BASE + qi + ln * OVERLAP_TID_STEP,
                    "args": {"name": f"{label} · operations" + (f" (overlap {ln})" if ln else "")},
                }
            )
    rank = int(trace.header.get("rank") or 0)
    calls_done: set[int] = set()
    touch_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for k in range(n):
        qi, kind, corr, r = qcol[k], kinds[k], corrs[k], scope[k]
        known_q = 0 <= qi < len(queues)
        dev = dev_of[qi] if known_q else 0
        stream = stream_of[qi] if known_q else qi
        a: dict[str, Any] = {"op": k, "scope": r, "queue": qi, "device": dev, "stream": stream,
                             "correlation": corr, "External id": r, "rank": rank,
                             "timing": "cupti"}  # fmt: skip
        if kind == 0 or any(grids[k]):
            a["grid"], a["block"] = grids[k], blocks[k]
        if kind != 0 or nbytes[k]:
            a["bytes"] = nbytes[k]
        if gids[k]:
            a["graph id"], a["graph node id"] = gids[k], nids[k]
        seen = c0[k] != NO_TIME
        if seen:
            a["call"] = call_names[k]
            a["call_ts"] = (c0[k] - base) / 1000.0
            a["call_dur_us"] = (c1[k] - c0[k]) / 1000.0
            a["launch_to_start_us"] = (st[k] - c0[k]) / 1000.0
        if thr[k] >= 0:
            a["tid"] = tids[thr[k]]
        t0 = (st[k] - base) / 1000.0
        gpid, gtid = GPU_PID_BASE + dev, op_tid[k]
        ev.append({"ph": "X", "cat": OP_CATS[kind] if 0 <= kind < 3 else "kernel", "name": op_names[k],
                   "pid": gpid, "tid": gtid, "ts": t0, "dur": max(en[k] - st[k], 0) / 1000.0,
                   "args": a})  # fmt: skip
        if not seen or thr[k] < 0:
            continue
        # the launch call, inside its scope's CPU slice (only where it nests: never a partial overlap);
        # no "stream" in its args: HTA tells CPU events from GPU ones by a missing stream
        if r >= 0 and not (sc0[r] <= c0[k] and c1[k] <= sc1[r]):
            continue
        if r < 0 and _touches_a_scope(trace, thr[k], c0[k], c1[k], touch_cache):
            continue
        ctid = cpu_tid[r] if r >= 0 else tids[thr[k]]
        cts = (c0[k] - base) / 1000.0
        if corr not in calls_done:
            calls_done.add(corr)
            call = call_names[k]
            ev.append({"ph": "X", "cat": "cuda_runtime" if call.startswith("cuda") else "cuda_driver",
                       "name": call, "pid": pid, "tid": ctid, "ts": cts,
                       "dur": max(c1[k] - c0[k], 0) / 1000.0,
                       "args": {"correlation": corr, "External id": r}})  # fmt: skip
        ev.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": OP_FLOW_BASE + k, "pid": pid,
                   "tid": ctid, "ts": cts})  # fmt: skip
        ev.append({"ph": "f", "bp": "e", "cat": "ac2g", "name": "ac2g", "id": OP_FLOW_BASE + k,
                   "pid": gpid, "tid": gtid, "ts": t0})  # fmt: skip


def _touches_a_scope(
    trace: Trace, thread: int, c0: int, c1: int, cache: dict[int, tuple[np.ndarray, np.ndarray]]
) -> bool:
    """Whether a scope of ``thread`` overlaps [c0, c1] (a call outside every scope is drawn only
    where it cannot partially overlap one)."""
    got = cache.get(thread)
    if got is None:
        s = trace.scopes
        rows = np.flatnonzero(s.thread == thread)  # in start order
        got = cache[thread] = (s.cpu_start_ns[rows], np.maximum.accumulate(s.cpu_end_ns[rows]))
    starts, max_end = got
    i = int(np.searchsorted(starts, c1, side="right"))
    return i > 0 and int(max_end[i - 1]) >= c0
