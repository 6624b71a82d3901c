"""Chrome/Perfetto trace events for a ``Trace``: the layout every JSON file of gputrace uses.

Layout (see docs/trace-format.md):
- each traced process (pid = its OS pid): one thread track per Python thread, a ``cat: "cpu"`` X
  slice per scope spanning its CPU enqueue window;
- one process per GPU (pid = ``GPU_PID_BASE + device``), a thread track per stream/queue with a
  ``cat: "gpu"`` X slice per scope (and, for wgpu, one child slice per pass);
- the submission → GPU start wait as process-scoped async ``b``/``e`` events (``id2.local``)
  named "queued · <stream>", so they sit inside their GPU process and overlapping waits stack;
- a scope's GPU slice carries its alignment uncertainty (``args.uncertainty_us``) where it differs
  from the previous GPU slice's in the file (readers carry it forward), and its submission time as
  the start of its wait (below);
- a flow from each scope's CPU slice to its GPU slice, flow v2 (``bind_id`` with ``flow_out`` on
  the CPU slice and ``flow_in`` on the GPU slice), which Perfetto binds to exactly those slices;
- a queue-depth counter per stream; instants for syncs, marks and anomalies.

Processes are ordered Python first, then GPUs; in a merged trace each process is named by its rank
and host. Times are µs relative to the file's ``base_ns`` (exact ns as ≤ 3 decimals). Slices that
would partially overlap on one track move to an extra track named "(overlap n)".

``Encoder`` turns a trace into events chunk by chunk (a streaming session appends one chunk per
sync): it numbers scopes across chunks and emits each process/thread/queue name once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gputrace.jsonsafe import dumps
from gputrace.model import ANOMALY_FLAGS, NO_TIME, QueueInfo, ThreadInfo, Trace, flag_names

GPU_PID_BASE = 1 << 30  # GPU "processes"; real pids stay below 2**22 on Linux
OVERLAP_TID_STEP = 1 << 24  # overflow lane n of a track: tid + n·step (Linux tids stay below 2**22)
EXAMPLES_IN_HEADER = 20  # anomaly examples kept in the file's header (counts stay exact)


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


def queue_dict(q: QueueInfo) -> dict[str, Any]:
    return {"device": q.device, "device_name": q.device_name, "backend": q.backend, "label": q.label}


def lean_header(header: dict[str, Any]) -> dict[str, Any]:
    """The header as written: anomaly counts stay exact, examples are capped (the per-scope flags
    in the events carry every anomaly; the reader rebuilds the full list from them)."""
    out = dict(header)
    an = out.get("anomalies")
    if isinstance(an, dict) and isinstance(an.get("items"), list) and len(an["items"]) > EXAMPLES_IN_HEADER:
        items = an["items"]
        out["anomalies"] = dict(
            an,
            items=items[:EXAMPLES_IN_HEADER],
            truncated=int(an.get("truncated", 0)) + len(items) - EXAMPLES_IN_HEADER,
        )
    return out


def file_header(trace: Trace, base_ns: int | None = None) -> dict[str, Any]:
    """The header written beside ``trace``'s events: its own, with the threads and queues listed."""
    header = dict(trace.header)
    header["base_ns"] = export_base_ns(trace) if base_ns is None else base_ns
    header["threads"] = [{"tid": t.tid, "name": t.name} for t in trace.threads]
    header["queues"] = [queue_dict(q) for q in trace.queues]
    return lean_header(header)


