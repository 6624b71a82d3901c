"""Chrome trace events for a ``Trace``, laid out as ``plan`` says (see docs/trace-format.md).

- a ``cat: "cpu"`` X slice per scope on its thread, spanning its CPU enqueue window;
- a ``cat: "gpu"`` X slice per GPU scope on its stream (wgpu passes: ``gpu.pass`` children),
  its args every field a reader needs: submission, submission -> start, GPU and CPU durations,
  alignment uncertainty, flags (and the operations' busy time where the trace has them);
- the submission -> GPU start wait as process-scoped async ``b``/``e`` events (``id2.local``),
  the ``b`` named "queued · <stream>", the ``e`` with no name (neither with a category), so they
  sit inside their GPU process and overlapping waits stack;
- a flow v2 from each scope's CPU slice to its GPU slice (``bind_id``, ``flow_out``/``flow_in``),
  which Perfetto binds to exactly those slices;
- a queue-depth counter per stream; instants for syncs, marks and anomalies; per-operation
  events (CUPTI) with the fields Holistic Trace Analysis reads.

``Encoder`` turns a trace into events chunk by chunk (a streaming session appends one chunk per
sync): it numbers scopes across chunks and emits each process/thread/queue name once.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import orjson

from gputrace import figures
from gputrace.exporters._text import Rows
from gputrace.exporters.plan import (
    GPU_PID_BASE,
    MAX_OP_NS,
    OP_CATS,
    OP_FLOW_BASE,
    OP_TID_BASE,
    OVERLAP_TID_STEP,
    LaneCarry,
    file_header,
    fold_passes,
    process_label,
    queue_dict,
    stream_number,
)
from gputrace.jsonsafe import dumps
from gputrace.model import ANOMALY_FLAGS, NO_TIME, QueueInfo, ThreadInfo, Trace, flag_names
from gputrace.npstats import distinct


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
        self.lane_carry = LaneCarry()  # GPU tracks' open slices, across chunks
        self.threads: dict[int, ThreadInfo] = {}
        self.queues: list[QueueInfo] = []

    # -- names ---------------------------------------------------------------------------------
    def _proc_label(self, pid: int) -> str:
        for p in self.processes:
            if int(p["pid"]) == pid:
                return process_label(p.get("rank"), p.get("host"), pid, bool(p.get("pid_is_real", True)))
        return process_label(self.rank, self.host, pid, True)

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
                label = f"{process_label(owner.get('rank'), owner.get('host'), 0, False)} · {label}"
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
        data = b"".join(self.encode(trace))
        return list(orjson.loads(b"[" + data[:-1] + b"]")) if data else []

    def encode(self, trace: Trace) -> list[Any]:
        """The events of ``trace`` (one chunk) as pieces of JSON text (bytes-like: bytes or uint8
        arrays, never joined into one more copy), each event followed by a comma; rows are
        numbered after the previous chunks'. Events of one shape (a scope's slices, its wait, an
        operation) are formatted a column at a time (``_text.Rows``): building text or a dict per
        event costs far more than the numbers in it."""
        ev: list[str] = []
        parts: list[Any] = []
        s = trace.scopes
        r0 = self.rows
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
        tids = np.array([t.tid for t in trace.threads] or [0], np.int64)
        cpu_tid = tids[s.thread] if n else np.zeros(0, np.int64)
        # CPU tracks nest by construction; interleaved coroutines may partially overlap
        bad = (
            (s.parent >= 0) & (s.cpu_end_ns > s.cpu_end_ns[np.maximum(s.parent, 0)])
            if n
            else np.zeros(0, bool)
        )
        if bad.any():
            for th in distinct(s.thread[bad]).tolist():
                rows = np.flatnonzero(s.thread == th)
                # rows are in (start, -end) order, as the lanes take them
                lanes = LaneCarry().lanes(("cpu", th), s.cpu_start_ns[rows], s.cpu_end_ns[rows])
                cpu_tid[rows] += lanes * OVERLAP_TID_STEP
                for ln in range(1, int(lanes.max()) + 1):
                    tid = int(tids[th]) + ln * OVERLAP_TID_STEP
                    self._name_thread(self._cpu_pid(tid), tid, f"{trace.threads[th].name} (overlap {ln})", ev)
        base = self.base
        jnames = [_j(nm) for nm in trace.names] or ['""']  # JSON-quoted once per name
        has_gpu = s.gpu_start_ns != NO_TIME
        if n:
            cpu = Rows(n).lit('{"ph":"X","cat":"cpu","name":').pick(jnames, s.name).lit(',"pid":')
            if self.pid_of_tid:
                cpu.num(np.array([self._cpu_pid(int(t)) for t in cpu_tid.tolist()], np.int64))
            else:
                cpu.lit(str(self.pid))
            cpu.lit(',"tid":').num(cpu_tid).lit(',"ts":').us(s.cpu_start_ns - base)
            cpu.lit(',"dur":').us(s.cpu_end_ns - s.cpu_start_ns)
            # the flow to its GPU slice; the rare parts: args and flags
            cpu.lit(',"bind_id":', has_gpu).num(r0 + np.arange(n), has_gpu).lit(',"flow_out":true', has_gpu)
            flagged = np.flatnonzero(s.flags)
            rare = sorted(set(s.args) | set(flagged.tolist()))
            if rare:
                text_no: dict[bytes, int] = {b"": 0}  # equal args are written from one entry
                idx = np.zeros(n, np.intp)
                fl = dict(zip(flagged.tolist(), s.flags[flagged].tolist(), strict=True))
                for i in rare:
                    a = s.args.get(i) or {}
                    if i in fl:
                        a = dict(a, flags=_flag_list(fl[i]))
                    if a:
                        idx[i] = text_no.setdefault(b',"args":' + dumps(a), len(text_no))
                cpu.pick(list(text_no), idx)
            parts += cpu.lit("}").buffers()
        parts += self._gpu_events(trace, r0, jnames, has_gpu, ev)
        if len(trace.ops):
            self.has_ops = True
            got, skipped = op_events(trace, r0, base, self.op_rows, jnames, self.lane_carry, self.pid_of_tid)
            parts += got
            self.op_rows += len(trace.ops)
            self.ops_not_drawn += skipped
        tid_pid = {t.tid: self._cpu_pid(t.tid) for t in trace.threads}
        for m in trace.marks:
            tid = int(tids[m.thread])
            e = {"ph": "i", "s": "t", "cat": m.kind, "name": m.name, "pid": tid_pid[tid], "tid": tid,
                 "ts": (m.ts_ns - base) / 1000.0}  # fmt: skip
            if m.args:
                e["args"] = dict(m.args)
            ev.append(_j(e))
        self.rows += n
        if ev:
            parts.insert(0, (",".join(ev) + ",").encode())
        return parts

    def _gpu_events(
        self, trace: Trace, r0: int, jnames: list[str], has_gpu: np.ndarray, ev: list[str]
    ) -> list[Any]:
        s = trace.scopes
        rows = np.flatnonzero(has_gpu)
        if not len(rows):
            return []
        base = self.base
        queues = trace.queues
        nq = len(queues)
        # lanes per queue: a GPU slice that would partially overlap goes to an overflow track
        q_of = s.queue[rows].astype(np.int64)
        gtid = q_of + 1
        g0, g1, sb = s.gpu_start_ns[rows], s.gpu_end_ns[rows], s.submit_ns[rows]
        for qi in distinct(q_of).tolist():
            at = np.flatnonzero(q_of == qi)
            lanes = self.lane_carry.lanes(("gpu", qi), g0[at], np.maximum(g1[at], g0[at]))
            if not lanes.any():
                continue
            gtid[at] += lanes * OVERLAP_TID_STEP
            dev = queues[qi].device if 0 <= qi < nq else 0
            label = queues[qi].label if 0 <= qi < nq else "queue"
            for ln in range(1, int(lanes.max()) + 1):
                self._name_thread(
                    GPU_PID_BASE + dev, qi + 1 + ln * OVERLAP_TID_STEP, f"{label} (overlap {ln})", ev
                )
        known = (q_of >= 0) & (q_of < nq)
        qn_idx = np.where(known, q_of, nq)
        gpid = GPU_PID_BASE + np.array([q.device for q in queues] + [0], np.int64)[qn_idx]
        b = r0 + rows
        k = len(rows)
        flags = s.flags[rows]
        uflags, finv = np.unique(flags, return_inverse=True)
        flag_text = [_j(_flag_list(f)) for f in uflags.tolist()]
        finv = finv.reshape(-1)
        timing = (trace.header.get("backend_info") or {}).get("timing")  # which source timed the GPU
        known_sub = sb != NO_TIME
        waited = known_sub & (g0 >= sb)
        # every field on every GPU slice (docs/trace-format.md): what Perfetto shows when clicked
        members: list[tuple[str, str, Any, Any]] = [
            ('"submit_ts":', "us", sb - base, known_sub),
            ('"submit_to_start_us":', "us", g0 - sb, known_sub),
            # kept as measured (and flagged); the slice itself cannot be negative
            ('"gpu_us":', "us", g1 - g0, None),
            ('"cpu_enqueue_us":', "us", s.cpu_end_ns[rows] - s.cpu_start_ns[rows], None),
            ('"uncertainty_us":', "us", s.uncertainty_ns[rows], None),
            ('"flags":', "pick", (flag_text, finv), None),
        ]
        iv = figures.intervals(trace) if len(trace.ops) or figures.calibration_for(trace) else None
        if len(trace.ops):  # busy and self busy time per scope (gputrace.figures)
            members.append(('"gpu_busy_us":', "us", figures.busy_ns(trace, iv)[rows], None))
            members.append(('"gpu_self_us":', "us", figures.self_gpu_ns(trace, iv)[rows], None))
        est, est_ok = figures.launch_free_ns(trace, iv)  # only with a calibration of this backend
        if est_ok[rows].any():
            members.append(('"if_launches_free_us":', "us", est[rows], est_ok[rows]))
        if isinstance(timing, str):
            members.append(('"timing":', "lit", _j(timing), None))
        fold, passes = fold_passes(trace, rows)
        members.append(('"pass":', "pick", (jnames, np.maximum(fold, 0)), fold >= 0))
        gpu = Rows(k).lit('{"ph":"X","cat":"gpu","name":').pick(jnames, s.name[rows]).lit(',"pid":').num(gpid)
        gpu.lit(',"tid":').num(gtid).lit(',"ts":').us(g0 - base).lit(',"dur":').us(np.maximum(g1 - g0, 0))
        gpu.lit(',"bind_id":').num(b).lit(',"flow_in":true').members(',"args":{', members)
        parts = gpu.lit("}").buffers()
        if len(passes):
            parts += self._passes(trace, r0, passes, rows, gpid, gtid, jnames)
        # the wait, as an async slice inside the GPU process; it carries the submit time
        w = np.flatnonzero(waited)
        if len(w):
            # Only the begin is named; neither end has a category. Perfetto's JSON importer keys
            # an async slice's track by (process, cookie), the cookie being the hash of `cat` and
            # id2.local (json_trace_tokenizer.cc, ParseTraceEventContents), so both ends must
            # carry the same `cat`: here none. The track takes its name from the first event of
            # that cookie, the begin (track_compressor.cc, InternLegacyAsyncTrack), and an end
            # with no name and no category closes the open slice on it
            # (slice_tracker.cc, MatchingIncompleteSliceIndex). Readers pair them by (pid, id).
            heads = [f'{{"ph":"b","name":{_j(f"queued · {q.label}")}' for q in queues]
            heads += ['{"ph":"b","name":"queued"', '{"ph":"e"']
            # each wait's begin and end, one after the other
            two = np.repeat(w, 2)
            head = np.repeat(qn_idx[w], 2)
            head[1::2] = len(heads) - 1
            t = np.empty(2 * len(w), np.int64)
            t[0::2], t[1::2] = sb[w], g0[w]
            wr = Rows(2 * len(w)).pick(heads, head).lit(',"id2":{"local":').num(b[two])
            parts += wr.lit('},"pid":').num(gpid[two]).lit(',"ts":').us(t - base).lit("}").buffers()
        parts += self._depth(trace, rows, gpid, qn_idx, [_j(q.label) for q in queues] + ['"queue"'])
        an = flags & int(ANOMALY_FLAGS)
        a = np.flatnonzero(an)
        if len(a):
            ua, ainv = np.unique(an[a], return_inverse=True)
            what = [_j("anomaly: " + ", ".join(_flag_list(f))) for f in ua.tolist()]
            inst = Rows(len(a)).lit('{"ph":"i","s":"t","cat":"anomaly","name":').pick(what, ainv.reshape(-1))
            inst.lit(',"pid":').num(gpid[a]).lit(',"tid":').num(gtid[a]).lit(',"ts":').us(g0[a] - base)
            parts += inst.lit("}").buffers()
        return parts

    def _depth(
        self, trace: Trace, rows: np.ndarray, gpid: np.ndarray, qn_idx: np.ndarray, labels: list[str]
    ) -> list[Any]:
        """The queue-depth counter of each stream (work submitted, not yet finished): +1 at a
        scope's submission, -1 at its GPU end; a nested scope's work is its parent's, counted
        once. Exact within a chunk: work of an earlier chunk still queued is not added."""
        s = trace.scopes
        q = s.queue[rows]
        par = s.parent[rows]
        sb, g1 = s.submit_ns[rows], s.gpu_end_ns[rows]
        pr = np.maximum(par, 0)
        nested = (par >= 0) & (s.gpu_start_ns[pr] != NO_TIME) & (s.queue[pr] == q)
        top = np.flatnonzero((sb != NO_TIME) & ~nested)
        if not len(top):
            return []
        t = np.concatenate([sb[top], np.maximum(g1[top], sb[top])])
        step = np.concatenate([np.ones(len(top), np.int64), -np.ones(len(top), np.int64)])
        at = np.concatenate([top, top])
        qk = qn_idx[at]
        order = np.lexsort((step, t, qk))  # per stream, in time order, an end before a start
        t, step, at, qk = t[order], step[order], at[order], qk[order]
        depth = np.cumsum(step)
        first = np.flatnonzero(np.r_[True, qk[1:] != qk[:-1]])
        depth -= np.repeat(depth[first] - step[first], np.diff(np.r_[first, len(qk)]))
        c = Rows(len(t)).lit('{"ph":"C","name":').pick(labels, qk).lit(',"pid":').num(gpid[at])
        c.lit(',"ts":').us(t - self.base).lit(',"args":{"queue depth":').num(depth)
        return c.lit("}}").buffers()

    def _passes(
        self,
        trace: Trace,
        r0: int,
        k: np.ndarray,
        rows: np.ndarray,
        gpid: np.ndarray,
        gtid: np.ndarray,
        jnames: list[str],
    ) -> list[Any]:
        """wgpu passes ``k`` (span rows) not folded into their scope's GPU slice: child slices of
        it, on its track."""
        sp = trace.spans
        pos = np.searchsorted(rows, sp.scope[k])
        base = self.base
        p0, p1, psub = sp.gpu_start_ns[k], sp.gpu_end_ns[k], sp.submit_ns[k]
        r = Rows(len(k)).lit('{"ph":"X","cat":"gpu.pass","name":').pick(jnames, sp.label[k])
        r.lit(',"pid":').num(gpid[pos]).lit(',"tid":').num(gtid[pos]).lit(',"ts":').us(p0 - base)
        r.lit(',"dur":').us(np.maximum(p1 - p0, 0)).lit(',"args":{"scope":').num(r0 + rows[pos])
        has_sub = psub != NO_TIME
        r.lit(',"submit_ts":', has_sub).us(psub - base, has_sub)
        return r.lit("}}").buffers()


@functools.lru_cache(maxsize=256)
def _flag_list(flags: int) -> list[str]:
    """``flag_names``, once per value (few distinct values; each call walks the flags)."""
    return flag_names(int(flags))


def _j(value: Any) -> str:
    return dumps(value).decode()


def to_events(trace: Trace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The whole trace as Chrome trace events plus the header written beside them."""
    header = file_header(trace)
    return Encoder(header).events(trace), header


