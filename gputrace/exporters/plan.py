"""The format-neutral plan of a trace file: where each scope, wait and operation is drawn.

``Planner`` turns a trace, chunk by chunk, into a ``Chunk``: name events, and a few batches of
events of one shape each as numpy columns (``Events``, ``Waits``, ``Counters``), which both
writers render (so both formats draw the same tracks and args, with no Python work per event):
- each traced process (pid = its OS pid) has a thread track per Python thread; each GPU is a
  process (pid = ``GPU_PID_BASE + device``) with a track per stream/queue (tid = queue + 1) and
  an operations track per stream (tid = ``OP_TID_BASE + queue``) where the trace has operations;
- slices that would partially overlap on one track move to an overflow lane of it
  (tid + n · ``OVERLAP_TID_STEP``, named "(overlap n)"): ``LaneCarry``;
- times are relative to ``export_base_ns`` (never negative); the header is ``file_header``;
  what each event holds: ``Planner``'s methods and docs/trace-format.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace import figures
from gputrace.jsonsafe import dumps
from gputrace.model import ANOMALY_FLAGS, FORMAT_VERSION, NO_TIME, QueueInfo, ThreadInfo, Trace, flag_names
from gputrace.npstats import distinct

Ints = npt.NDArray[Any]  # integer columns (int64, or int32 straight from the model)
Mask = npt.NDArray[np.bool_]

GPU_PID_BASE = 1 << 30  # GPU "processes"; real pids stay below 2**22 on Linux
OVERLAP_TID_STEP = 1 << 24  # overflow lane n of a track: tid + n·step (Linux tids stay below 2**22)
EXAMPLES_IN_HEADER = 20  # anomaly examples kept in the file's header (counts stay exact)
OP_TID_BASE = 1 << 20  # a stream's operations track: OP_TID_BASE + queue (+ overflow lanes)
OP_FLOW_BASE = 1 << 40  # flow ids of launch call -> operation, apart from the scope flows
OP_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # PyTorch's categories, which HTA reads
MAX_OP_NS = 10**15  # an operation farther than this from the file's zero was never aligned


def export_base_ns(trace: Trace) -> int:
    """The zero of the file's time axis: session start, or anything earlier (no negative ts)."""
    s, sp = trace.scopes, trace.spans
    start = int(trace.header.get("start_ns", trace.header["base_ns"]))
    cols = (s.cpu_start_ns, s.submit_ns, s.gpu_start_ns, s.gpu_end_ns, sp.gpu_start_ns, sp.gpu_end_ns)
    firsts = [int(c[c != NO_TIME].min(initial=start)) for c in cols]
    return min([start, *firsts, *(m.ts_ns for m in trace.marks[:1])])


class LaneCarry:
    """Lanes of a file's tracks, each holding only nested or disjoint slices; for GPU tracks, each
    lane's slices still open are kept across chunks: a new chunk's clock fit can move back-to-back
    work of two chunks into a partial overlap of tens of ns. A fresh one serves a single batch."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], list[list[tuple[int, int]]]] = {}

    def lanes(self, key: tuple[str, int], st: Ints, en: Ints) -> Ints:
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


def fold_passes(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A scope's one pass as long as its GPU slice (same start, end, submission and queue) is the
    arg ``pass`` of that slice, not a second slice. ``rows``: the GPU scopes, ascending. Returns,
    per row, the folded pass's label (-1: none), and the spans still written as pass slices."""
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
    """The header as written: anomaly counts exact, examples capped at ``EXAMPLES_IN_HEADER``
    (a reader rebuilds the list from the flags each slice carries)."""
    out = dict(header)
    an = out.get("anomalies")
    if isinstance(an, dict) and isinstance(an.get("items"), list) and len(an["items"]) > EXAMPLES_IN_HEADER:
        items = an["items"]
        extra = int(an.get("truncated", 0)) + len(items) - EXAMPLES_IN_HEADER
        out["anomalies"] = dict(an, items=items[:EXAMPLES_IN_HEADER], truncated=extra)
    return out