class Encoder:
    """Events of one file, appended chunk by chunk; ``header`` is the file's (``base_ns``, pid,
    rank, host, and for a merged trace ``processes``)."""

    def __init__(self, header: dict[str, Any]) -> None:
        self.base = int(header["base_ns"])
        self.pid = int(header.get("pid") or 1)
        self.rank = header.get("rank")
        host = header.get("host")
        self.host = str(host.get("name")) if isinstance(host, dict) and host.get("name") else None
        procs = header.get("processes")
        self.processes: list[dict[str, Any]] = procs if isinstance(procs, list) else []
        self.pid_of_tid: dict[int, int] = {
            int(t) % OVERLAP_TID_STEP: int(p["pid"]) for p in self.processes for t in p.get("tids", [])
        }
        self.proc_of_device: dict[int, dict[str, Any]] = {
            int(d): p for p in self.processes for d in p.get("devices", [])
        }
        self.rows = 0  # scopes written so far: the file-order row of the next scope
        self.has_ops = False  # per-operation events written (the file then names its rank for HTA)
        self.op_rows = 0  # operations written so far (numbers them, and their flows, across chunks)
        self.ops_not_drawn = 0  # operations off the file's time line (before it, or never aligned)
        self.named: set[tuple[int, int]] = set()  # (pid, tid) with a name event; tid 0: process
        self.threads: dict[int, ThreadInfo] = {}
        self.queues: list[QueueInfo] = []

    # -- names ---------------------------------------------------------------------------------
    def _proc_label(self, pid: int) -> str:
        for p in self.processes:
            if int(p["pid"]) == pid:
                return _process_label(p.get("rank"), p.get("host"), pid, bool(p.get("pid_is_real", True)))
        return _process_label(self.rank, self.host, pid, True)

    def _name_process(self, pid: int, ev: list[str]) -> None:
        if (pid, 0) in self.named:
            return
        self.named.add((pid, 0))
        if pid >= GPU_PID_BASE:
            d = pid - GPU_PID_BASE
            q = next((q for q in self.queues if q.device == d), None)
            label = f"GPU {d} · {q.device_name} · {q.backend}" if q else f"GPU {d}"
            owner = self.proc_of_device.get(d)
            if owner is not None:
                label = f"{_process_label(owner.get('rank'), owner.get('host'), 0, False)} · {label}"
            sort = 1 << 16 | d  # GPUs after every Python process
        else:
            label = self._proc_label(pid)
            sort = next((k for k, p in enumerate(self.processes) if int(p["pid"]) == pid), 0)
        ev.append(_j({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}}))
        ev.append(
            _j({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}})
        )

    def _name_thread(self, pid: int, tid: int, name: str, ev: list[str], **extra: Any) -> None:
        if (pid, tid) in self.named:
            return
        self.named.add((pid, tid))
        ev.append(
            _j({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name, **extra}})
        )

    def _cpu_pid(self, tid: int) -> int:
        return self.pid_of_tid.get(tid % OVERLAP_TID_STEP, self.pid)

    # -- events --------------------------------------------------------------------------------
    def events(self, trace: Trace) -> list[dict[str, Any]]:
        """The events of ``trace`` (one chunk) as dicts (``encode`` is what files get)."""
        data = self.encode(trace)
        return list(orjson.loads(b"[" + data + b"]")) if data else []

    def encode(self, trace: Trace) -> bytes:
        """The events of ``trace`` (one chunk), comma-separated JSON; rows are numbered after the
        previous chunks'. Each event is formatted straight into text: the common ones (a scope's
        slices, its wait) from templates, since building a dict per event costs more than the rest."""
        ev: list[str] = []
        s = trace.scopes
        r0 = self.rows
        base = self.base
        for t in trace.threads:
            self.threads.setdefault(t.tid, t)
        # queues: a chunk lists the session's queues so far; keep the longest list seen
        if len(trace.queues) > len(self.queues):
            self.queues = list(trace.queues)
        for t in trace.threads:
            pid = self._cpu_pid(t.tid)
            self._name_process(pid, ev)
            self._name_thread(pid, t.tid, t.name, ev)
        for qi, q in enumerate(trace.queues):
            gpid = GPU_PID_BASE + q.device
            self._name_process(gpid, ev)
            self._name_thread(gpid, qi + 1, q.label, ev, queue=queue_dict(q))

        n = len(s)
        tids = [t.tid for t in trace.threads]
        cpu_tid = [tids[i] for i in s.thread.tolist()] if n else []
        # CPU tracks nest by construction; interleaved coroutines may partially overlap
        bad = (
            (s.parent >= 0) & (s.cpu_end_ns > s.cpu_end_ns[np.maximum(s.parent, 0)])
            if n
            else np.zeros(0, bool)
        )
        if bad.any():
            for th in np.unique(s.thread[bad]).tolist():
                rows = np.flatnonzero(s.thread == th)
                lanes = _lanes(
                    s.cpu_start_ns[rows].tolist(), s.cpu_end_ns[rows].tolist(), list(range(len(rows)))
                )
                for r, ln in zip(rows.tolist(), lanes, strict=True):
                    if ln:
                        cpu_tid[r] = tids[th] + ln * OVERLAP_TID_STEP
                for ln in range(1, max(lanes) + 1):
                    tid = tids[th] + ln * OVERLAP_TID_STEP
                    self._name_thread(self._cpu_pid(tid), tid, f"{trace.threads[th].name} (overlap {ln})", ev)
        ts = list(map(repr, ((s.cpu_start_ns - base) / 1000.0).tolist()))  # text, formatted in a C loop
        dur = list(map(repr, ((s.cpu_end_ns - s.cpu_start_ns) / 1000.0).tolist()))
        jnames = [_j(nm) for nm in trace.names]  # JSON-quoted once per name
        name_j = [jnames[i] for i in s.name.tolist()]
        cpu_pid = [self._cpu_pid(t) for t in cpu_tid] if self.pid_of_tid else [self.pid] * n
        has_gpu = s.gpu_start_ns != NO_TIME
        # the rare parts of a CPU slice: args, flags, the flow to its GPU slice
        tail = dict.fromkeys(np.flatnonzero(has_gpu).tolist(), "")
        for r in tail:
            tail[r] = f',"bind_id":{r0 + r},"flow_out":true'
        for i in sorted(set(s.args) | set(np.flatnonzero(s.flags).tolist())):
            a = dict(s.args.get(i) or {})
            if s.flags[i]:
                a["flags"] = flag_names(int(s.flags[i]))
            if a:
                tail[i] = tail.get(i, "") + ',"args":' + _j(a)
        if tail:
            ev.extend(
                [
                    f'{{"ph":"X","name":{nm},"pid":{p},"tid":{tid},"ts":{t0},"dur":{d}{tail.get(r, "")}}}'
                    for r, (nm, p, tid, t0, d) in enumerate(
                        zip(name_j, cpu_pid, cpu_tid, ts, dur, strict=True)
                    )
                ]
            )
        else:
            ev.extend(
                [
                    f'{{"ph":"X","name":{nm},"pid":{p},"tid":{tid},"ts":{t0},"dur":{d}}}'
                    for nm, p, tid, t0, d in zip(name_j, cpu_pid, cpu_tid, ts, dur, strict=True)
                ]
            )
        self._gpu_events(trace, r0, name_j, has_gpu, ev)
        if len(trace.ops):
            self.has_ops = True
            got, skipped = op_events(trace, r0, base, self.op_rows)
            ev.extend(got)
            self.op_rows += len(trace.ops)
            self.ops_not_drawn += skipped
        tid_pid = {t.tid: self._cpu_pid(t.tid) for t in trace.threads}
        for m in trace.marks:
            tid = tids[m.thread]
            e = {"ph": "i", "s": "t", "cat": m.kind, "name": m.name, "pid": tid_pid[tid], "tid": tid,
                 "ts": (m.ts_ns - base) / 1000.0}  # fmt: skip
            if m.args:
                e["args"] = dict(m.args)
            ev.append(_j(e))
        self.rows += n
        return ",".join(ev).encode()

    def _gpu_events(
        self, trace: Trace, r0: int, name_j: list[str], has_gpu: np.ndarray, ev: list[str]
    ) -> None:
        s = trace.scopes
        rows = np.flatnonzero(has_gpu)
        if not len(rows):
            return
        base = self.base
        queues = trace.queues
        st, en = s.gpu_start_ns.tolist(), s.gpu_end_ns.tolist()
        flags = s.flags.tolist()
        # lanes per queue: a GPU slice that would partially overlap goes to an overflow track
        gtid: dict[int, int] = {}
        for qi in np.unique(s.queue[rows]).tolist():
            qrows = rows[s.queue[rows] == qi]
            # in-order queues (the usual case) need no lane search
            q0, q1 = s.gpu_start_ns[qrows], s.gpu_end_ns[qrows]
            if len(qrows) < 2 or ((np.diff(q0) >= 0).all() and (q1[:-1] <= q0[1:]).all()):
                gtid.update(dict.fromkeys(qrows.tolist(), qi + 1))
                continue
            ql = qrows.tolist()
            order = sorted(range(len(ql)), key=lambda k: (st[ql[k]], -en[ql[k]]))
            lanes = _lanes([st[r] for r in ql], [en[r] for r in ql], order)
            dev = queues[qi].device if 0 <= qi < len(queues) else 0
            for r, ln in zip(ql, lanes, strict=True):
                gtid[r] = qi + 1 + ln * OVERLAP_TID_STEP
            for ln in range(1, max(lanes) + 1):
                label = queues[qi].label if 0 <= qi < len(queues) else "queue"
                self._name_thread(
                    GPU_PID_BASE + dev, qi + 1 + ln * OVERLAP_TID_STEP, f"{label} (overlap {ln})", ev
                )
        sp = trace.spans
        passes: dict[int, list[int]] = {}
        if len(sp):
            unlabelled = trace.names.index("") if "" in trace.names else -1
            for k in np.flatnonzero(sp.label != unlabelled).tolist():
                passes.setdefault(int(sp.scope[k]), []).append(k)
        qname = [_j(f"queued · {q.label}") for q in queues] + ['"queued"']
        anomalous = int(ANOMALY_FLAGS)
        # per-row columns as text, formatted in C loops (``map(repr, …)``) rather than one by one
        qa = s.queue[rows].astype(np.int64)
        dev = np.array([q.device for q in queues] + [0], np.int64)[
            np.where((qa >= 0) & (qa < len(queues)), qa, -1)
        ]
        gpids = (GPU_PID_BASE + dev).tolist()
        qn_idx = np.where((qa >= 0) & (qa < len(queues)), qa, len(queues)).tolist()
        g0, g1, sb = s.gpu_start_ns[rows], s.gpu_end_ns[rows], s.submit_ns[rows]
        ts_s = list(map(repr, ((g0 - base) / 1000.0).tolist()))
        dur_s = list(map(repr, (np.maximum(g1 - g0, 0) / 1000.0).tolist()))
        sub_s = list(map(repr, ((sb - base) / 1000.0).tolist()))
        waited_l = ((sb != NO_TIME) & (g0 >= sb)).tolist()
        early_l = ((sb != NO_TIME) & (g0 < sb)).tolist()  # a start before submission: no wait slice
        neg_l = (g1 < g0).tolist()
        uc = s.uncertainty_ns[rows]
        changed = np.ones(len(rows), bool)  # written where it changes; a reader carries it forward
        changed[1:] = uc[1:] != uc[:-1]
        unc_s = [
            f',"uncertainty_us":{u / 1000.0!r}' if c else ""
            for u, c in zip(uc.tolist(), changed.tolist(), strict=True)
        ]
        timing = (trace.header.get("backend_info") or {}).get("timing")  # which source timed the GPU
        timing_s = f',"timing":{_j(timing)}' if isinstance(timing, str) else ""
        busy = trace.busy_ns().tolist() if len(trace.ops) else None  # summed operation time per scope
        for k, r in enumerate(rows.tolist()):
            gpid = gpids[k]
            t0 = ts_s[k]
            b = r0 + r
            extra = unc_s[k] + timing_s
            if busy is not None:
                extra += f',"gpu_busy_us":{busy[r] / 1000.0!r}'
            if early_l[k]:
                extra += f',"submit_ts":{sub_s[k]}'
            if neg_l[k]:  # kept as measured (and flagged); the slice itself cannot be negative
                extra += f',"gpu_us":{(en[r] - st[r]) / 1000.0!r}'
            if flags[r]:
                extra += ',"flags":' + _j(flag_names(flags[r]))
            args = ',"args":{' + extra[1:] + "}" if extra else ""
            ev.append(
                f'{{"ph":"X","name":{name_j[r]},"pid":{gpid},"tid":{gtid[r]},"ts":{t0},'
                f'"dur":{dur_s[k]},"bind_id":{b},"flow_in":true{args}}}'
            )
            if r in passes:
                for p in passes[r]:
                    pa: dict[str, Any] = {"scope": b}
                    if int(sp.submit_ns[p]) != NO_TIME:
                        pa["submit_ts"] = (int(sp.submit_ns[p]) - base) / 1000.0
                    p0, p1 = int(sp.gpu_start_ns[p]), int(sp.gpu_end_ns[p])
                    label = trace.names[int(sp.label[p])]
                    p_ts, p_dur = (p0 - base) / 1000.0, max(p1 - p0, 0) / 1000.0
                    ev.append(_j({"ph": "X", "cat": "gpu.pass", "name": label, "pid": gpid, "tid": gtid[r],
                                  "ts": p_ts, "dur": p_dur, "args": pa}))  # fmt: skip
            if waited_l[k]:  # the wait, as an async slice inside the GPU process; it carries the submit time
                qn = qname[qn_idx[k]]
                ev.append(
                    f'{{"ph":"b","cat":"queued","name":{qn},"id2":{{"local":{b}}},"pid":{gpid},"ts":{sub_s[k]}}}'
                )
                ev.append(
                    f'{{"ph":"e","cat":"queued","name":{qn},"id2":{{"local":{b}}},"pid":{gpid},"ts":{t0}}}'
                )
            if flags[r] & anomalous:
                what = ", ".join(flag_names(flags[r] & anomalous))
                ev.append(_j({"ph": "i", "s": "t", "cat": "anomaly", "name": "anomaly: " + what, "pid": gpid,
                              "tid": gtid[r], "ts": float(t0)}))  # fmt: skip


