"""Chrome/Perfetto trace events for a ``Trace``: the layout every JSON file of gputrace uses.

Layout (see DESIGN.md "The trace file"):
- each traced process (pid = its OS pid): one thread track per Python thread, a ``cat: "cpu"`` X
  slice per scope spanning its CPU enqueue window;
- one process per GPU (pid = ``GPU_PID_BASE + device``), a thread track per stream/queue with a
  ``cat: "gpu"`` X slice per scope (and, for wgpu, one child slice per pass);
- the submission → GPU start wait as process-scoped async ``b``/``e`` events (``id2.local``)
  named "queued · <stream>", so they sit inside their GPU process and overlapping waits stack;
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
        self.named: set[tuple[int, int]] = set()  # (pid, tid) with a name event; tid 0: process
        self.threads: dict[int, ThreadInfo] = {}
        self.queues: list[QueueInfo] = []

    # -- names ---------------------------------------------------------------------------------
    def _proc_label(self, pid: int) -> str:
        for p in self.processes:
            if int(p["pid"]) == pid:
                return _process_label(p.get("rank"), p.get("host"), pid, bool(p.get("pid_is_real", True)))
        return _process_label(self.rank, self.host, pid, True)

    def _name_process(self, pid: int, ev: list[dict[str, Any]]) -> None:
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
        ev.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        ev.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}}
        )

    def _name_thread(self, pid: int, tid: int, name: str, ev: list[dict[str, Any]], **extra: Any) -> None:
        if (pid, tid) in self.named:
            return
        self.named.add((pid, tid))
        ev.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name, **extra}})

    def _cpu_pid(self, tid: int) -> int:
        return self.pid_of_tid.get(tid % OVERLAP_TID_STEP, self.pid)

    # -- events --------------------------------------------------------------------------------
    def events(self, trace: Trace) -> list[dict[str, Any]]:
        """The events of ``trace`` (one chunk); its rows are numbered after the previous chunks'."""
        ev: list[dict[str, Any]] = []
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
        ts = ((s.cpu_start_ns - base) / 1000.0).tolist()
        dur = ((s.cpu_end_ns - s.cpu_start_ns) / 1000.0).tolist()
        name_str = [trace.names[i] for i in s.name.tolist()]
        cpu_pid = [self._cpu_pid(t) for t in cpu_tid] if self.pid_of_tid else [self.pid] * n
        first = len(ev)
        ev.extend(
            [
                {"ph": "X", "cat": "cpu", "name": nm, "pid": p, "tid": tid, "ts": t0, "dur": d}
                for nm, p, tid, t0, d in zip(name_str, cpu_pid, cpu_tid, ts, dur, strict=True)
            ]
        )
        for i in sorted(set(s.args) | set(np.flatnonzero(s.flags).tolist())):
            a = dict(s.args.get(i) or {})
            if s.flags[i]:
                a["flags"] = flag_names(int(s.flags[i]))
            if a:
                ev[first + i]["args"] = a
        has_gpu = s.gpu_start_ns != NO_TIME
        for r in np.flatnonzero(has_gpu).tolist():
            e = ev[first + r]
            e["bind_id"] = r0 + r
            e["flow_out"] = True
        self._gpu_events(trace, r0, name_str, has_gpu, ev)
        tid_pid = {t.tid: self._cpu_pid(t.tid) for t in trace.threads}
        for m in trace.marks:
            tid = tids[m.thread]
            e = {"ph": "i", "s": "t", "cat": m.kind, "name": m.name, "pid": tid_pid[tid], "tid": tid,
                 "ts": (m.ts_ns - base) / 1000.0}  # fmt: skip
            if m.args:
                e["args"] = dict(m.args)
            ev.append(e)
        self.rows += n
        return ev

    def _gpu_events(
        self, trace: Trace, r0: int, name_str: list[str], has_gpu: np.ndarray, ev: list[dict[str, Any]]
    ) -> None:
        s = trace.scopes
        rows = np.flatnonzero(has_gpu)
        if not len(rows):
            return
        base = self.base
        queues = trace.queues
        st, en = s.gpu_start_ns.tolist(), s.gpu_end_ns.tolist()
        sub = s.submit_ns.tolist()
        qcol, flags, unc = s.queue.tolist(), s.flags.tolist(), s.uncertainty_ns.tolist()
        # lanes per queue: a GPU slice that would partially overlap goes to an overflow track
        gtid: dict[int, int] = {}
        for qi in np.unique(s.queue[rows]).tolist():
            qrows = rows[s.queue[rows] == qi].tolist()
            order = sorted(range(len(qrows)), key=lambda k: (st[qrows[k]], -en[qrows[k]]))
            lanes = _lanes([st[r] for r in qrows], [en[r] for r in qrows], order)
            dev = queues[qi].device if 0 <= qi < len(queues) else 0
            for r, ln in zip(qrows, lanes, strict=True):
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
        depth_events: list[tuple[int, int, int, int]] = []  # (ts, +1/-1, queue, row)
        for r in rows.tolist():
            qi = qcol[r]
            dev = queues[qi].device if 0 <= qi < len(queues) else 0
            gpid = GPU_PID_BASE + dev
            t0 = (st[r] - base) / 1000.0
            gpu_ns = en[r] - st[r]
            a: dict[str, Any] = {"scope": r0 + r, "uncertainty_us": unc[r] / 1000.0}
            if sub[r] != NO_TIME:
                a["submit_ts"] = (sub[r] - base) / 1000.0
            if gpu_ns < 0:  # kept as measured (and flagged); the slice itself cannot be negative
                a["gpu_us"] = gpu_ns / 1000.0
            if flags[r]:
                a["flags"] = flag_names(flags[r])
            dur_us = max(gpu_ns, 0) / 1000.0
            ev.append({"ph": "X", "cat": "gpu", "name": name_str[r], "pid": gpid, "tid": gtid[r], "ts": t0,
                       "dur": dur_us, "bind_id": r0 + r, "flow_in": True, "args": a})  # fmt: skip
            for k in passes.get(r, []):
                pa: dict[str, Any] = {"scope": r0 + r}
                if int(sp.submit_ns[k]) != NO_TIME:
                    pa["submit_ts"] = (int(sp.submit_ns[k]) - base) / 1000.0
                p0, p1 = int(sp.gpu_start_ns[k]), int(sp.gpu_end_ns[k])
                ev.append({"ph": "X", "cat": "gpu.pass", "name": trace.names[int(sp.label[k])], "pid": gpid,
                           "tid": gtid[r], "ts": (p0 - base) / 1000.0, "dur": max(p1 - p0, 0) / 1000.0,
                           "args": pa})  # fmt: skip
            if sub[r] != NO_TIME and st[r] >= sub[r]:
                qname = f"queued · {queues[qi].label}" if 0 <= qi < len(queues) else "queued"
                loc = {"local": r0 + r}
                ev.append({"ph": "b", "cat": "queued", "name": qname, "id2": loc, "pid": gpid, "tid": qi + 1,
                           "ts": a["submit_ts"]})  # fmt: skip
                ev.append({"ph": "e", "cat": "queued", "name": qname, "id2": loc, "pid": gpid, "tid": qi + 1,
                           "ts": t0})  # fmt: skip
            if sub[r] != NO_TIME:
                depth_events.append((sub[r], 1, qi, r))
                depth_events.append((max(en[r], sub[r]), -1, qi, r))
            if flags[r] & int(ANOMALY_FLAGS):
                what = ", ".join(flag_names(flags[r] & int(ANOMALY_FLAGS)))
                ev.append({"ph": "i", "s": "t", "cat": "anomaly", "name": "anomaly: " + what, "pid": gpid,
                           "tid": gtid[r], "ts": t0})  # fmt: skip
        # queue depth: work submitted but not finished, per stream (a nested scope's work is
        # already counted by its parent). Perfetto names the track "<name> <arg key>".
        depth_events.sort(key=lambda x: (x[0], x[1]))
        depth: dict[int, int] = {}
        parent = s.parent.tolist()
        for t, delta, qi, r in depth_events:
            p = parent[r]
            if p >= 0 and has_gpu[p] and qcol[p] == qi:
                continue
            depth[qi] = depth.get(qi, 0) + delta
            dev = queues[qi].device if 0 <= qi < len(queues) else 0
            label = queues[qi].label if 0 <= qi < len(queues) else "queue"
            ev.append({"ph": "C", "name": label, "pid": GPU_PID_BASE + dev, "ts": (t - base) / 1000.0,
                       "args": {"queue depth": depth[qi]}})  # fmt: skip


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