def file_header(trace: Trace) -> dict[str, Any]:
    """The header written beside ``trace``'s events: its own, with the threads and queues listed."""
    header = dict(trace.header, format_version=FORMAT_VERSION)  # as written now, whatever it was read from
    header["base_ns"] = export_base_ns(trace)
    header["threads"] = [asdict(t) for t in trace.threads]
    header["queues"] = [asdict(q) for q in trace.queues]
    return capped_header(header)


def process_label(p: dict[str, Any], pid: int) -> str:
    """A process named by its rank and host (``p``: a merged trace's entry of ``processes``), with
    its pid where it is real; "python <pid>" where it has neither."""
    parts = [] if p.get("rank") is None else [f"rank {p['rank']}"]
    if p.get("host"):
        parts.append(str(p["host"]))
    if not parts:
        return f"python {pid}"
    label = " · ".join(parts)
    return f"{label} (pid {pid})" if p.get("pid_is_real", True) and pid else label


# -- the plan of one chunk -------------------------------------------------------------------------
@dataclass
class Arg:
    """One argument of a batch: ``kind`` "int" (integers), "us" (ns, written as µs) or "pick"
    (``value`` a (table of JSON values, index per row) pair); ``has``: the rows that carry it."""

    key: str
    kind: str
    value: Any
    has: Mask | None = None


@dataclass
class Events:
    """Events of one shape, a column each: slices (``dur`` given) or instants. ``cat``/``name``
    index ``cats``/``names``; ``args`` per-key columns, or ``objs`` a whole args object per row
    from a table (0: none); ``flow`` the flow ids (of the rows ``flow_has``), out or in."""

    cats: list[str]
    cat: Ints
    names: list[str]
    name: Ints
    pid: Ints
    tid: Ints
    ts: Ints
    dur: Ints | None = None
    args: list[Arg] = field(default_factory=list)
    objs: tuple[list[Any], Ints] | None = None
    flow: Ints | None = None
    flow_has: Mask | None = None
    flow_out: bool = False


@dataclass
class Waits:
    """Submission -> GPU start waits: ``id`` (the scope's row), named ``labels[label]``."""

    labels: list[str]
    label: Ints
    pid: Ints
    id: Ints
    start: Ints
    end: Ints


@dataclass
class Counters:
    """Samples of the counter ``labels[label]`` / ``key`` of process ``pid``."""

    labels: list[str]
    label: Ints
    key: str
    pid: Ints
    ts: Ints
    value: Ints


@dataclass
class Chunk:
    meta: list[dict[str, Any]] = field(default_factory=list)  # process/thread names, sort indexes
    events: list[Events] = field(default_factory=list)
    waits: list[Waits] = field(default_factory=list)
    counters: list[Counters] = field(default_factory=list)


def _col(v: Any, n: int) -> Ints:
    return np.broadcast_to(np.asarray(v, np.int64), (n,))