def _j(value: Any) -> str:
    return dumps(value).decode()


def _process_label(rank: Any, host: Any, pid: int, pid_is_real: bool) -> str:
    parts = []
    if rank is not None:
        parts.append(f"rank {rank}")
    if host:
        parts.append(str(host))
    if not parts:
        return f"python {pid}"
    label = " · ".join(parts)
    return f"{label} (pid {pid})" if pid_is_real and pid else label


def to_events(trace: Trace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The whole trace as Chrome trace events plus the header written beside them."""
    header = file_header(trace)
    return Encoder(header).events(trace), header


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as Chrome/Perfetto JSON (gzip when the name ends in ``.gz``)."""
    from gputrace.exporters import json as json_format

    return json_format.write(trace, path)


# Per-operation events (CUPTI timing) -------------------------------------------------------------
OP_TID_BASE = 1 << 20  # a stream's operations track: OP_TID_BASE + queue (+ overflow lanes)
OP_FLOW_BASE = 1 << 40  # flow ids of launch call -> operation, apart from the scope flows
OP_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # PyTorch's categories, which HTA reads


def stream_number(label: str, queue: int) -> int:
    """The stream id a queue label names ("stream 7" -> 7), else the queue index."""
    head, _, num = label.rpartition(" ")
    return int(num) if head == "stream" and num.isdigit() else queue


# an operation more than this far from the file's zero is not on its time line (never aligned)
MAX_OP_US = 1e12


def op_events(trace: Trace, r0: int, base: int, op0: int = 0) -> tuple[list[str], int]:
    """Each operation as a GPU slice on its stream's operations track, its launch call as a CPU
    slice inside its scope (once per call: a graph launch runs many operations), and a flow (v2,
    ``bind_id``) from the call to its first operation; with the fields HTA reads. Scopes are
    numbered from ``r0`` and operations from ``op0`` (a streamed file's chunks). Events come as
    JSON text, formatted from templates (tens of thousands of kernels per sync are common).

    Returns the events and how many operations were left out: those before the file's zero
    (launched before the session) or on a clock that was never aligned (no calibration), which
    no viewer could place."""
    ops, names, queues = trace.ops, trace.names, trace.queues
    n = len(ops)
    ev: list[str] = []
    if not n:
        return ev, 0
    rel = (ops.gpu_start_ns - base) / 1000.0
    seen_a = ops.call_start_ns != NO_TIME
    crel = np.where(seen_a, (ops.call_start_ns - base) / 1000.0, 0.0)
    placed = ((rel >= 0) & (rel < MAX_OP_US) & (crel >= 0) & (crel < MAX_OP_US)).tolist()
    pid = int(trace.header.get("pid") or 1)
    st, en = ops.gpu_start_ns.tolist(), ops.gpu_end_ns.tolist()
    c0, c1 = ops.call_start_ns.tolist(), ops.call_end_ns.tolist()
    scope, qcol, thr = ops.scope.tolist(), ops.queue.tolist(), ops.thread.tolist()
    kinds, corrs = ops.kind.tolist(), ops.correlation.tolist()
    jnames = [_j(nm) for nm in names]  # JSON-quoted once per name
    op_name_j = [jnames[i] for i in ops.name.tolist()]
    call_names = [names[i] for i in ops.call_name.tolist()]
    call_name_j = [jnames[i] for i in ops.call_name.tolist()]
    grids, blocks, nbytes = ops.grid.tolist(), ops.block.tolist(), ops.bytes.tolist()
    gids, nids = ops.graph_id.tolist(), ops.graph_node_id.tolist()
    # times as text, formatted in C loops
    ts_s = list(map(repr, rel.tolist()))
    dur_s = list(map(repr, (np.maximum(ops.gpu_end_ns - ops.gpu_start_ns, 0) / 1000.0).tolist()))
    cts_s = list(map(repr, crel.tolist()))
    cdur_s = list(map(repr, (np.where(seen_a, ops.call_end_ns - ops.call_start_ns, 0) / 1000.0).tolist()))
    l2s_s = list(map(repr, (np.where(seen_a, ops.gpu_start_ns - ops.call_start_ns, 0) / 1000.0).tolist()))
    sc0, sc1 = trace.scopes.cpu_start_ns.tolist(), trace.scopes.cpu_end_ns.tolist()
    tids = [t.tid for t in trace.threads]
    cpu_tid = [tids[i] for i in trace.scopes.thread.tolist()]
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
            track = f"{label} · operations" + (f" (overlap {ln})" if ln else "")
            tid = OP_TID_BASE + qi + ln * OVERLAP_TID_STEP
            ev.append(_j({"ph": "M", "name": "thread_name", "pid": GPU_PID_BASE + dev, "tid": tid,
                          "args": {"name": track}}))  # fmt: skip
    rank = int(trace.header.get("rank") or 0)
    cats = [f'"{c}"' for c in OP_CATS]
    calls_done: set[int] = set()
    touch_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for k in range(n):
        if not placed[k]:
            continue
        qi, kind, corr, r = qcol[k], kinds[k], corrs[k], scope[k]
        known_q = 0 <= qi < len(queues)
        dev = dev_of[qi] if known_q else 0
        stream = stream_of[qi] if known_q else qi
        row = r0 + r if r >= 0 else -1
        a = (
            f'"op":{op0 + k},"scope":{row},"queue":{qi},"device":{dev},"stream":{stream},'
            f'"correlation":{corr},"External id":{row},"rank":{rank},"timing":"cupti"'
        )
        if kind == 0 or any(grids[k]):
            g, b = grids[k], blocks[k]
            a += f',"grid":[{g[0]},{g[1]},{g[2]}],"block":[{b[0]},{b[1]},{b[2]}]'
        if kind != 0 or nbytes[k]:
            a += f',"bytes":{nbytes[k]}'
        if gids[k]:
            a += f',"graph id":{gids[k]},"graph node id":{nids[k]}'
        seen = c0[k] != NO_TIME
        if seen:
            a += (
                f',"call":{call_name_j[k]},"call_ts":{cts_s[k]},"call_dur_us":{cdur_s[k]},'
                f'"launch_to_start_us":{l2s_s[k]}'
            )
        if thr[k] >= 0:
            a += f',"tid":{tids[thr[k]]}'
        head = (
            f'{{"ph":"X","cat":{cats[kind] if 0 <= kind < 3 else cats[0]},"name":{op_name_j[k]},'
            f'"pid":{GPU_PID_BASE + dev},"tid":{op_tid[k]},"ts":{ts_s[k]},"dur":{dur_s[k]}'
        )
        call = ""
        # the launch call, inside its scope's CPU slice (only where it nests: never a partial
        # overlap); no "stream" in its args: HTA tells CPU events from GPU ones by a missing stream
        if (
            seen
            and thr[k] >= 0
            and corr not in calls_done  # one flow per call: to its first operation
            and (
                sc0[r] <= c0[k] and c1[k] <= sc1[r]
                if r >= 0
                else not _touches_a_scope(trace, thr[k], c0[k], c1[k], touch_cache)
            )
        ):
            calls_done.add(corr)
            flow = OP_FLOW_BASE + op0 + k
            name = call_names[k]
            ccat = "cuda_runtime" if name.startswith("cuda") else "cuda_driver"
            ctid = cpu_tid[r] if r >= 0 else tids[thr[k]]
            head += f',"bind_id":{flow},"flow_in":true'
            call = (
                f'{{"ph":"X","cat":"{ccat}","name":{call_name_j[k]},"pid":{pid},"tid":{ctid},'
                f'"ts":{cts_s[k]},"dur":{cdur_s[k]},"bind_id":{flow},"flow_out":true,'
                f'"args":{{"correlation":{corr},"External id":{row}}}}}'
            )
        ev.append(head + ',"args":{' + a + "}}")
        if call:
            ev.append(call)
    return ev, n - sum(placed)


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