def op_events(
    trace: Trace,
    r0: int,
    base: int,
    op0: int = 0,
    jnames: list[str] | None = None,
    lane_carry: LaneCarry | None = None,
    pid_of_tid: dict[int, int] | None = None,
) -> tuple[list[Any], int]:
    """Each operation as a GPU slice on its stream's operations track, its launch call as a CPU
    slice inside its scope (once per call: a graph launch runs many operations), and a flow (v2,
    ``bind_id``) from the call to its first operation; with the fields HTA reads. Scopes are
    numbered from ``r0`` and operations from ``op0`` (a streamed file's chunks; ``lane_carry``
    keeps each operations track's open slices from one chunk to the next; ``pid_of_tid`` puts a
    merged trace's launch calls in their own process). Events come as
    pieces of JSON text, each event followed by a comma, formatted a column at a time (tens of
    thousands of kernels per sync are common).

    Returns the events and how many operations were left out: those before the file's zero
    (launched before the session) or on a clock that was never aligned (no calibration), which
    no viewer could place."""
    ops, names, queues = trace.ops, trace.names, trace.queues
    n = len(ops)
    if not n:
        return [], 0
    head: list[str] = []
    nq = len(queues)
    st, en = ops.gpu_start_ns, ops.gpu_end_ns
    seen = ops.call_start_ns != NO_TIME
    c0 = np.where(seen, ops.call_start_ns, base)
    c1 = np.where(seen, ops.call_end_ns, base)
    placed = (st >= base) & (st < base + MAX_OP_NS) & (c0 >= base) & (c0 < base + MAX_OP_NS)
    pid = int(trace.header.get("pid") or 1)
    qcol = ops.queue.astype(np.int64)
    known_q = (qcol >= 0) & (qcol < nq)
    qi_safe = np.where(known_q, qcol, nq)
    dev = np.array([q.device for q in queues] + [0], np.int64)[qi_safe]
    stream = np.where(
        known_q,
        np.array([stream_number(q.label, i) for i, q in enumerate(queues)] + [0], np.int64)[qi_safe],
        qcol,
    )
    scope = ops.scope.astype(np.int64)
    row = np.where(scope >= 0, r0 + scope, -1)
    thr = ops.thread.astype(np.int64)
    tids = np.array([t.tid for t in trace.threads] or [0], np.int64)
    # an operations track per stream; an overlap (concurrent graph branches) gets a lane
    op_tid = OP_TID_BASE + qcol
    carry = lane_carry if lane_carry is not None else LaneCarry()
    for qi in distinct(qcol).tolist():
        at = np.flatnonzero(qcol == qi)
        lanes = carry.lanes(("ops", qi), st[at], np.maximum(en[at], st[at]))
        op_tid[at] += lanes * OVERLAP_TID_STEP
        d = queues[qi].device if 0 <= qi < nq else 0
        label = queues[qi].label if 0 <= qi < nq else "stream ?"
        for ln in range(int(lanes.max()) + 1):
            track = f"{label} · operations" + (f" (overlap {ln})" if ln else "")
            tid = OP_TID_BASE + qi + ln * OVERLAP_TID_STEP
            head.append(_j({"ph": "M", "name": "thread_name", "pid": GPU_PID_BASE + d, "tid": tid,
                            "args": {"name": track}}))  # fmt: skip
    # the launch call, inside its scope's CPU slice (only where it nests: never a partial
    # overlap), drawn once per call (a flow to its first operation)
    s = trace.scopes
    cand = placed & seen & (thr >= 0)
    if len(s):
        r = np.maximum(scope, 0)
        cand &= np.where(scope >= 0, (s.cpu_start_ns[r] <= c0) & (c1 <= s.cpu_end_ns[r]), True)
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for k in np.flatnonzero(cand & (scope < 0)).tolist():
        if _touches_a_scope(trace, int(thr[k]), int(c0[k]), int(c1[k]), cache):
            cand[k] = False
    c = np.flatnonzero(cand)
    cc = ops.correlation[c]
    if len(c) > 1 and not (cc[1:] > cc[:-1]).all():  # ids repeat (graph launches) or run back
        c = c[np.unique(cc, return_index=True)[1]]
    drawn = np.zeros(n, bool)
    drawn[c] = True
    flow = OP_FLOW_BASE + op0 + np.arange(n, dtype=np.int64)
    if jnames is None:
        jnames = [_j(nm) for nm in names] or ['""']
    kind = ops.kind.astype(np.int64)
    cat = np.where((kind >= 0) & (kind < 3), kind, 0)
    # grid and block: a few distinct shapes, written once each
    shape = np.concatenate([ops.grid, ops.block], axis=1).astype(np.int64)
    has_shape = (kind == 0) | shape.any(axis=1)
    ushape, sinv = _distinct_rows(shape)
    shape_text = [f'[{g[0]},{g[1]},{g[2]}],"block":[{g[3]},{g[4]},{g[5]}]' for g in ushape]
    ok = np.flatnonzero(placed)
    m = len(ok)
    p = ok
    sh = has_shape[p]
    sp = seen[p]
    o = Rows(m).lit('{"ph":"X","cat":').pick([f'"{x}"' for x in OP_CATS], cat[p]).lit(',"name":')
    o.pick(jnames, ops.name[p]).lit(',"pid":').num(GPU_PID_BASE + dev[p]).lit(',"tid":').num(op_tid[p])
    o.lit(',"ts":').us(st[p] - base).lit(',"dur":').us(np.maximum(en[p] - st[p], 0))
    dp = drawn[p]
    o.lit(',"bind_id":', dp).num(flow[p], dp).lit(',"flow_in":true', dp)
    o.lit(',"args":{"op":').num(op0 + p).lit(',"scope":').num(row[p]).lit(',"queue":').num(qcol[p])
    o.lit(',"device":').num(dev[p]).lit(',"stream":').num(stream[p]).lit(',"correlation":')
    o.num(ops.correlation[p]).lit(',"External id":').num(row[p])
    o.lit(',"grid":', sh).pick(shape_text, sinv[p], sh)
    nb = (kind[p] != 0) | (ops.bytes[p] != 0)
    o.lit(',"bytes":', nb).num(ops.bytes[p], nb)
    g = ops.graph_id[p] != 0
    o.lit(',"graph id":', g).num(ops.graph_id[p], g).lit(',"graph node id":', g).num(ops.graph_node_id[p], g)
    o.lit(',"call":', sp).pick(jnames, ops.call_name[p], sp).lit(',"call_ts":', sp).us(c0[p] - base, sp)
    o.lit(',"call_dur_us":', sp).us(c1[p] - c0[p], sp)
    ht = thr[p] >= 0
    o.lit(',"tid":', ht).num(tids[np.maximum(thr[p], 0)], ht)
    parts = o.lit("}}").buffers()
    d = np.flatnonzero(drawn)
    if len(d):
        ccat = ['"cuda_runtime"' if nm.startswith("cuda") else '"cuda_driver"' for nm in names] or ['""']
        ctid = np.where(scope[d] >= 0, tids[s.thread[np.maximum(scope[d], 0)]] if len(s) else 0, tids[thr[d]])
        pid_of = pid_of_tid or {}  # a merged trace: each call in the process of its thread
        cpid = np.array([pid_of.get(t % OVERLAP_TID_STEP, pid) for t in ctid.tolist()], np.int64)
        call = Rows(len(d)).lit('{"ph":"X","cat":').pick(ccat, ops.call_name[d]).lit(',"name":')
        call.pick(jnames, ops.call_name[d]).lit(',"pid":').num(cpid).lit(',"tid":').num(ctid)
        call.lit(',"ts":').us(c0[d] - base)
        call.lit(',"dur":').us(c1[d] - c0[d]).lit(',"bind_id":').num(flow[d]).lit(',"flow_out":true,"args":')
        call.lit('{"correlation":').num(ops.correlation[d]).lit(',"External id":').num(row[d])
        parts += call.lit("}}").buffers()
    if head:
        parts.insert(0, (",".join(head) + ",").encode())
    return parts, n - m


def _distinct_rows(a: np.ndarray) -> tuple[list[list[int]], np.ndarray]:
    """The distinct rows of ``a`` (in first-seen order) and each row's index among them; runs
    of equal rows (the usual case: a loop launching the same kernels) are looked up once."""
    n = len(a)
    if not n:
        return [], np.zeros(0, np.intp)
    starts = np.flatnonzero(np.concatenate([[True], (a[1:] != a[:-1]).any(axis=1)]))
    seen: dict[tuple[int, ...], int] = {}
    run_idx = [seen.setdefault(tuple(r), len(seen)) for r in a[starts].tolist()]
    inv = np.repeat(np.array(run_idx, np.intp), np.diff(np.append(starts, n)))
    return [list(k) for k in seen], inv


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