class Planner:
    """The plan of one file, chunk by chunk (``header``: the file's): it numbers scopes and
    operations across chunks, names each process and track once, and keeps the GPU tracks' lanes."""

    def __init__(self, header: dict[str, Any]) -> None:
        self.base = int(header["base_ns"])
        self.pid = int(header.get("pid") or 1)
        host = header.get("host")
        self.own = {"rank": header.get("rank"), "host": host.get("name") if isinstance(host, dict) else None}
        procs = header.get("processes")
        self.processes: list[dict[str, Any]] = procs if isinstance(procs, list) else []
        self.pid_of_tid: dict[int, int] = {
            int(t) % OVERLAP_TID_STEP: int(p["pid"]) for p in self.processes for t in p.get("tids", [])
        }
        self.proc_of_device = {int(d): p for p in self.processes for d in p.get("devices", [])}
        self.rows = 0  # scopes written so far: the file-order row of the next scope
        self.op_rows = 0  # operations written so far (numbers them, and their flows, across chunks)
        self.ops_not_drawn = 0  # operations off the file's time line (before it, or never aligned)
        self.named: set[tuple[int, int]] = set()  # (pid, tid) with a name event; tid 0: process
        self.lane_carry = LaneCarry()  # GPU tracks' open slices, across chunks
        self.threads: dict[int, ThreadInfo] = {}
        self.queues: list[QueueInfo] = []

    # -- names ---------------------------------------------------------------------------------
    def _name_process(self, pid: int, meta: list[dict[str, Any]]) -> None:
        if (pid, 0) in self.named:
            return
        self.named.add((pid, 0))
        if pid >= GPU_PID_BASE:
            d = pid - GPU_PID_BASE
            q = next((q for q in self.queues if q.device == d), None)
            label = f"GPU {d} · {q.device_name} · {q.backend}" if q else f"GPU {d}"
            owner = self.proc_of_device.get(d)
            if owner is not None:
                label = f"{process_label(owner, 0)} · {label}"
            sort = 1 << 16 | d  # GPUs after every Python process
        else:
            found = [(k, p) for k, p in enumerate(self.processes) if int(p["pid"]) == pid]
            sort, p = found[0] if found else (0, self.own)
            label = process_label(p, pid)
        meta.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        meta.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}}
        )

    def _name_thread(self, pid: int, tid: int, name: str, meta: list[dict[str, Any]], **extra: Any) -> None:
        if (pid, tid) not in self.named:
            self.named.add((pid, tid))
            meta.append(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name, **extra}}
            )

    def _name_lanes(self, pid: int, tid: int, label: str, top: int, meta: list[Any], first: int = 1) -> None:
        """Names of the lanes ``first`` .. ``top`` of track ``tid``: "<label> (overlap n)"."""
        for ln in range(first, top + 1):
            name = label + (f" (overlap {ln})" if ln else "")
            self._name_thread(pid, tid + ln * OVERLAP_TID_STEP, name, meta)

    def _cpu_pid(self, tid: int) -> int:
        return self.pid_of_tid.get(tid % OVERLAP_TID_STEP, self.pid)

    def _cpu_pids(self, tids: Ints) -> Ints:
        """The process of each CPU track's tid: the file's, or in a merged trace its thread's."""
        if not self.pid_of_tid:
            return _col(self.pid, len(tids))
        return np.array([self._cpu_pid(t) for t in np.asarray(tids).tolist()], np.int64)

    def _lanes(self, key: str, tracks: Ints, st: Ints, en: Ints) -> Ints:
        """Lane per slice, track by track (``tracks``: the track of each slice)."""
        lanes = np.zeros(len(st), np.int64)
        for k in distinct(tracks).tolist():
            at = np.flatnonzero(tracks == k)
            lanes[at] = self.lane_carry.lanes((key, k), st[at], np.maximum(en[at], st[at]))
        return lanes

    # -- the chunk -----------------------------------------------------------------------------
    def chunk(self, trace: Trace) -> Chunk:
        """The plan of ``trace`` (one chunk), its rows numbered after the previous chunks'."""
        out = Chunk()
        meta = out.meta
        s = trace.scopes
        # queues: a chunk lists the session's queues so far; keep the longest list seen
        if len(trace.queues) > len(self.queues):
            self.queues = list(trace.queues)
        for t in trace.threads:
            self.threads.setdefault(t.tid, t)
            pid = self._cpu_pid(t.tid)
            self._name_process(pid, meta)
            self._name_thread(pid, t.tid, t.name, meta)
        for qi, q in enumerate(trace.queues):
            self._name_process(GPU_PID_BASE + q.device, meta)
            self._name_thread(GPU_PID_BASE + q.device, qi + 1, q.label, meta, queue=asdict(q))
        n = len(s)
        tids = np.array([t.tid for t in trace.threads] or [0], np.int64)
        has_gpu = s.gpu_start_ns != NO_TIME
        if n:
            out.events.append(self._cpu(trace, tids, has_gpu, meta))
        self._gpu(trace, has_gpu, out)
        if len(trace.ops):
            self._ops(trace, tids, out)
        if trace.marks:  # syncs and marks: an instant each, with its args
            m = trace.marks
            kinds = sorted({x.kind for x in m})
            mtid = tids[np.array([x.thread for x in m], np.int64)]
            objs = (
                [None] + [dict(x.args) for x in m],
                np.array([(k + 1) * bool(x.args) for k, x in enumerate(m)]),
            )
            kind = np.array([kinds.index(x.kind) for x in m], np.int64)
            ts = np.array([x.ts_ns - self.base for x in m], np.int64)
            out.events.append(Events(
                kinds, kind, [x.name for x in m], np.arange(len(m)), self._cpu_pids(mtid), mtid, ts, objs=objs
            ))  # fmt: skip
        self.rows += n
        return out

    def _cpu(self, trace: Trace, tids: Ints, has_gpu: Mask, meta: list[dict[str, Any]]) -> Events:
        """A slice per scope on its thread (its CPU enqueue window), its flow to its GPU slice, its args."""
        s = trace.scopes
        n = len(s)
        cpu_tid = tids[s.thread]
        # CPU tracks nest by construction; interleaved coroutines may partially overlap
        bad = (s.parent >= 0) & (s.cpu_end_ns > s.cpu_end_ns[np.maximum(s.parent, 0)])
        for th in distinct(s.thread[bad]).tolist():
            rows = np.flatnonzero(s.thread == th)
            # rows are in (start, -end) order, as the lanes take them
            lanes = LaneCarry().lanes(("cpu", th), s.cpu_start_ns[rows], s.cpu_end_ns[rows])
            cpu_tid[rows] += lanes * OVERLAP_TID_STEP
            tid = int(tids[th])
            self._name_lanes(self._cpu_pid(tid), tid, trace.threads[th].name, int(lanes.max()), meta)
        pid = self._cpu_pids(cpu_tid)
        # the rare parts: a scope's own args and flags (equal ones written from one entry)
        flagged = np.flatnonzero(s.flags)
        idx = np.zeros(n, np.int64)
        fl = dict(zip(flagged.tolist(), s.flags[flagged].tolist(), strict=True))
        numbered: dict[bytes, tuple[int, Any]] = {}  # an args object's JSON -> (its number, it)
        for i in sorted(set(s.args) | set(fl)):
            a = s.args.get(i) or {}
            if i in fl:
                a = dict(a, flags=flag_names(fl[i]))
            if a:
                idx[i] = numbered.setdefault(dumps(a), (len(numbered) + 1, a))[0]
        objs = [None, *(a for _k, a in numbered.values())]
        return Events(
            ["cpu"], _col(0, n), trace.names, s.name, pid, cpu_tid, s.cpu_start_ns - self.base,
            s.cpu_end_ns - s.cpu_start_ns, objs=(objs, idx), flow=self.rows + np.arange(n),
            flow_has=has_gpu, flow_out=True,
        )  # fmt: skip

    def _gpu(self, trace: Trace, has_gpu: Mask, out: Chunk) -> None:
        """A slice per GPU scope on its stream (every field a reader needs in its args), its wgpu
        passes, its wait, the streams' queue depth, and an instant per anomaly."""
        s = trace.scopes
        rows = np.flatnonzero(has_gpu)
        if not len(rows):
            return
        base, queues = self.base, trace.queues
        nq = len(queues)
        q_of = s.queue[rows].astype(np.int64)
        g0, g1, sb = s.gpu_start_ns[rows], s.gpu_end_ns[rows], s.submit_ns[rows]
        # lanes per queue: a GPU slice that would partially overlap goes to an overflow track
        lanes = self._lanes("gpu", q_of, g0, g1)
        gtid = q_of + 1 + lanes * OVERLAP_TID_STEP
        for qi in distinct(q_of[lanes > 0]).tolist():
            dev, label = (queues[qi].device, queues[qi].label) if 0 <= qi < nq else (0, "queue")
            self._name_lanes(GPU_PID_BASE + dev, qi + 1, label, int(lanes[q_of == qi].max()), out.meta)
        qn_idx = np.where((q_of >= 0) & (q_of < nq), q_of, nq)
        gpid = GPU_PID_BASE + np.array([q.device for q in queues] + [0], np.int64)[qn_idx]
        b = self.rows + rows
        flags = s.flags[rows]
        uflags, finv = np.unique(flags, return_inverse=True)
        known_sub = sb != NO_TIME
        # every field on every GPU slice (docs/trace-format.md): what Perfetto shows when clicked
        args = [
            Arg("submit_ts", "us", sb - base, known_sub),
            Arg("submit_to_start_us", "us", g0 - sb, known_sub),
            Arg("gpu_us", "us", g1 - g0),  # kept as measured (and flagged); the slice is never negative
            Arg("cpu_enqueue_us", "us", s.cpu_end_ns[rows] - s.cpu_start_ns[rows]),
            Arg("uncertainty_us", "us", s.uncertainty_ns[rows]),
            Arg("flags", "pick", ([flag_names(f) for f in uflags.tolist()], finv.reshape(-1))),
        ]
        iv = figures.intervals(trace) if len(trace.ops) or figures.calibration_for(trace) else None
        if len(trace.ops):  # busy and self busy time per scope (gputrace.figures)
            args.append(Arg("gpu_busy_us", "us", figures.busy_ns(trace, iv)[rows]))
            args.append(Arg("gpu_self_us", "us", figures.self_gpu_ns(trace, iv)[rows]))
        est, est_ok = figures.launch_free_ns(trace, iv)  # only with a calibration of this backend
        if est_ok[rows].any():
            args.append(Arg("if_launches_free_us", "us", est[rows], est_ok[rows]))
        timing = (trace.header.get("backend_info") or {}).get("timing")  # which source timed the GPU
        if isinstance(timing, str):
            args.append(Arg("timing", "pick", ([timing], _col(0, len(rows)))))
        fold, passes = fold_passes(trace, rows)
        args.append(Arg("pass", "pick", (trace.names, np.maximum(fold, 0)), fold >= 0))
        out.events.append(Events(
            ["gpu"], _col(0, len(rows)), trace.names, s.name[rows], gpid, gtid, g0 - base,
            np.maximum(g1 - g0, 0), args, flow=b, flow_has=None, flow_out=False,
        ))  # fmt: skip
        if len(passes):  # wgpu passes not folded into their scope's slice: its children
            sp = trace.spans
            pos = np.searchsorted(rows, sp.scope[passes])
            p0, p1, psub = sp.gpu_start_ns[passes], sp.gpu_end_ns[passes], sp.submit_ns[passes]
            pargs = [Arg("scope", "int", b[pos]), Arg("submit_ts", "us", psub - base, psub != NO_TIME)]
            out.events.append(Events(
                ["gpu.pass"], _col(0, len(passes)), trace.names, sp.label[passes], gpid[pos], gtid[pos],
                p0 - base, np.maximum(p1 - p0, 0), pargs,
            ))  # fmt: skip
        w = np.flatnonzero(known_sub & (g0 >= sb))
        if len(w):  # the wait, inside the GPU process
            labels = [f"queued · {q.label}" for q in queues] + ["queued"]
            out.waits.append(Waits(labels, qn_idx[w], gpid[w], b[w], sb[w] - base, g0[w] - base))
        self._depth(trace, rows, gpid, qn_idx, out)
        an = flags & int(ANOMALY_FLAGS)
        a = np.flatnonzero(an)
        if len(a):
            ua, ainv = np.unique(an[a], return_inverse=True)
            what = ["anomaly: " + ", ".join(flag_names(f)) for f in ua.tolist()]
            out.events.append(
                Events(["anomaly"], _col(0, len(a)), what, ainv.reshape(-1), gpid[a], gtid[a], g0[a] - base)
            )

    def _depth(self, trace: Trace, rows: Ints, gpid: Ints, qn_idx: Ints, out: Chunk) -> None:
        """The queue-depth counter of each stream: +1 at a scope's submission, -1 at its GPU end
        (a nested scope's work is its parent's). Work of an earlier chunk still queued is not added."""
        s = trace.scopes
        q = s.queue[rows]
        par = s.parent[rows]
        sb, g1 = s.submit_ns[rows], s.gpu_end_ns[rows]
        pr = np.maximum(par, 0)
        nested = (par >= 0) & (s.gpu_start_ns[pr] != NO_TIME) & (s.queue[pr] == q)
        top = np.flatnonzero((sb != NO_TIME) & ~nested)
        if not len(top):
            return
        t = np.concatenate([sb[top], np.maximum(g1[top], sb[top])])
        step = np.concatenate([np.ones(len(top), np.int64), -np.ones(len(top), np.int64)])
        at = np.concatenate([top, top])
        qk = qn_idx[at]
        order = np.lexsort((step, t, qk))  # per stream, in time order, an end before a start
        t, step, at, qk = t[order], step[order], at[order], qk[order]
        depth = np.cumsum(step)
        first = np.flatnonzero(np.r_[True, qk[1:] != qk[:-1]])
        depth -= np.repeat(depth[first] - step[first], np.diff(np.r_[first, len(qk)]))
        labels = [q.label for q in trace.queues] + ["queue"]
        out.counters.append(Counters(labels, qk, "queue depth", gpid[at], t - self.base, depth))

    def _ops(self, trace: Trace, tids: Ints, out: Chunk) -> None:
        """Each operation as a GPU slice on its stream's operations track (with the fields HTA reads),
        its launch call as a CPU slice inside its scope (once: a graph launch runs many), and a flow
        from the call to its first operation. Those no viewer could place are left out, counted."""
        ops, queues, s, base = trace.ops, trace.queues, trace.scopes, self.base
        n, nq, op0 = len(ops), len(queues), self.op_rows
        st, en = ops.gpu_start_ns, ops.gpu_end_ns
        seen = ops.call_start_ns != NO_TIME
        c0 = np.where(seen, ops.call_start_ns, base)
        c1 = np.where(seen, ops.call_end_ns, base)
        placed = (st >= base) & (st < base + MAX_OP_NS) & (c0 >= base) & (c0 < base + MAX_OP_NS)
        qcol = ops.queue.astype(np.int64)
        known_q = (qcol >= 0) & (qcol < nq)
        qi_safe = np.where(known_q, qcol, nq)
        dev = np.array([q.device for q in queues] + [0], np.int64)[qi_safe]
        # the stream id a queue label names ("stream 7" -> 7), else the queue index
        heads = [q.label.rpartition(" ") for q in queues]
        numbers = [int(n) if h == "stream" and n.isdigit() else i for i, (h, _, n) in enumerate(heads)]
        stream = np.where(known_q, np.array([*numbers, 0], np.int64)[qi_safe], qcol)
        scope = ops.scope.astype(np.int64)
        row = np.where(scope >= 0, self.rows + scope, -1)
        thr = ops.thread.astype(np.int64)
        # an operations track per stream; an overlap (concurrent graph branches) gets a lane
        lanes = self._lanes("ops", qcol, st, en)
        op_tid = OP_TID_BASE + qcol + lanes * OVERLAP_TID_STEP
        for qi in distinct(qcol).tolist():
            d, label = (queues[qi].device, queues[qi].label) if 0 <= qi < nq else (0, "stream ?")
            top, label = int(lanes[qcol == qi].max()), f"{label} · operations"
            self._name_lanes(GPU_PID_BASE + d, OP_TID_BASE + qi, label, top, out.meta, first=0)
        # the launch call, inside its scope's CPU slice (only where it nests: never a partial
        # overlap; a call outside every scope only where it touches none), once per call
        cand = placed & seen & (thr >= 0)
        if len(s):
            r = np.maximum(scope, 0)
            cand &= np.where(scope >= 0, (s.cpu_start_ns[r] <= c0) & (c1 <= s.cpu_end_ns[r]), True)
            loose = cand & (scope < 0)
            for th in distinct(thr[loose]).tolist():
                k = np.flatnonzero(loose & (thr == th))
                mine = np.flatnonzero(s.thread == th)  # in start order
                i = np.searchsorted(s.cpu_start_ns[mine], c1[k], side="right")
                reach = np.maximum.accumulate(s.cpu_end_ns[mine])[np.maximum(i - 1, 0)] if len(mine) else 0
                cand[k[(i > 0) & (reach >= c0[k])]] = False
        c = np.flatnonzero(cand)
        cc = ops.correlation[c]
        if len(c) > 1 and not (cc[1:] > cc[:-1]).all():  # ids repeat (graph launches) or run back
            c = c[np.unique(cc, return_index=True)[1]]
        drawn = np.zeros(n, bool)
        drawn[c] = True
        flow = OP_FLOW_BASE + op0 + np.arange(n, dtype=np.int64)
        kind = ops.kind.astype(np.int64)
        # grid and block: a few distinct shapes, each written once
        shape = np.concatenate([ops.grid, ops.block], axis=1).astype(np.int64)
        has_shape = (kind == 0) | shape.any(axis=1)
        runs = np.flatnonzero(np.r_[True, (shape[1:] != shape[:-1]).any(axis=1)])  # (n > 0 here)
        ushape, run_idx = np.unique(shape[runs], axis=0, return_inverse=True)
        sinv = np.repeat(run_idx.reshape(-1), np.diff(np.r_[runs, n]))
        p = np.flatnonzero(placed)
        sh, sp = has_shape[p], seen[p]
        g = ops.graph_id[p] != 0
        args = [
            Arg("op", "int", op0 + p), Arg("scope", "int", row[p]), Arg("queue", "int", qcol[p]),
            Arg("device", "int", dev[p]), Arg("stream", "int", stream[p]),
            Arg("correlation", "int", ops.correlation[p]), Arg("External id", "int", row[p]),
            Arg("grid", "pick", (ushape[:, :3].tolist(), sinv[p]), sh),
            Arg("block", "pick", (ushape[:, 3:].tolist(), sinv[p]), sh),
            Arg("bytes", "int", ops.bytes[p], (kind[p] != 0) | (ops.bytes[p] != 0)),
            Arg("graph id", "int", ops.graph_id[p], g), Arg("graph node id", "int", ops.graph_node_id[p], g),
            Arg("call", "pick", (trace.names, ops.call_name[p]), sp),
            Arg("call_ts", "us", c0[p] - base, sp), Arg("call_dur_us", "us", c1[p] - c0[p], sp),
            Arg("tid", "int", tids[np.maximum(thr[p], 0)], thr[p] >= 0),
        ]  # fmt: skip
        out.events.append(Events(
            list(OP_CATS), np.where((kind >= 0) & (kind < 3), kind, 0)[p], trace.names, ops.name[p],
            GPU_PID_BASE + dev[p], op_tid[p], st[p] - base, np.maximum(en[p] - st[p], 0), args,
            flow=flow[p], flow_has=drawn[p], flow_out=False,
        ))  # fmt: skip
        d = np.flatnonzero(drawn)
        if len(d):
            cats = ["cuda_runtime" if nm.startswith("cuda") else "cuda_driver" for nm in trace.names]
            sd = np.maximum(scope[d], 0)
            ctid = np.where(scope[d] >= 0, tids[s.thread[sd]] if len(s) else 0, tids[thr[d]])
            cargs = [Arg("correlation", "int", ops.correlation[d]), Arg("External id", "int", row[d])]
            cpid = self._cpu_pids(ctid)  # (a merged trace: each call in the process of its thread)
            out.events.append(Events(
                cats, ops.call_name[d], trace.names, ops.call_name[d], cpid, ctid, c0[d] - base,
                c1[d] - c0[d], cargs, flow=flow[d], flow_has=None, flow_out=True,
            ))  # fmt: skip
        self.op_rows += n
        self.ops_not_drawn += n - len(p)
