"""Perfetto protobuf output (``.pftrace``): TrackEvent packets, written and read back by gputrace.

Layout (the same picture as the JSON, in Perfetto's native format):

- one process track for the traced Python process, a thread track per Python thread; one process
  per GPU (pid ``GPU_PID_BASE + device``) with a thread track per stream/queue. Each scope is a
  slice on its thread (its CPU enqueue window) and, with GPU work, a slice on its queue; wgpu
  passes are child slices of it. Slices that would partially overlap on one track go to extra
  tracks named "(overlap n)", as in the JSON;
- a flow from each scope's CPU slice to its GPU slice (``flow_ids``/``terminating_flow_ids``, as
  varints; id = scope row + 1), bound to both slices exactly;
- the submission → GPU start wait as a slice on a "queued · <queue>" track of the GPU process
  (extra tracks of that name when waits overlap);
- a "queue depth · <queue>" counter track per queue (its samples ride on the wait's begin and the
  GPU slice's end); instants for marks, syncs and anomalies;
- per-operation records (CUPTI), where the trace has them: each operation a slice on its stream's
  "· operations" track, its launch call a slice inside its scope, a flow from call to operation;
- names, categories, argument names and repeated argument strings are interned once per file.
  Arguments: the scope's user arguments and flags on its CPU slice; on the GPU slice the
  submission (``submit_to_start_ns``) and the alignment uncertainty (``uncertainty_ns``, written
  where it changes from the previous GPU scope, carried forward by the reader).

Times: one ``ClockSnapshot`` ties a sequence-scoped incremental clock (each packet stores the ns
since the previous one) to CLOCK_MONOTONIC, the session clock, which is the trace's clock; GPU
times were aligned onto it by the resolver, and each GPU clock fit is stated as a pair of clock
snapshots (first and last calibration instant) for the GPU's own domain.

The gputrace header travels as an interned string that no event refers to (Perfetto keeps it and
shows nothing): at the start of the file and again, complete, at ``close``; the reader uses the
last. Each appended chunk starts with an interned index string (its byte length, the tracks and
threads it adds), then its packets in time order, every field a varint except in the few packets
that carry user arguments (whose places the index lists), so writing and reading are numpy passes
over columns. A file cut short (a killed program) loads every whole chunk before the cut, with
``header["truncated"] = True``; a chunk cut in the middle is left out whole (a session writes each
chunk with one ``write``). Begins and ends pair within their chunk; a CPU scope appended in a
later chunk that partially overlaps one written earlier on the same thread (interleaved
coroutines across a flush) reads back exactly, but Perfetto may nest the two wrongly.
"""

from __future__ import annotations

import functools
import os
import re
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gputrace.exporters import _protowire as pw
from gputrace.exporters._reading import no_nesting, span_table, with_folded
from gputrace.exporters.chrome import (
    GPU_PID_BASE,
    OVERLAP_TID_STEP,
    LaneCarry,
    _distinct_rows,
    export_base_ns,
    fold_passes,
)
from gputrace.jsonsafe import dumps as json_bytes
from gputrace.model import (
    ANOMALY_FLAGS,
    FORMAT_VERSION,
    NO_TIME,
    ClockFit,
    Mark,
    QueueInfo,
    ScopeTable,
    SpanTable,
    ThreadInfo,
    Trace,
    canonical_names,
    flag_names,
    flags_from_names,
    nest,
)
from gputrace.npstats import distinct

EXTENSIONS = (".pftrace", ".perfetto-trace")

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

SEQ = 1  # the one packet sequence gputrace writes
CLK = 64  # sequence-scoped incremental clock: ns since the previous packet, on CLOCK_MONOTONIC
MONO = 3  # BUILTIN_CLOCK_MONOTONIC: the session clock (time.perf_counter_ns on Linux)
GPU_CLOCK = 65  # + device: sequence-scoped clocks naming each GPU's own time domain

# TracePacket
P_CLOCK, P_TS, P_SEQ, P_TE, P_INTERNED, P_FLAGS, P_DEFAULTS, P_TRACK = 6, 8, 10, 11, 12, 13, 59, 60
SEQ_INCREMENTAL_STATE_CLEARED = 1
# TrackEvent
TE_CAT, TE_ANN, TE_TYPE, TE_NAME, TE_TRACK, TE_COUNTER, TE_FLOW, TE_TFLOW = 3, 4, 9, 10, 11, 30, 36, 42
# (flow_ids_old / terminating_flow_ids_old: varints, read by Perfetto like flow_ids)
SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = 1, 2, 3, 4
# DebugAnnotation
DA_NAME, DA_BOOL, DA_INT, DA_DOUBLE, DA_STR, DA_JSON, DA_STR_IID = 1, 2, 4, 5, 6, 9, 17
# InternedData
ID_CATS, ID_NAMES, ID_ANN_NAMES, ID_ANN_STRS = 1, 2, 3, 29

HEADER_TAG = b"gputrace:header:"  # as the file starts
FINAL_TAG = b"gputrace:final:z:"  # restated, complete, at close (zlib-compressed JSON)
CHUNK_TAG = b"gputrace:chunk:"
META_IID = 1 << 40  # interned strings no event refers to: the header and the chunk indexes

# track kinds in the chunk index
K_THREAD, K_QUEUE, K_QUEUED, K_DEPTH, K_PROC, K_OPS = 0, 1, 2, 3, 4, 5
# per-operation records (CUPTI): categories as PyTorch names them, and the launch call's
OP_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
CALL_CATS = ("cuda_runtime", "cuda_driver")
OP_FLOW_BASE = 1 << 40  # flow ids launch call -> operation, apart from the scope flows
OP_TID_BASE = 1 << 20  # a stream's operations track: tid OP_TID_BASE + queue (+ overflow lanes)

# tags as they appear in the flat varint stream
T_PACKET = (1 << 3) | 2
T_TS, T_SEQ, T_TE = P_TS << 3, P_SEQ << 3, (P_TE << 3) | 2
T_TYPE, T_TRACK, T_NAME, T_CAT = TE_TYPE << 3, TE_TRACK << 3, TE_NAME << 3, TE_CAT << 3
T_FLOW, T_TFLOW, T_COUNTER, T_ANN = TE_FLOW << 3, TE_TFLOW << 3, TE_COUNTER << 3, (TE_ANN << 3) | 2
T_EXTRA_TRACK, T_EXTRA_VALUE = 31 << 3, 12 << 3  # extra_counter_track_uuids, extra_counter_values
T_DA_NAME, T_DA_INT, T_DA_STR_IID = DA_NAME << 3, DA_INT << 3, DA_STR_IID << 3
T_DA_BOOL = DA_BOOL << 3
_GENERATED_PASS = re.compile(r"(compute|render) pass #\d+")  # the wgpu backend's names of unlabelled passes
MATRIX_SLACK = 2.0  # packets placed as rows of one matrix where it is at most this much wider than they are
MAX_ARG_GROUPS = 32  # distinct shapes of user arguments written as columns per chunk (others one by one)
MAX_ARG_STR = 256  # longer string arguments are written inline, one packet at a time

Progress = Callable[[str], None]


class PftraceError(ValueError):
    """A ``.pftrace`` file that gputrace cannot read back; the message says why."""


# -- writing --------------------------------------------------------------------------------------


def _packet(body: bytes) -> bytes:
    return pw.fb(1, body)


def _seq(body: bytes) -> bytes:
    return _packet(body + pw.fv(P_SEQ, SEQ))


class _Events:
    """Packets of one shape: every field a varint; some fields per row (arrays), some constant."""

    def __init__(self, ts: I64, cls: int, sub1: I64 | int = 0, sub2: I64 | int = 0) -> None:
        self.n = len(ts)
        self.ts = ts
        self.cls = cls
        self.sub1 = sub1
        self.sub2 = sub2
        self.te: list[int | U64] = []  # TrackEvent content, flat varints (tags and values)

    def field(self, tag: int, value: int | npt.NDArray[Any]) -> _Events:
        self.te.append(tag)
        self.te.append(value if isinstance(value, int) else np.asarray(value).astype(np.uint64))
        return self

    def ann(self, name_iid: int, tag: int, value: int | npt.NDArray[Any]) -> _Events:
        """A debug annotation: int (``T_DA_INT``) or interned string (``T_DA_STR_IID``)."""
        v = value if isinstance(value, int) else np.asarray(value).astype(np.int64).astype(np.uint64)
        vlen = pw.varint_len(np.asarray([v], np.uint64))[0] if isinstance(v, int) else pw.varint_len(v)
        inner = 1 + pw.varint_len(np.asarray([name_iid], np.uint64))[0] + len(pw.pv(tag)) + vlen
        self.te += [T_ANN, inner if isinstance(inner, np.ndarray) else int(inner)]
        self.te += [T_DA_NAME, name_iid, tag, v]
        return self

    def sort(self) -> None:
        """Put the rows in (ts, sub1, sub2) order (a no-op when they already are)."""
        ts = self.ts
        if self.n < 2:
            return
        d = np.diff(ts)
        if (d > 0).all():
            return
        s1 = np.broadcast_to(np.asarray(self.sub1, np.int64), (self.n,))
        s2 = np.broadcast_to(np.asarray(self.sub2, np.int64), (self.n,))
        o = np.lexsort((s2, s1, ts))
        if (o == np.arange(self.n)).all():
            return
        self.ts = ts[o]
        self.sub1 = s1[o]
        self.sub2 = s2[o]
        self.te = [c if isinstance(c, (int, np.integer)) else c[o] for c in self.te]

    def build(self, delta: U64) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.bool_]]:
        """The packets' bytes, one row each, with ``delta`` ts, and the mask of bytes in use.

        Each field gets a column of bytes as wide as its longest varint in an (n, width) matrix;
        the mask keeps the bytes each row really uses, so packing is one boolean index. Runs of
        fields that are the same in every row are one block of bytes.
        """
        n = self.n
        te = _segments(self.te, n)
        te_len = sum(len(x) if isinstance(x, bytes) else x[1] for x in te)
        te_col = np.broadcast_to(np.asarray(te_len, np.uint64), (n,))
        te_vl = pw.varint_len(te_col)
        delta_vl = pw.varint_len(delta)
        body = 1 + delta_vl + 3 + te_vl + np.asarray(te_len, np.int64)  # ts tag; seq, te tags
        body_col = np.broadcast_to(np.asarray(body, np.uint64), (n,))
        segs: list[bytes | tuple[U64, I64]] = [
            _pvb(T_PACKET),
            (body_col, pw.varint_len(body_col)),
            _pvb(T_TS),
            (delta, delta_vl),
            _pvb(T_SEQ) + _pvb(SEQ) + _pvb(T_TE),
            (te_col, te_vl),
            *te,
        ]
        widths = [len(x) if isinstance(x, bytes) else int(x[1].max()) if n else 1 for x in segs]
        width = sum(widths)
        # column-major: each byte column is written in one contiguous run
        m = np.empty((n, width), np.uint8, order="F")
        keep = np.ones((n, width), bool, order="F")
        o = 0
        for seg, w in zip(segs, widths, strict=True):
            if isinstance(seg, bytes):
                m[:, o : o + w] = np.frombuffer(seg, np.uint8)
            else:
                v, ln = seg
                for b in range(w):
                    byte = (v & np.uint64(0x7F)).astype(np.uint8)
                    if b + 1 < w:
                        byte |= (ln > b + 1).astype(np.uint8) << np.uint8(7)
                        v = v >> np.uint64(7)
                    m[:, o + b] = byte
                    if b:
                        keep[:, o + b] = ln > b
            o += w
        return m, keep


@functools.lru_cache(maxsize=4096)
def _pvb(n: int) -> bytes:
    return pw.pv(n)


def _segments(fields: list[int | U64], n: int) -> list[bytes | tuple[U64, I64]]:
    """Flat varint fields as blocks of constant bytes and (values, lengths) columns; a column
    holding one value is a constant."""
    out: list[bytes | tuple[U64, I64]] = []
    for c in fields:
        if not isinstance(c, (int, np.integer)):
            a = np.asarray(c).astype(np.uint64, copy=False)
            if n and not (a != a[0]).any():
                c = int(a[0])
            else:
                out.append((a, pw.varint_len(a)))
                continue
        b = _pvb(int(c))
        if out and isinstance(out[-1], bytes):
            out[-1] += b
        else:
            out.append(b)
    return out


class _Rich:
    """Packets with strings or doubles (user args): few, encoded one by one."""

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.cls: list[int] = []
        self.sub1: list[int] = []
        self.sub2: list[int] = []
        self.te: list[bytes] = []
        self.track: list[int] = []

    def add(self, ts: int, cls: int, sub1: int, sub2: int, te: bytes, track: int = 0) -> None:
        self.track.append(track)
        self.ts.append(ts)
        self.cls.append(cls)
        self.sub1.append(sub1)
        self.sub2.append(sub2)
        self.te.append(te)


class _Encoder:
    """Interning, tracks and clock state shared by the chunks of one file."""

    def __init__(self, header: dict[str, Any]) -> None:
        self.header = header
        self.pid = int(header.get("pid") or 1)
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.ann_names: dict[str, int] = {}
        self.ann_strs: dict[str, int] = {}
        self.new_interned: list[bytes] = []
        self.new_user_args: list[int] = []  # annotation names of user arguments, new in this chunk
        self.chunk_pass = 0  # the chunk's most common pass folded into a GPU slice (an interned string)
        self._str_of: dict[int, str] = {}  # interned strings by iid
        self.tracks: dict[tuple[int, int, int], int] = {}
        self.new_tracks: list[list[int]] = []
        self.descriptors: list[bytes] = []
        self.threads: dict[ThreadInfo, int] = {}
        self.queues: dict[QueueInfo, int] = {}
        self.new_threads: list[ThreadInfo] = []
        self.new_queues: list[QueueInfo] = []
        self.procs: dict[int, int] = {}
        self.rows = 0
        self.chunks = 0
        self.depth: dict[int, int] = {}
        self.ops = 0  # operations written so far
        self.last_unc = 0  # the last GPU scope's alignment uncertainty (written where it changes)
        self.row_track = np.zeros(0, np.int64)  # the chunk's CPU track per scope
        self.lane_end: dict[tuple[int, int], list[int]] = {}
        self.lane_carry = LaneCarry()  # GPU queue tracks' open slices, across chunks
        self.last_ts = int(header.get("base_ns", header.get("start_ns", 0)) or 0)
        self.t0 = self.last_ts
        procs = header.get("processes")
        self.tid_pid: dict[int, int] = {}
        self.proc_label: dict[int, str] = {}
        if isinstance(procs, list):
            for p in procs:
                for tid in p.get("tids") or []:
                    self.tid_pid[int(tid)] = int(p["pid"])
                self.proc_label[int(p["pid"])] = str(p.get("label") or f"python {p['pid']}")

    # interning
    def _intern(self, table: dict[str, int], field: int, s: str) -> int:
        iid = table.get(s)
        if iid is None:
            iid = table[s] = len(table) + 1
            self.new_interned.append(pw.fb(field, pw.fv(1, iid) + pw.fs(2, s)))
        return iid

    def name(self, s: str) -> int:
        return self._intern(self.names, ID_NAMES, s)

    def cat(self, s: str) -> int:
        return self._intern(self.cats, ID_CATS, s)

    def ann_name(self, s: str) -> int:
        return self._intern(self.ann_names, ID_ANN_NAMES, s)

    def ann_str(self, s: str) -> int:
        iid = self._intern(self.ann_strs, ID_ANN_STRS, s)
        self._str_of[iid] = s
        return iid

    def user_ann_name(self, s: str) -> int:
        """A user argument's name: interned apart from gputrace's own annotation names (a user
        argument may be called "scope"), and listed in the chunk index as one."""
        key = "\0" + s
        iid = self.ann_names.get(key)
        if iid is None:
            iid = self.ann_names[key] = len(self.ann_names) + 1
            self.new_interned.append(pw.fb(ID_ANN_NAMES, pw.fv(1, iid) + pw.fs(2, s)))
            self.new_user_args.append(iid)
        return iid

    # tracks
    def _track(self, key: tuple[int, int, int], desc: Callable[[int], bytes]) -> int:
        uuid = self.tracks.get(key)
        if uuid is None:
            uuid = self.tracks[key] = len(self.tracks) + 1
            self.new_tracks.append([uuid, *key])
            self.descriptors.append(_seq(pw.fb(P_TRACK, pw.fv(1, uuid) + desc(uuid))))
        return uuid

    def proc(self, pid: int, label: str) -> int:
        return self._track((K_PROC, pid, 0), lambda _u: pw.fb(3, pw.fv(1, pid) + pw.fs(6, label)))

    def python_proc(self, pid: int) -> int:
        label = self.proc_label.get(pid)
        if label is None:
            rank = self.header.get("rank")
            label = f"python {pid}" if rank is None else f"python {pid} (rank {rank})"
        return self.proc(pid, label)

    def thread_track(self, th: int, lane: int) -> int:
        info = self.new_or_known_thread(th)
        pid = self.tid_pid.get(info.tid, self.pid)
        parent = self.python_proc(pid)
        tid = info.tid + lane * OVERLAP_TID_STEP
        label = info.name if not lane else f"{info.name} (overlap {lane})"
        return self._track(
            (K_THREAD, th, lane),
            lambda _u: pw.fv(5, parent) + pw.fb(4, pw.fv(1, pid) + pw.fv(2, tid) + pw.fs(5, label)),
        )

    def new_or_known_thread(self, th: int) -> ThreadInfo:
        return self.thread_list[th]

    @property
    def thread_list(self) -> list[ThreadInfo]:
        return list(self.threads)

    def gpu_proc(self, dev: int) -> int:
        qs = [q for q in self.queues if q.device == dev]
        dname = qs[0].device_name if qs else "GPU"
        backend = qs[0].backend if qs else ""
        self.python_proc(self.pid)  # the Python process first
        return self.proc(GPU_PID_BASE + dev, f"GPU {dev} · {dname} · {backend}")

    def queue_info(self, qi: int) -> tuple[int, str]:
        if qi < 0:
            return 0, "queue"
        q = list(self.queues)[qi]
        return q.device, q.label

    def queue_track(self, qi: int, lane: int) -> int:
        dev, label = self.queue_info(qi)
        parent = self.gpu_proc(dev)
        tid = qi + 1 + lane * OVERLAP_TID_STEP
        label = label if not lane else f"{label} (overlap {lane})"
        return self._track(
            (K_QUEUE, qi, lane),
            lambda _u: (
                pw.fv(5, parent) + pw.fb(4, pw.fv(1, GPU_PID_BASE + dev) + pw.fv(2, tid) + pw.fs(5, label))
            ),
        )

    def queued_track(self, qi: int, lane: int) -> int:
        dev, label = self.queue_info(qi)
        parent = self.gpu_proc(dev)
        return self._track((K_QUEUED, qi, lane), lambda _u: pw.fv(5, parent) + pw.fs(2, f"queued · {label}"))

    def ops_track(self, qi: int, lane: int) -> int:
        dev, label = self.queue_info(qi)
        parent = self.gpu_proc(dev)
        tid = OP_TID_BASE + qi + lane * OVERLAP_TID_STEP
        label = f"{label} · operations" + (f" (overlap {lane})" if lane else "")
        return self._track(
            (K_OPS, qi, lane),
            lambda _u: (
                pw.fv(5, parent) + pw.fb(4, pw.fv(1, GPU_PID_BASE + dev) + pw.fv(2, tid) + pw.fs(5, label))
            ),
        )

    def depth_track(self, qi: int) -> int:
        dev, label = self.queue_info(qi)
        parent = self.gpu_proc(dev)
        return self._track(
            (K_DEPTH, qi, 0), lambda _u: pw.fv(5, parent) + pw.fs(2, f"queue depth · {label}") + pw.fb(8, b"")
        )

    # the preamble and the end
    def preamble(self) -> bytes:
        head = HEADER_TAG + json_bytes(self.header)
        interned = pw.fb(ID_ANN_STRS, pw.fv(1, META_IID) + pw.fb(2, head))
        first = _seq(
            pw.fv(P_FLAGS, SEQ_INCREMENTAL_STATE_CLEARED)
            + pw.fb(P_DEFAULTS, pw.fv(58, CLK))
            + pw.fb(P_INTERNED, interned)
        )
        clocks = pw.fb(1, pw.fv(1, MONO) + pw.fv(2, self.t0)) + pw.fb(
            1, pw.fv(1, CLK) + pw.fv(2, self.t0) + pw.fv(3, 1)
        )
        snapshot = _seq(pw.fb(P_CLOCK, clocks + pw.fv(2, MONO)))
        self.python_proc(self.pid)
        out = first + snapshot + b"".join(self.descriptors)
        self.descriptors.clear()
        self.new_tracks.clear()
        return out

    def ending(self, header: dict[str, Any]) -> bytes:
        # threads and queues: the chunk indexes list them; explanations follow from the kinds
        header = {
            k: v
            for k, v in dict(header).items()
            if k not in ("threads", "queues")
        }
        head = FINAL_TAG + zlib.compress(json_bytes(header), 6)
        iid = META_IID + 1 + self.chunks
        out = _seq(pw.fb(P_INTERNED, pw.fb(ID_ANN_STRS, pw.fv(1, iid) + pw.fb(2, head))))
        # each GPU clock fit as two snapshots of (session clock, GPU clock)
        for c in header.get("clock") or []:
            try:
                fit = ClockFit.from_dict(c)
                dev = int(c["device"])
            except (KeyError, TypeError, ValueError):
                continue
            if not 0 <= dev < CLK - 1 or not fit.slope > 0:
                continue
            for cpu in sorted({fit.first_cpu_ns, fit.last_cpu_ns}):
                gpu = fit.gpu_ref_ns + round((cpu - fit.cpu_ref_ns) / fit.slope)
                if cpu < 0 or gpu < 0:
                    continue
                clocks = pw.fb(1, pw.fv(1, MONO) + pw.fv(2, cpu)) + pw.fb(
                    1, pw.fv(1, GPU_CLOCK + dev) + pw.fv(2, gpu)
                )
                out += _seq(pw.fb(P_CLOCK, clocks))
        return out

    # one chunk
    def chunk(self, t: Trace) -> bytes:
        s = t.scopes
        n = len(s)
        r0 = self.rows
        # threads, queues: by value, in the order the chunk lists them
        th_map = np.zeros(max(len(t.threads), 1), np.int64)
        for i, info in enumerate(t.threads):
            g = self.threads.get(info)
            if g is None:
                g = self.threads[info] = len(self.threads)
                self.new_threads.append(info)
            th_map[i] = g
        q_map = np.zeros(max(len(t.queues), 1) + 1, np.int64)  # index qi + 1 (qi = -1 → -1)
        q_map[0] = -1
        for i, q in enumerate(t.queues):
            g = self.queues.get(q)
            if g is None:
                g = self.queues[q] = len(self.queues)
                self.new_queues.append(q)
            q_map[i + 1] = g
        kinds: list[_Events] = []
        rich = _Rich()
        name_iid = np.array([self.name(x) for x in t.names], np.int64) if t.names else np.zeros(1, np.int64)
        thread = th_map[s.thread] if n else np.zeros(0, np.int64)
        queue = q_map[s.queue + 1] if n else np.zeros(0, np.int64)
        has_gpu = s.gpu_start_ns != NO_TIME
        rows = np.arange(n, dtype=np.int64)
        gids = r0 + rows + 1  # flow ids
        self.chunk_pass = 0
        self._cpu(t, thread, name_iid, has_gpu, gids, kinds, rich)
        self._gpu(t, queue, name_iid, has_gpu, gids, kinds)
        self._marks(t, th_map, kinds, rich)
        self._ops(t, th_map, q_map, kinds)
        data = self._assemble(kinds, rich)
        region, rich_at = data
        self.rows += n
        self.chunks += 1
        index = {
            "chunk": self.chunks,
            "rows": r0,
            "n": n,
            "bytes": len(region),
            "rich": rich_at,
            "threads": [[th.tid, th.name] for th in self.new_threads],
            "queues": [_queue_dict(q) for q in self.new_queues],
            "tracks": self.new_tracks,
        }
        if self.new_user_args:
            index["args"] = self.new_user_args
        if self.chunk_pass:  # the pass of every GPU slice that names none (and is not "no_pass")
            index["pass"] = self.chunk_pass
        self.new_threads, self.new_queues, self.new_tracks, self.new_user_args = [], [], [], []
        idx = CHUNK_TAG + orjson.dumps(index)
        self.new_interned.append(pw.fb(ID_ANN_STRS, pw.fv(1, META_IID + 1 + self.chunks) + pw.fb(2, idx)))
        head = b"".join(self.descriptors) + _seq(pw.fb(P_INTERNED, b"".join(self.new_interned)))
        self.descriptors.clear()
        self.new_interned.clear()
        return head + region

    def _cpu(
        self,
        t: Trace,
        thread: I64,
        name_iid: I64,
        has_gpu: npt.NDArray[np.bool_],
        gids: I64,
        kinds: list[_Events],
        rich: _Rich,
    ) -> None:
        s = t.scopes
        n = len(s)
        self.row_track = np.zeros(0, np.int64)
        if not n:
            return
        lane = np.zeros(n, np.int64)
        par = np.maximum(s.parent, 0)
        bad = (s.parent >= 0) & (s.cpu_end_ns > s.cpu_end_ns[par])
        if bad.any():  # interleaved coroutines: partial overlaps go to extra tracks
            for th in distinct(s.thread[bad]).tolist():
                rr = np.flatnonzero(s.thread == th)
                lane[rr] = LaneCarry().lanes(("cpu", th), s.cpu_start_ns[rr], s.cpu_end_ns[rr])
        track = self._tracks_for(thread, lane, self.thread_track)
        self.row_track = track
        start, end = s.cpu_start_ns, s.cpu_end_ns
        rows = np.arange(n, dtype=np.int64)
        fl_name = self.ann_name("flags")
        flags_iid = self._per_value(s.flags, lambda f: self.ann_str(", ".join(flag_names(f))) if f else 0)
        with_args = np.zeros(n, bool)
        if s.args:
            with_args[np.fromiter(s.args.keys(), np.int64, len(s.args))] = True
        # begins: row order is (start, thread, -end), what nesting needs at equal times
        for g in (False, True):
            for f in (False, True):
                m = (has_gpu == g) & ((flags_iid > 0) == f) & ~with_args
                if not m.any():
                    continue
                ev = _Events(start[m], 1, -end[m], rows[m])
                ev.field(T_TYPE, SLICE_BEGIN).field(T_TRACK, track[m]).field(T_NAME, name_iid[s.name[m]])
                if g:
                    ev.field(T_FLOW, gids[m])
                if f:
                    ev.ann(fl_name, T_DA_STR_IID, flags_iid[m])
                kinds.append(ev)
        rich_rows = self._arg_groups(t, rows, track, name_iid, has_gpu, gids, flags_iid, kinds)
        for r in rich_rows:
            te = (
                pw.fv(TE_TYPE, SLICE_BEGIN)
                + pw.fv(TE_TRACK, int(track[r]))
                + pw.fv(TE_NAME, int(name_iid[s.name[r]]))
            )
            if has_gpu[r]:
                te += pw.fv(TE_FLOW, int(gids[r]))
            if flags_iid[r]:
                te += pw.fb(TE_ANN, pw.fv(DA_NAME, fl_name) + pw.fv(DA_STR_IID, int(flags_iid[r])))
            te += self._args(s.args[r])
            rich.add(int(start[r]), 1, -int(end[r]), r, te, int(track[r]))
        # ends: inner first at equal times (later start, then later row); zero-length after begins
        kinds += _slice_ends(end, start, rows, track)

    def _arg_groups(
        self,
        t: Trace,
        rows: I64,
        track: I64,
        name_iid: I64,
        has_gpu: npt.NDArray[np.bool_],
        gids: I64,
        flags_iid: I64,
        kinds: list[_Events],
    ) -> list[int]:
        """Begins of the scopes with arguments: those whose arguments are integers, booleans and
        strings, grouped by their keys and types, as varint packets (the keys interned as user
        arguments, listed in the chunk index; strings interned); the rest one by one (returned)."""
        s = t.scopes
        groups: dict[tuple[tuple[str, type], ...], list[int]] = {}
        rich: list[int] = []
        for r, a in s.args.items():
            sig = _arg_signature(a)
            if sig is None:
                rich.append(r)
            else:
                groups.setdefault(sig, []).append(r)
        if len(groups) > MAX_ARG_GROUPS:  # many shapes: the largest groups go as columns
            big = sorted(groups, key=lambda k: -len(groups[k]))
            for sig in big[MAX_ARG_GROUPS:]:
                rich += groups.pop(sig)
        start, end = t.scopes.cpu_start_ns, t.scopes.cpu_end_ns
        for sig, rr in groups.items():
            r_all = np.array(sorted(rr), np.int64)
            cols = [(key, [s.args[r][key] for r in r_all.tolist()], kind) for key, kind in sig]
            for g in (False, True):
                sel = has_gpu[r_all] == g
                if not sel.any():
                    continue
                m = r_all[sel]
                ev = _Events(start[m], 1, -end[m], rows[m])
                ev.field(T_TYPE, SLICE_BEGIN).field(T_TRACK, track[m]).field(T_NAME, name_iid[s.name[m]])
                if g:
                    ev.field(T_FLOW, gids[m])
                for key, values, kind in cols:
                    vals = [v for v, k in zip(values, sel.tolist(), strict=True) if k]
                    if kind is str:
                        iids = {v: self.ann_str(v) for v in dict.fromkeys(vals)}
                        ev.ann(
                            self.user_ann_name(key), T_DA_STR_IID, np.array([iids[v] for v in vals], np.int64)
                        )
                    else:
                        tag = T_DA_BOOL if kind is bool else T_DA_INT
                        ev.ann(self.user_ann_name(key), tag, np.array(vals, np.int64))
                self._emit(ev, [("flags", T_DA_STR_IID, flags_iid[m], flags_iid[m] > 0)], kinds)
        return sorted(rich)

    def _args(self, args: dict[str, Any]) -> bytes:
        out = b""
        for k, v in args.items():
            da = pw.fv(DA_NAME, self.ann_name(str(k)))
            if isinstance(v, bool):
                da += pw.fv(DA_BOOL, int(v))
            elif isinstance(v, int) and -(1 << 63) <= v < (1 << 63):
                da += pw.fv(DA_INT, v)
            elif isinstance(v, float):
                da += pw.fd(DA_DOUBLE, v)
            elif isinstance(v, str):
                da += pw.fs(DA_STR, v)
            else:
                da += pw.fb(DA_JSON, json_bytes(v))
            out += pw.fb(TE_ANN, da)
        return out

    def _gpu(
        self,
        t: Trace,
        queue: I64,
        name_iid: I64,
        has_gpu: npt.NDArray[np.bool_],
        gids: I64,
        kinds: list[_Events],
    ) -> None:
        s = t.scopes
        rows = np.flatnonzero(has_gpu)
        if not len(rows):
            for qi in range(len(self.queues)):
                self.queue_track(qi, 0)
            return
        st, en = s.gpu_start_ns[rows], s.gpu_end_ns[rows]
        q = queue[rows]
        lane = np.zeros(len(rows), np.int64)
        for qi in distinct(q).tolist():
            k = np.flatnonzero(q == qi)
            lane[k] = self.lane_carry.lanes(("gpu", qi), st[k], np.maximum(en[k], st[k]))
        track = self._tracks_for(q, lane, self.queue_track)
        for qi in range(len(self.queues)):
            self.queue_track(qi, 0)
        sub = s.submit_ns[rows]
        unc = s.uncertainty_ns[rows]
        flags = s.flags[rows]
        fl_iid = self._per_value(flags, lambda f: self.ann_str(", ".join(flag_names(f))) if f else 0)
        neg = en < st
        has_sub = sub != NO_TIME
        # the uncertainty is written where it changes (row order), and carried forward by the reader
        prev = np.empty(len(unc), np.int64)
        prev[0] = self.last_unc
        prev[1:] = unc[:-1]
        self.last_unc = int(unc[-1])
        ev = _Events(st, 1, -np.maximum(en, st), rows)
        ev.field(T_TYPE, SLICE_BEGIN).field(T_TRACK, track).field(T_NAME, name_iid[s.name[rows]])
        ev.field(T_TFLOW, gids[rows])
        implied = _implied_submission(q, st, sub)
        # a scope's one pass as long as its GPU slice: written as an argument of that slice
        fold, passes = fold_passes(t, rows)
        fold_iid = self._per_value(fold, lambda i: self.ann_str(t.names[i]) if i >= 0 else 0)
        # the chunk's most common folded label, where it is a generated one ("compute pass #1",
        # which says nothing a viewer misses), goes in its index once; the others say theirs
        labels, counts = np.unique(fold_iid[fold >= 0], return_counts=True)
        common = int(labels[np.argmax(counts)]) if len(labels) else 0
        self.chunk_pass = common if common and _GENERATED_PASS.fullmatch(self._str_of[common]) else 0
        other = (fold >= 0) & (fold_iid != self.chunk_pass)
        no_pass = (fold < 0) if self.chunk_pass else np.zeros(len(rows), bool)
        self._emit(
            ev,
            [
                ("uncertainty_ns", T_DA_INT, unc, unc != prev),
                ("submit_to_start_ns", T_DA_INT, st - sub, has_sub & ~implied),
                ("no_submit", T_DA_INT, np.ones(len(rows), np.int64), ~has_sub & ~implied),
                ("flags", T_DA_STR_IID, fl_iid, fl_iid > 0),
                ("gpu_ns", T_DA_INT, en - st, neg),
                ("pass", T_DA_STR_IID, fold_iid, other),
                ("no_pass", T_DA_INT, np.ones(len(rows), np.int64), no_pass),
            ],
            kinds,
        )
        self._passes(t, rows, track, kinds, passes)
        # anomalies on the GPU slice
        an = np.flatnonzero(flags & np.uint32(int(ANOMALY_FLAGS)))
        if len(an):
            cat = self.cat("anomaly")
            n_scope = self.ann_name("scope")
            iid = self._per_value(
                flags[an] & np.uint32(int(ANOMALY_FLAGS)),
                lambda f: self.name("anomaly: " + ", ".join(flag_names(f))),
            )
            ev = _Events(st[an], 3, 0, rows[an])
            ev.field(T_TYPE, INSTANT).field(T_TRACK, track[an]).field(T_NAME, iid).field(T_CAT, cat)
            kinds.append(ev.ann(n_scope, T_DA_INT, self.rows + rows[an]))
        # queue depth: submitted, not finished (a nested scope's work is counted by its parent). Each
        # sample rides on the event at its time where there is one (the wait's begin, the GPU end)
        g = len(rows)
        plus = np.zeros(g, np.int64)  # depth after this scope's submission
        minus = np.zeros(g, np.int64)  # depth after its GPU work ended
        counted = np.zeros(g, bool)
        dtrack = np.zeros(g, np.int64)
        cnt = np.flatnonzero(has_sub & (q >= 0))
        if len(cnt):
            par = s.parent[rows[cnt]]
            pp = np.maximum(par, 0)
            nested = (par >= 0) & has_gpu[pp] & (s.queue[pp] == s.queue[rows[cnt]])
            cnt = cnt[~nested]
        if len(cnt):
            tq = np.concatenate([sub[cnt], np.maximum(en[cnt], sub[cnt])])
            dq = np.concatenate([np.ones(len(cnt), np.int64), -np.ones(len(cnt), np.int64)])
            qq = np.concatenate([q[cnt], q[cnt]])
            who = np.concatenate([cnt, cnt])
            order = np.lexsort((dq, tq, qq))
            tq, dq, qq, who = tq[order], dq[order], qq[order], who[order]
            val = np.empty(len(tq), np.int64)
            for qi in distinct(qq).tolist():
                k = np.flatnonzero(qq == qi)
                val[k] = self.depth.get(qi, 0) + np.cumsum(dq[k])
                self.depth[qi] = int(val[k[-1]])
            up = dq > 0
            plus[who[up]] = val[up]
            minus[who[~up]] = val[~up]
            counted[cnt] = True
            dtrack[cnt] = self._per_value(q[cnt], self.depth_track)
        gap_ok = has_sub & (st >= sub)
        on_wait = counted & gap_ok
        on_end = counted & (en >= st) & (en >= sub)
        # GPU ends
        ge = np.maximum(en, st)
        zero = ge == st
        for z in (False, True):
            for c in (False, True):
                m = (zero == z) & (on_end == c)
                if m.any():
                    ev = _Events(ge[m], 2 if z else 0, -st[m], -rows[m])
                    ev.field(T_TYPE, SLICE_END).field(T_TRACK, track[m])
                    if c:
                        ev.field(T_EXTRA_TRACK, dtrack[m]).field(T_EXTRA_VALUE, minus[m])
                    kinds.append(ev)
        # queued: submission -> GPU start, on lanes of "queued · <queue>" tracks
        w = np.flatnonzero(gap_ok)
        if len(w):
            qlane = np.zeros(len(w), np.int64)
            for qi in distinct(q[w]).tolist():
                k = np.flatnonzero(q[w] == qi)
                qlane[k] = self._carry(
                    (K_QUEUED, qi), _disjoint_lanes(sub[w][k], st[w][k]), sub[w][k], st[w][k]
                )
            qtrack = self._tracks_for(q[w], qlane, self.queued_track)
            qname = self._per_value(q[w], lambda x: self.name(f"queued · {self.queue_info(x)[1]}"))
            for c in (False, True):
                m = on_wait[w] == c
                if m.any():
                    wm = w[m]
                    qb = _Events(sub[wm], 1, -st[wm], rows[wm])
                    qb.field(T_TYPE, SLICE_BEGIN).field(T_TRACK, qtrack[m]).field(T_NAME, qname[m])
                    if c:
                        qb.field(T_EXTRA_TRACK, dtrack[wm]).field(T_EXTRA_VALUE, plus[wm])
                    kinds.append(qb)
            kinds += _slice_ends(st[w], sub[w], rows[w], qtrack)
        # samples with no event of their own time
        alone_p = np.flatnonzero(counted & ~on_wait)
        alone_m = np.flatnonzero(counted & ~on_end)
        if len(alone_p) or len(alone_m):
            k = np.concatenate([alone_p, alone_m])
            tc = np.concatenate([sub[alone_p], np.maximum(en[alone_m], sub[alone_m])])
            vc = np.concatenate([plus[alone_p], minus[alone_m]])
            ev = _Events(tc, 4, 0, np.arange(len(k), dtype=np.int64))
            kinds.append(ev.field(T_TYPE, COUNTER).field(T_TRACK, dtrack[k]).field(T_COUNTER, vc))

    def _carry(self, key: tuple[int, int], lanes: I64, st: I64, en: I64) -> I64:
        """Lanes of this chunk's slices on one queue, renumbered so that no slice shares a track
        with a slice of an earlier chunk that it overlaps (each earlier lane: its last end)."""
        ends = self.lane_end.setdefault(key, [])
        out = np.empty(len(lanes), np.int64)
        taken: set[int] = set()
        for j in distinct(lanes).tolist():
            m = lanes == j
            lo, hi = int(st[m].min()), int(en[m].max())
            g = next((g for g, e in enumerate(ends) if e <= lo and g not in taken), len(ends))
            if g == len(ends):
                ends.append(hi)
            else:
                ends[g] = max(ends[g], hi)
            taken.add(g)
            out[m] = g
        return out

    @staticmethod
    def _per_value(col: npt.NDArray[Any], fn: Callable[[int], int]) -> I64:
        """``fn`` of each value of ``col``, called once per distinct value."""
        if not len(col):
            return np.zeros(0, np.int64)
        keys, inv = _distinct(col)
        return np.array([fn(int(x)) for x in keys.tolist()], np.int64)[inv]

    def _tracks_for(self, q: I64, lane: I64, make: Callable[[int, int], int]) -> I64:
        """Track uuid per row for (thread or queue, lane) pairs, made on first use."""
        code = (q + 1) * (1 << 32) + lane
        if len(code) and (code == code[0]).all():
            return np.full(len(code), make(int(q[0]), int(lane[0])), np.int64)
        keys, inv = np.unique(code, return_inverse=True)
        lut = np.array([make(int(c >> 32) - 1, int(c & 0xFFFFFFFF)) for c in keys.tolist()], np.int64)
        out: I64 = lut[inv.reshape(-1)]
        return out

    def _passes(self, t: Trace, rows: I64, track: I64, kinds: list[_Events], k: I64) -> None:
        """Passes ``k`` (span rows; those not folded into their scope's GPU slice), as its children."""
        sp = t.spans
        if not len(k):
            return
        pos = np.searchsorted(rows, sp.scope[k])
        st, en, sub = sp.gpu_start_ns[k], sp.gpu_end_ns[k], sp.submit_ns[k]
        label = self._per_value(sp.label[k], lambda i: self.name(t.names[i]))
        scope_sub = t.scopes.submit_ns[sp.scope[k]]
        neg = en < st
        ge = np.maximum(en, st)
        order_key = np.arange(len(k), dtype=np.int64) + (1 << 40)  # after their scope's begin
        ev = _Events(st, 1, -ge, order_key)
        ev.field(T_TYPE, SLICE_BEGIN).field(T_TRACK, track[pos]).field(T_NAME, label)
        # a pass submitted with its scope (the usual case) says nothing of its submission
        self._emit(
            ev,
            [
                ("scope", T_DA_INT, self.rows + sp.scope[k], np.ones(len(k), bool)),
                ("submit_to_start_ns", T_DA_INT, st - sub, (sub != NO_TIME) & (sub != scope_sub)),
                ("no_submit", T_DA_INT, np.ones(len(k), np.int64), (sub == NO_TIME) & (scope_sub != NO_TIME)),
                ("gpu_ns", T_DA_INT, en - st, neg),
            ],
            kinds,
        )
        kinds += _slice_ends(ge, st, order_key, track[pos])

    def _emit(
        self, ev: _Events, anns: list[tuple[str, int, I64, npt.NDArray[np.bool_]]], kinds: list[_Events]
    ) -> None:
        """``ev`` (fixed fields set) once per pattern of which optional annotations its rows have."""
        n = ev.n
        code = np.zeros(n, np.int64)
        for bit, (_name, _tag, _v, has) in enumerate(anns):
            code |= has.astype(np.int64) << bit
        for c in _distinct(code)[0].tolist() if n else []:
            m = code == c
            sub = _Events(ev.ts[m], ev.cls, _take(ev.sub1, m), _take(ev.sub2, m))
            sub.te = [x if isinstance(x, (int, np.integer)) else x[m] for x in ev.te]
            for bit, (name, tag, v, _has) in enumerate(anns):
                if c >> bit & 1:
                    sub.ann(self.ann_name(name), tag, v[m])
            kinds.append(sub)

    def _ops(self, t: Trace, th_map: I64, q_map: I64, kinds: list[_Events]) -> None:
        """Per-operation records: each operation a slice on its stream's operations track, its
        launch call a slice inside its scope on the CPU (once per call), a flow between them."""
        ops = getattr(t, "ops", None)
        if ops is None or not len(ops):
            return
        n = len(ops)
        k = np.arange(n, dtype=np.int64)
        s = t.scopes
        queue = q_map[ops.queue + 1]
        st, en = ops.gpu_start_ns, ops.gpu_end_ns
        ge = np.maximum(en, st)
        lane = np.zeros(n, np.int64)
        for qi in distinct(queue).tolist():
            m = np.flatnonzero(queue == qi)
            lane[m] = self._carry((K_OPS, qi), _disjoint_lanes(st[m], ge[m]), st[m], ge[m])
        track = self._tracks_for(queue, lane, self.ops_track)
        name_iid = self._per_value(ops.name, lambda i: self.name(t.names[i]))
        cat = self._per_value(ops.kind, lambda x: self.cat(OP_CATS[x] if 0 <= x < len(OP_CATS) else "kernel"))
        gop = self.ops + k
        scope = ops.scope.astype(np.int64)
        has_scope = scope >= 0
        glob_scope = np.where(has_scope, self.rows + scope, -1)
        thread = np.where(ops.thread >= 0, th_map[np.maximum(ops.thread, 0)], -1)
        default_thread = np.where(has_scope, th_map[s.thread[np.maximum(scope, 0)]] if len(s) else -1, -1)
        seen = ops.call_start_ns != NO_TIME
        shape = np.concatenate([ops.grid, ops.block], axis=1)
        has_shape = np.asarray(shape.any(axis=1), bool)
        shape_iid = np.zeros(n, np.int64)
        if has_shape.any():
            shapes, which = _distinct_rows(shape[has_shape])
            iids = [self.ann_str(",".join(map(str, x))) for x in shapes]
            shape_iid[has_shape] = np.array(iids, np.int64)[which]
        call_iid = self._per_value(ops.call_name, lambda i: self.ann_str(t.names[i]))
        drawn = np.zeros(n, bool)  # the launch call is drawn (and the flow with it)
        cand = np.flatnonzero(seen & has_scope & (ops.thread >= 0))
        if len(cand) and len(s):
            r = scope[cand]
            inside = (s.cpu_start_ns[r] <= ops.call_start_ns[cand]) & (
                ops.call_end_ns[cand] <= s.cpu_end_ns[r]
            )
            inside &= th_map[s.thread[r]] == thread[cand]
            cand = cand[inside]
            cc = ops.correlation[cand]
            first = (
                np.arange(len(cand))
                if len(cand) < 2 or (cc[1:] > cc[:-1]).all()  # call ids in order, each once (the usual case)
                else np.unique(cc, return_index=True)[1]
            )
            drawn[cand[first]] = True
        ev = _Events(st, 1, 2 * gop, gop)
        ev.field(T_TYPE, SLICE_BEGIN).field(T_TRACK, track).field(T_NAME, name_iid).field(T_CAT, cat)
        anns: list[tuple[str, int, I64, npt.NDArray[np.bool_]]] = [
            ("scope", T_DA_INT, glob_scope, np.ones(n, bool)),
            ("correlation", T_DA_INT, ops.correlation.astype(np.int64), np.ones(n, bool)),
            ("thread", T_DA_INT, thread, np.asarray(thread != default_thread, bool)),
            ("grid,block", T_DA_STR_IID, shape_iid, has_shape),
            ("bytes", T_DA_INT, ops.bytes.astype(np.int64), ops.bytes != 0),
            ("graph id", T_DA_INT, ops.graph_id.astype(np.int64), ops.graph_id != 0),
            ("graph node id", T_DA_INT, ops.graph_node_id.astype(np.int64), ops.graph_node_id != 0),
            (
                "call",
                T_DA_STR_IID,
                call_iid,
                ops.call_name != t.names.index("") if "" in t.names else np.ones(n, bool),
            ),
            ("launch_to_start_ns", T_DA_INT, np.where(seen, st - ops.call_start_ns, 0), seen),
            ("call_ns", T_DA_INT, np.where(seen, ops.call_end_ns - ops.call_start_ns, 0), seen),
            ("gpu_ns", T_DA_INT, en - st, en < st),
        ]
        for with_flow in (False, True):
            m = drawn == with_flow
            if not m.any():
                continue
            sub = _Events(st[m], 1, 2 * gop[m], gop[m])
            sub.te = [x if isinstance(x, (int, np.integer)) else x[m] for x in ev.te]
            if with_flow:
                sub.field(T_TFLOW, OP_FLOW_BASE + gop[m])
            self._emit(sub, [(a, b, c[m], d[m]) for a, b, c, d in anns], kinds)
        zero = ge == st
        for z in (False, True):
            m = zero == z
            if m.any():
                e = _Events(ge[m], 1 if z else 0, 2 * gop[m] + 1 if z else -st[m], gop[m] if z else -gop[m])
                kinds.append(e.field(T_TYPE, SLICE_END).field(T_TRACK, track[m]))
        d = np.flatnonzero(drawn)
        if len(d):
            c0, c1 = ops.call_start_ns[d], ops.call_end_ns[d]
            ctrack = self.row_track[scope[d]]
            cname = self._per_value(ops.call_name[d], lambda i: self.name(t.names[i]))
            ccat = self._per_value(
                ops.call_name[d],
                lambda i: self.cat(CALL_CATS[0] if t.names[i].startswith("cuda") else CALL_CATS[1]),
            )
            big = (1 << 50) + gop[d]  # after the scopes at equal times: the call is inside its scope
            b = _Events(c0, 1, -c1, big)
            b.field(T_TYPE, SLICE_BEGIN).field(T_TRACK, ctrack).field(T_NAME, cname).field(T_CAT, ccat)
            kinds.append(b.field(T_FLOW, OP_FLOW_BASE + gop[d]))
            kinds += _slice_ends(c1, c0, big, ctrack)
        self.ops += n

    def _marks(self, t: Trace, th_map: I64, kinds: list[_Events], rich: _Rich) -> None:
        plain: list[int] = []
        for i, m in enumerate(t.marks):
            if m.args:
                mark_track = self.thread_track(int(th_map[m.thread]), 0)
                te = pw.fv(TE_TYPE, INSTANT) + pw.fv(TE_TRACK, mark_track)
                te += (
                    pw.fv(TE_NAME, self.name(m.name))
                    + pw.fv(TE_CAT, self.cat(m.kind))
                    + self._args(dict(m.args))
                )
                rich.add(m.ts_ns, 3, 0, i, te, mark_track)
            else:
                plain.append(i)
        if plain:
            ms = [t.marks[i] for i in plain]
            ev = _Events(np.array([m.ts_ns for m in ms], np.int64), 3, 0, np.array(plain, np.int64))
            ev.field(T_TYPE, INSTANT)
            ev.field(T_TRACK, np.array([self.thread_track(int(th_map[m.thread]), 0) for m in ms], np.int64))
            ev.field(T_NAME, np.array([self.name(m.name) for m in ms], np.int64))
            ev.field(T_CAT, np.array([self.cat(m.kind) for m in ms], np.int64))
            kinds.append(ev)

    def _assemble(self, kinds: list[_Events], rich: _Rich) -> tuple[bytes, list[list[int]]]:
        """All packets of the chunk in time order (ties on one track: what nesting needs), as one
        byte string, and where the rich packets are in it."""
        for k in kinds:
            k.sort()
        total = sum(k.n for k in kinds) + len(rich.ts)
        if not total:
            return b"", []

        def col(get: Callable[[_Events], Any], rich_vals: list[int]) -> I64:
            parts = [np.broadcast_to(np.asarray(get(k), np.int64), (k.n,)) for k in kinds]
            parts.append(np.asarray(rich_vals, np.int64))
            return np.concatenate(parts)

        ts = col(lambda k: k.ts, rich.ts)
        cls = col(lambda k: k.cls, rich.cls)
        key = (ts - ts.min()) * 8 + cls
        # the track too: only packets of one track at one time and class need the tie-breaks
        trk = col(lambda k: k.te[3] if k.te[2] == T_TRACK else 0, rich.track)
        nt = int(trk.max()) + 1
        if int(key.max()) < (1 << 62) // nt:
            key = key * nt + trk
        order = np.argsort(key, kind="stable")  # merges the kinds' sorted runs
        ks = key[order]
        tie = np.flatnonzero(ks[1:] == ks[:-1])
        if len(tie):  # equal time and class: order by the tie-breaks, whatever kind they come from
            in_tie = np.zeros(total, bool)
            in_tie[tie] = True
            in_tie[tie + 1] = True
            at = np.flatnonzero(in_tie)
            idx = order[at]
            sub1 = col(lambda k: k.sub1, rich.sub1)
            sub2 = col(lambda k: k.sub2, rich.sub2)
            order[at] = idx[np.lexsort((sub2[idx], sub1[idx], key[idx]))]
        pos = np.empty(total, np.int64)
        pos[order] = np.arange(total, dtype=np.int64)
        ts_sorted = ts[order]
        delta_sorted = np.empty(total, np.uint64)
        delta_sorted[0] = np.int64(int(ts_sorted[0]) - self.last_ts).astype(np.uint64)
        delta_sorted[1:] = np.diff(ts_sorted).astype(np.uint64)
        self.last_ts = int(ts_sorted[-1])
        nr = len(rich.ts)
        nv = total - nr
        is_rich = np.zeros(total, bool)
        is_rich[pos[nv:]] = True
        vorder = order[~is_rich] if nr else order  # varint packets, in time order
        built = []
        start = 0
        for k in kinds:
            built.append(k.build(delta_sorted[pos[start : start + k.n]]))
            start += k.n
        width = max((m.shape[1] for m, _k in built), default=1)
        if nv * width <= MATRIX_SLACK * sum(m.size for m, _k in built):
            # packets of similar widths: rows of one matrix, in time order, then the bytes in use
            vrow_of = np.empty(nv, np.int64)
            vrow_of[vorder] = np.arange(nv)
            big = np.zeros((nv, width), np.uint8)
            used = np.zeros((nv, width), bool)
            start = 0
            for m, keep in built:
                rows = vrow_of[start : start + len(m)]
                big[rows, : m.shape[1]] = m
                used[rows, : m.shape[1]] = keep
                start += len(m)
            out = big[used]
            dst = np.zeros(nv + 1, np.int64)
            np.cumsum(used.sum(axis=1), out=dst[1:])
        else:
            # each kind's packets packed in its own row order; then every byte gathered in time order
            buf = np.concatenate([m[keep] for m, keep in built])
            size = np.concatenate([keep.sum(axis=1, dtype=np.int64) for _m, keep in built])
            src = np.zeros(nv, np.int64)
            np.cumsum(size[:-1], out=src[1:])
            out_len = size[vorder]
            dst = np.zeros(nv + 1, np.int64)
            np.cumsum(out_len, out=dst[1:])
            idx_type = np.int32 if len(buf) < 1 << 31 else np.int64  # a byte index: half the memory
            shift = np.repeat((src[vorder] - dst[:-1]).astype(idx_type), out_len)
            shift += np.arange(len(shift), dtype=idx_type)
            out = buf[shift]
        if not nr:
            return out.tobytes(), []
        # rich packets go between the others, at their place in time
        vrow = np.cumsum(~is_rich) - 1  # row of each (time-ordered) packet among the varint ones
        segments: list[bytes] = []
        rich_at: list[list[int]] = []
        cut = 0
        length = 0
        for j in np.argsort(pos[nv:], kind="stable").tolist():
            at_j = int(pos[nv + j])
            body = pw.fv(P_TS, int(delta_sorted[at_j])) + pw.fv(P_SEQ, SEQ) + pw.fb(P_TE, rich.te[j])
            packet = _packet(body)
            here = int(dst[vrow[at_j] + 1])  # after the varint packets that come before it
            segments.append(out[cut:here].tobytes())
            length += here - cut
            rich_at.append([length, len(packet)])
            segments.append(packet)
            length += len(packet)
            cut = here
        segments.append(out[cut:].tobytes())
        return b"".join(segments), rich_at


def _distinct(col: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[np.intp]]:
    """The distinct values of an integer column (ascending) and each row's index among them:
    by a look-up table where the values span a small range (names, kinds, flags), else sorted."""
    lo, hi = int(col.min()), int(col.max())
    if lo == hi:
        return col[:1], np.zeros(len(col), np.intp)
    if hi - lo < 1 << 16:
        at = (col - lo).astype(np.intp)
        seen = np.zeros(hi - lo + 1, bool)
        seen[at] = True
        keys = np.flatnonzero(seen)
        lut = np.zeros(hi - lo + 1, np.intp)
        lut[keys] = np.arange(len(keys))
        return (keys + lo).astype(col.dtype), lut[at]
    keys, inv = np.unique(col, return_inverse=True)
    return keys, inv.reshape(-1)


def _slice_ends(end: I64, start: I64, key: I64, track: I64) -> list[_Events]:
    """The end events of slices [start, end] on ``track``: inner first at equal times (the later
    start, then the larger ``key``); a zero-length slice's end after the begins at its time."""
    out = []
    zero = end == start
    for z in (False, True):
        m = zero == z
        if m.any():
            ev = _Events(end[m], 2 if z else 0, -start[m], -key[m])
            out.append(ev.field(T_TYPE, SLICE_END).field(T_TRACK, track[m]))
    return out


def _take(v: I64 | int, m: npt.NDArray[np.bool_]) -> I64 | int:
    return v if isinstance(v, (int, np.integer)) else v[m]


def _disjoint_lanes(st: I64, en: I64) -> I64:
    """Lane per interval so each lane holds disjoint intervals (queued waits)."""
    n = len(st)
    order = np.lexsort((en, st))
    ss, ee = st[order], en[order]
    if n < 2 or (ss[1:] >= np.maximum.accumulate(ee)[:-1]).all():
        return np.zeros(n, np.int64)
    out = np.zeros(n, np.int64)
    if (np.diff(ee) >= 0).all():  # first in, first out (an in-order queue): lanes round-robin
        open_at = np.arange(n) + 1 - np.searchsorted(ee, ss, side="right")
        width = int(open_at.max())
        out[order] = np.arange(n) % width
        return out
    free: list[int] = []  # end time per lane
    for i in order.tolist():
        s0 = int(st[i])
        for ln, e in enumerate(free):
            if e <= s0:
                free[ln] = int(en[i])
                out[i] = ln
                break
        else:
            free.append(int(en[i]))
            out[i] = len(free) - 1
    return out


def _implied_submission(q: I64, st: I64, sub: I64) -> npt.NDArray[np.bool_]:
    """GPU slices whose submission the reader finds without an annotation: the start of the one
    wait slice of their chunk that ends at their GPU start on their queue, or no submission where
    there is none. Where two GPU slices of a queue start at the same time, each says it."""
    o = np.lexsort((st, q))
    same = (q[o][1:] == q[o][:-1]) & (st[o][1:] == st[o][:-1])
    shared = np.zeros(len(q), bool)
    shared[o[1:][same]] = True
    shared[o[:-1][same]] = True
    early = (sub != NO_TIME) & (st < sub)  # a start before submission: no wait slice
    out: npt.NDArray[np.bool_] = ~shared & ~early
    return out


def _arg_signature(args: dict[str, Any]) -> tuple[tuple[str, type], ...] | None:
    """Keys and types of arguments that varint packets can carry (integers within 64 bits,
    booleans, short strings), or None."""
    sig = []
    for k, v in args.items():
        tp = type(v)
        if not isinstance(k, str):
            return None
        if tp is int:
            if not -(1 << 63) <= v < (1 << 63):
                return None
        elif tp is str:
            if len(v) > MAX_ARG_STR:
                return None
        elif tp is not bool:
            return None
        sig.append((k, tp))
    return tuple(sig)


def _queue_dict(q: QueueInfo) -> dict[str, Any]:
    return {"device": q.device, "device_name": q.device_name, "backend": q.backend, "label": q.label}


class StreamWriter:
    """Append chunks to a ``.pftrace`` as a session runs; ``close`` writes the final header.

    Each ``append`` is one ``write`` to the OS, so after it returns the chunk survives the process
    being killed; a file cut inside a chunk loads every chunk before it.
    """

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = Path(path)
        self._enc = _Encoder(dict(header))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.closed = False
        self._write(self._enc.preamble())

    @property
    def rows(self) -> int:
        """Scopes written so far."""
        return self._enc.rows

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def append(self, chunk: Trace) -> None:
        self._write(self._enc.chunk(chunk))

    def close(self, header: dict[str, Any]) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._write(self._enc.ending(header))
        finally:
            os.close(self._fd)

    def abandon(self) -> None:
        """Close the file as it stands (what a crash would leave: it reads as truncated)."""
        if not self.closed:
            self.closed = True
            os.close(self._fd)


def _file_header(trace: Trace) -> dict[str, Any]:
    header = dict(trace.header)
    header["base_ns"] = export_base_ns(trace)
    header["threads"] = [{"tid": t.tid, "name": t.name} for t in trace.threads]
    header["queues"] = [_queue_dict(q) for q in trace.queues]
    return header


CHUNK_ROWS = 32_768  # a whole-trace write goes out in chunks of this many scopes (bounded memory)


def slice_rows(trace: Trace, a: int, b: int, t0: int, t1: int) -> Trace:
    """Scopes ``a``..``b-1`` of ``trace`` (their spans, and the marks in [t0, t1)) as a chunk."""
    s = trace.scopes
    c = ScopeTable.empty(b - a)
    for col in s.COLUMNS:
        setattr(c, col, getattr(s, col)[a:b])
    c.parent = np.where(c.parent >= a, c.parent - a, -1)
    c.args = {i - a: v for i, v in s.args.items() if a <= i < b}
    sp = trace.spans
    k = np.flatnonzero((sp.scope >= a) & (sp.scope < b))
    spans = SpanTable(
        sp.scope[k] - a, sp.label[k], sp.queue[k], sp.submit_ns[k], sp.gpu_start_ns[k], sp.gpu_end_ns[k]
    )
    marks = [m for m in trace.marks if t0 <= m.ts_ns < t1]
    return Trace(trace.header, trace.names, trace.threads, trace.queues, c, spans, marks, trace.clock_fits)


def _chunks(trace: Trace, rows: int = CHUNK_ROWS) -> list[Trace]:
    n = len(trace)
    if n <= rows or len(getattr(trace, "ops", ())):  # per-operation records: one chunk
        return [trace]
    starts = trace.scopes.cpu_start_ns
    out = []
    for a in range(0, n, rows):
        b = min(n, a + rows)
        t0 = int(starts[a]) if a else -(1 << 62)
        t1 = int(starts[b]) if b < n else 1 << 62
        out.append(slice_rows(trace, a, b, t0, t1))
    return out


def _stub(header: dict[str, Any]) -> dict[str, Any]:
    """What the file's first header needs when the whole header follows at the end."""
    keep = ("format_version", "version", "start_ns", "base_ns", "pid", "rank", "processes")
    return {k: header[k] for k in keep if k in header}


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as a Perfetto protobuf trace (atomically: a temporary file, then rename)."""
    p = Path(path)
    tmp = p.with_name(p.name + ".partial")
    header = _file_header(trace)
    w = StreamWriter(tmp, _stub(header))  # the whole header comes at the end
    try:
        for chunk in _chunks(trace):
            w.append(chunk)
        w.close(header)  # anomaly examples: the scope and kinds; the reader has the rest
    except BaseException:
        w.abandon()
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(p)
    return p


def dumps(trace: Trace) -> bytes:
    """The ``.pftrace`` bytes of ``trace``."""
    header = _file_header(trace)
    enc = _Encoder(_stub(header))
    return (
        enc.preamble()
        + b"".join(enc.chunk(c) for c in _chunks(trace))
        + enc.ending(header)
    )


# -- reading --------------------------------------------------------------------------------------


class _Packets:
    """The TrackEvent packets of a file, as columns (one row per packet, file order)."""

    def __init__(self) -> None:
        self.ts: list[npt.NDArray[Any]] = []
        self.type: list[npt.NDArray[Any]] = []
        self.track: list[npt.NDArray[Any]] = []
        self.name: list[npt.NDArray[Any]] = []
        self.cat: list[npt.NDArray[Any]] = []
        self.flow: list[npt.NDArray[Any]] = []
        self.tflow: list[npt.NDArray[Any]] = []
        self.chunk: list[npt.NDArray[Any]] = []
        self.ann: list[tuple[I64, I64, I64, I64]] = []  # packet, name iid, value tag, value
        self.args: dict[int, dict[str, Any]] = {}
        self.count = 0
        self.chunk_pass: list[int] = []  # per chunk: the pass of GPU slices that name none (0: none)


_TAG_CODE = np.zeros(1 << 16, np.uint8)  # every key of up to 16 bits (longer ones: the last entry)
for _code, _tag in enumerate((T_NAME, T_CAT, T_FLOW, T_TFLOW, T_DA_NAME), start=1):
    _TAG_CODE[_tag] = _code


class _Region:
    """The varint packets of one region, read a field at a time across all packets at once."""

    def __init__(self, flat: pw.U8, starts: npt.NDArray[np.intp]) -> None:
        self.flat = flat
        self.pos = starts + 1  # after each packet's key (one byte)

    def value(self) -> U64:
        """The varint at each packet's position; the positions move past it."""
        if len(self.pos) and self.pos[-1] >= len(self.flat):  # (packets are in order)
            raise PftraceError("an event packet is not laid out as gputrace writes it")
        v, self.pos = pw.read_at(self.flat, self.pos)
        return v

    def key(self, key: int) -> None:
        """Move past a one-byte key, which every packet must have here."""
        if len(self.pos) and (self.pos[-1] >= len(self.flat) or not (self.flat[self.pos] == key).all()):
            raise PftraceError("an event packet is not laid out as gputrace writes it")
        self.pos += 1


def _decode_region(
    region: memoryview,
    rich_at: list[list[int]],
    last_ts: int,
    pk: _Packets,
    ann_names: dict[int, str],
    strs: dict[int, str],
) -> int:
    """Decode one chunk's event packets into ``pk``; returns the clock after its last packet.

    Every field of a varint packet is a varint key and a varint value (nested messages too, as
    their length), so the varints' parity tells keys from values and finds each packet's key;
    from there the packets are read a field at a time, all at once: the fixed head, then the
    few fields that follow it, until each packet reaches the next one's start."""
    buf = np.frombuffer(region, np.uint8)
    keep = np.ones(len(buf), bool)
    for o, ln in rich_at:
        keep[o : o + ln] = False
    kept = np.flatnonzero(keep) if rich_at else None
    flat = buf[keep] if rich_at else buf
    starts = pw.one_byte_keys(flat, T_PACKET)  # each packet's first byte
    if starts is None:
        raise PftraceError("an event region is not a run of whole packets")
    npk = len(starts)
    if npk and starts[0] != 0:
        raise PftraceError("an event packet is not laid out as gputrace writes it")
    # packet order: varint packets and rich packets by their offset in the region
    total = npk + len(rich_at)
    if rich_at:
        assert kept is not None
        allpos = np.concatenate([kept[starts], np.array([o for o, _ in rich_at], np.int64)])
        order = np.argsort(allpos, kind="stable")
        rank = np.empty(total, np.int64)
        rank[order] = np.arange(total)
        vr, rr = rank[:npk], rank[npk:]
    else:
        vr, rr = np.arange(npk), np.zeros(0, np.int64)
    rd = _Region(flat, starts)
    rd.value()  # the packet's length (it ends where the next one starts)
    rd.key(T_TS)
    delta_v = rd.value()
    rd.key(T_SEQ)
    rd.value()
    rd.key(T_TE)
    rd.value()  # the track event's length (the rest of the packet)
    rd.key(T_TYPE)
    typ_v = rd.value()
    rd.key(T_TRACK)
    track_v = rd.value()
    delta = np.zeros(total, np.uint64)
    typ = np.zeros(total, np.int8)
    track = np.zeros(total, np.int32)
    name = np.zeros(total, np.int32)
    cat = np.zeros(total, np.int32)
    flow = np.zeros(total, np.int64)
    tflow = np.zeros(total, np.int64)
    if rich_at:
        delta[vr], typ[vr], track[vr] = delta_v, typ_v, track_v
    else:  # the varint packets are all there is, in order
        delta, typ, track = delta_v, typ_v.astype(np.int8), track_v.astype(np.int32)
    if npk:
        _read_rest(rd, starts, vr if rich_at else None, pk, (name, cat, flow, tflow))
    for j, (o, ln) in enumerate(rich_at):
        p = int(rr[j])
        d, t_, tr, nm, ct, fl, args = _decode_rich(region[o : o + ln], ann_names, strs)
        delta[p], typ[p], track[p], name[p], cat[p], flow[p] = d, t_, tr, nm, ct, fl
        if args:
            pk.args[pk.count + p] = args
    ts = last_ts + np.cumsum(delta.astype(np.int64))
    pk.ts.append(ts)
    pk.type.append(typ)
    pk.track.append(track)
    pk.name.append(name)
    pk.cat.append(cat)
    pk.flow.append(flow)
    pk.tflow.append(tflow)
    pk.chunk.append(np.full(total, len(pk.chunk), np.int64))
    pk.count += total
    return int(ts[-1]) if total else last_ts


# packets are read a field at a time while at least this many have a field left, and at least
# one in STEP_SHARE of them: the rest, all at once
STEP_MIN, STEP_SHARE = 2048, 16


def _read_rest(
    rd: _Region,
    starts: npt.NDArray[np.intp],
    vr: npt.NDArray[np.intp] | None,
    pk: _Packets,
    dest: tuple[npt.NDArray[Any], ...],
) -> None:
    """The fields after each packet's head: name, category, flows into ``dest``, debug
    annotations (name, then value as the next field) into ``pk``.

    Read a field at a time across the packets that have one more while they are many (most
    packets have a few such fields, and each step reads only what is there), then the fields
    of the few packets left all at once (a step costs the same for a handful of packets)."""
    end = np.empty_like(starts)
    end[:-1] = starts[1:]
    end[-1] = len(rd.flat)
    live = np.flatnonzero(rd.pos < end)  # the packets with a field left, by number
    rd.pos, end = rd.pos[live], end[live]
    found: list[tuple[npt.NDArray[np.intp], npt.NDArray[np.uint8], U64]] = []  # packet, code, value
    ann: list[tuple[npt.NDArray[np.intp], U64, U64, U64]] = []  # packet, name iid, value key, value
    named: tuple[npt.NDArray[np.intp], U64] | None = None  # annotation names waiting for their value
    top = np.uint64(len(_TAG_CODE) - 1)
    # (a packet's fields end exactly where the next packet starts: both are keys of the run of
    # key-value pairs, and its head ended on a key, so stepping a pair at a time lands on it)
    while len(live) >= max(STEP_MIN, len(starts) // STEP_SHARE, 1):
        keys = rd.value()
        vals = rd.value()
        if named is not None:  # the field after an annotation's name is its value
            ann.append((*named, *_next_field(live, named[0], keys, vals)))
            named = None
        code = _TAG_CODE[np.minimum(keys, top).astype(np.intp)]
        hit = np.flatnonzero(code)
        if len(hit):
            found.append((live[hit], code[hit], vals[hit]))
            da = hit[code[hit] == 5]
            if len(da):
                named = (live[da], vals[da])
        go_on = rd.pos < end
        if not go_on.all():
            live, rd.pos, end = live[go_on], rd.pos[go_on], end[go_on]
    if len(live):
        pkt, keys, vals = _fields_at_once(rd.flat, rd.pos, end)
        if named is not None:  # the first field left of each packet
            first = np.flatnonzero(np.r_[True, pkt[1:] != pkt[:-1]])
            ann.append((*named, *_next_field(live[pkt[first]], named[0], keys[first], vals[first])))
            named = None
        code = _TAG_CODE[np.minimum(keys, top).astype(np.intp)]
        hit = np.flatnonzero(code)
        found.append((live[pkt[hit]], code[hit], vals[hit]))
        da = np.flatnonzero(code == 5)
        if len(da):
            value = da + 1  # the field after an annotation's name is its value
            if value[-1] >= len(pkt) or (pkt[value] != pkt[da]).any():
                raise PftraceError("a debug annotation has a name and no value")
            ann.append((live[pkt[da]], vals[da], keys[value], vals[value]))
    if named is not None:
        raise PftraceError("a debug annotation has a name and no value")
    if found:
        pkt = np.concatenate([f[0] for f in found])
        code = np.concatenate([f[1] for f in found])
        val = np.concatenate([f[2] for f in found])
        at = pkt if vr is None else vr[pkt]
        for c, d in enumerate(dest, start=1):  # (a field given twice: the last one, as in the file)
            m = code == c
            d[at[m]] = val[m]
    for pkts, iids, tag, v in ann:  # (each packet's annotations in file order)
        pk.ann.append(
            (
                pk.count + (pkts if vr is None else vr[pkts]),
                iids.astype(np.int64),
                tag.astype(np.int64),
                v.astype(np.int64),
            )
        )


def _next_field(
    live: npt.NDArray[np.intp], pkts: npt.NDArray[np.intp], keys: U64, vals: U64
) -> tuple[U64, U64]:
    """The key and value of the field read for each of ``pkts`` (among ``live``, sorted)."""
    i = np.minimum(np.searchsorted(live, pkts), len(live) - 1)
    if (live[i] != pkts).any():
        raise PftraceError("a debug annotation has a name and no value")
    return keys[i], vals[i]


def _fields_at_once(
    flat: pw.U8, pos: npt.NDArray[np.intp], end: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.intp], U64, U64]:
    """Every field from ``pos`` to ``end`` of each packet, in file order: the packet (its
    index in ``pos``), key and value. The bytes left of the packets, gathered one after the
    other, are whole key-value pairs, so they read as pairs of varints by their parity again."""
    size = end - pos
    first = np.cumsum(size) - size  # where each packet's fields start in the run
    run = flat[np.arange(int(first[-1] + size[-1])) + np.repeat(pos - first, size)]
    last = run < 0x80  # a varint's last byte
    ends = np.flatnonzero(last)
    if len(ends) % 2 or run[-1] >= 0x80:
        raise PftraceError("an event packet is not laid out as gputrace writes it")
    key_at = np.empty(len(ends) // 2, np.intp)
    key_at[0] = 0
    key_at[1:] = ends[1:-1:2] + 1
    keys, _ = pw.read_at(run, key_at)
    vals, _ = pw.read_at(run, ends[0::2] + 1)
    pairs = np.add.reduceat(last.view(np.int8), first, dtype=np.intp) // 2  # per packet
    pkt = np.repeat(np.arange(len(pos)), pairs)
    return pkt, keys, vals


def _fields(data: bytes | memoryview) -> list[tuple[int, int, int | bytes]]:
    """``list(pw.fields(data))``, with one-byte varints (most keys and small values) read inline:
    rich packets are decoded one by one in Python."""
    out: list[tuple[int, int, int | bytes]] = []
    pos, end = 0, len(data)
    read_pv = pw.read_pv
    while pos < end:
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_pv(data, pos)
        wt = key & 7
        if wt == pw.VARINT:
            if pos < end and data[pos] < 0x80:
                out.append((key >> 3, wt, data[pos]))
                pos += 1
            else:
                v, pos = read_pv(data, pos)
                out.append((key >> 3, wt, v))
        elif wt == pw.LEN:
            if pos < end and data[pos] < 0x80:
                n = data[pos]
                pos += 1
            else:
                n, pos = read_pv(data, pos)
            if pos + n > end:
                raise pw.Truncated("length-delimited field")
            out.append((key >> 3, wt, bytes(data[pos : pos + n])))
            pos += n
        elif wt == pw.FIXED64 or wt == pw.FIXED32:
            width = 8 if wt == pw.FIXED64 else 4
            if pos + width > end:
                raise pw.Truncated("fixed64" if width == 8 else "fixed32")
            out.append((key >> 3, wt, int.from_bytes(data[pos : pos + width], "little")))
            pos += width
        else:
            raise ValueError(f"unsupported wire type {wt}")
    return out


def _decode_rich(
    data: memoryview, ann_names: dict[int, str], strs: dict[int, str]
) -> tuple[int, int, int, int, int, int, dict[str, Any]]:
    (f, _wt, body), *_ = _fields(data)
    d = t_ = tr = nm = ct = fl = 0
    args: dict[str, Any] = {}
    body = _bytes(body)
    for f, _wt, v in _fields(body):
        if f == P_TS:
            d = int(v)  # type: ignore[arg-type]
        elif f == P_TE:
            v = _bytes(v)
            for g, _w, x in _fields(v):
                if g == TE_TYPE:
                    t_ = int(x)  # type: ignore[arg-type]
                elif g == TE_TRACK:
                    tr = int(x)  # type: ignore[arg-type]
                elif g == TE_NAME:
                    nm = int(x)  # type: ignore[arg-type]
                elif g == TE_CAT:
                    ct = int(x)  # type: ignore[arg-type]
                elif g == TE_FLOW:
                    fl = int(x)  # type: ignore[arg-type]
                elif g == TE_ANN:
                    x = _bytes(x)
                    key, val, interned = _decode_ann(x, ann_names, strs)
                    args["\0flags" if interned else key] = val
    return d, t_, tr, nm, ct, fl, args


def _bytes(v: int | bytes) -> bytes:
    """A length-delimited field's bytes; a number where a message belongs is a malformed file."""
    if not isinstance(v, bytes):
        raise PftraceError("a field that holds a message holds a number")
    return v


def _decode_ann(data: bytes, ann_names: dict[int, str], strs: dict[int, str]) -> tuple[str, Any, bool]:
    """Name and value of one debug annotation; True for an interned string (gputrace's flags)."""
    key = ""
    val: Any = None
    interned = False
    for f, _wt, v in _fields(data):
        if f == DA_NAME:
            key = ann_names[int(v)]  # type: ignore[arg-type]
        elif f == DA_BOOL:
            val = bool(v)
        elif f == DA_INT:
            val = pw.as_int64(int(v))  # type: ignore[arg-type]
        elif f == DA_DOUBLE:
            val = pw.as_double(int(v))  # type: ignore[arg-type]
        elif f == DA_STR:
            v = _bytes(v)
            val = v.decode("utf-8", "surrogatepass")
        elif f == DA_JSON:
            v = _bytes(v)
            val = orjson.loads(v)
        elif f == DA_STR_IID:
            val = strs[int(v)]  # type: ignore[arg-type]
            interned = True
    return key, val, interned


def read(path: str | os.PathLike[str], progress: Progress | None = None) -> Trace:
    """Read a ``.pftrace`` that gputrace wrote back into the ``Trace`` it was written from."""
    from gputrace.gcpause import gc_paused

    with gc_paused():  # the packets decode into many small objects, none of them in a cycle
        return _read_file(Path(path), progress)


def _read_file(p: Path, progress: Progress | None) -> Trace:
    from gputrace.loader import TraceFileError, read_bytes

    raw = read_bytes(p)  # bounded: regular files only, at most GPUTRACE_MAX_TRACE_BYTES
    if not raw:
        raise TraceFileError(f"{p}: the file is empty.")
    if progress is not None:
        progress("read")
    try:
        trace = _read(memoryview(raw), progress)
    except PftraceError as exc:
        raise TraceFileError(f"{p}: {exc}.") from None
    except (
        pw.Truncated,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
        orjson.JSONDecodeError,
        zlib.error,
    ) as exc:
        raise TraceFileError(
            f"{p}: not a Perfetto trace written by gputrace ({type(exc).__name__}: {exc})."
        ) from None
    if progress is not None:
        progress("built")
    return trace


def _read(data: memoryview, progress: Progress | None) -> Trace:
    names: dict[int, str] = {}
    cats: dict[int, str] = {}
    ann_names: dict[int, str] = {}
    strs: dict[int, str] = {}
    header: dict[str, Any] | None = None
    tracks: dict[int, tuple[int, int, int]] = {}
    threads: list[ThreadInfo] = []
    queues: list[QueueInfo] = []
    pk = _Packets()
    user_args: set[int] = set()  # annotation names that are user arguments (not gputrace's own)
    truncated = False
    final = False
    last_ts = 0
    pos, end = 0, len(data)
    while pos < end:
        try:
            key, p2 = pw.read_pv(data, pos)
            if key != T_PACKET:
                raise PftraceError(f"not a Perfetto trace: unexpected bytes at offset {pos}")
            n, p3 = pw.read_pv(data, p2)
        except pw.Truncated:
            truncated = True
            break
        if p3 + n > end:
            truncated = True
            break
        packet = data[p3 : p3 + n]
        pos = p3 + n
        chunk: dict[str, Any] | None = None
        for f, _wt, v in pw.fields(packet):
            if f == P_INTERNED:
                v = _bytes(v)
                for g, _w, entry in pw.fields(v):
                    entry = _bytes(entry)
                    iid, text = 0, b""
                    for h, _x, e in pw.fields(entry):
                        if h == 1:
                            iid = int(e)  # type: ignore[arg-type]
                        elif h == 2:
                            text = _bytes(e)
                    if g == ID_NAMES:
                        names[iid] = text.decode("utf-8", "surrogatepass")
                    elif g == ID_CATS:
                        cats[iid] = text.decode("utf-8", "surrogatepass")
                    elif g == ID_ANN_NAMES:
                        ann_names[iid] = text.decode("utf-8", "surrogatepass")
                    elif g == ID_ANN_STRS:
                        if text.startswith(HEADER_TAG):
                            header = orjson.loads(text[len(HEADER_TAG) :])
                        elif text.startswith(FINAL_TAG):
                            header = orjson.loads(zlib.decompress(text[len(FINAL_TAG) :]))
                            final = True
                        elif text.startswith(CHUNK_TAG):
                            chunk = orjson.loads(text[len(CHUNK_TAG) :])
                        else:
                            strs[iid] = text.decode("utf-8", "surrogatepass")
            elif f == P_CLOCK and header is not None and last_ts == 0:
                v = _bytes(v)
                for _g, _w, c in pw.fields(v):
                    if isinstance(c, bytes):
                        cf = {h: e for h, _x, e in pw.fields(c)}
                        if cf.get(1) == CLK:
                            last_ts = int(cf.get(2, 0))  # type: ignore[arg-type]
        if chunk is None:
            continue
        size = int(chunk["bytes"])
        if pos + size > end:
            truncated = True
            break
        for t in chunk["threads"]:
            threads.append(ThreadInfo(int(t[0]), str(t[1])))
        for q in chunk["queues"]:
            queues.append(
                QueueInfo(int(q["device"]), str(q["device_name"]), str(q["backend"]), str(q["label"]))
            )
        for uuid, kind, idx, lane in chunk["tracks"]:
            tracks[int(uuid)] = (int(kind), int(idx), int(lane))
        user_args.update(int(i) for i in chunk.get("args", ()))
        pk.chunk_pass.append(int(chunk.get("pass", 0)))
        last_ts = _decode_region(data[pos : pos + size], chunk["rich"], last_ts, pk, ann_names, strs)
        pos += size
    if header is None:
        raise PftraceError("no gputrace header (not a trace written by gputrace)")
    if header.get("format_version") != FORMAT_VERSION:
        raise PftraceError(
            f"trace format version {header.get('format_version')!r} is not supported "
            f"(this gputrace reads version {FORMAT_VERSION})"
        )
    if progress is not None:
        progress("parsed")
    header = dict(header)
    if truncated or not final:
        header["truncated"] = True
    return _build(header, pk, names, cats, ann_names, strs, tracks, threads, queues, user_args)


def _col(parts: list[Any]) -> Any:
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _by_chunk_and_track(chunk: I64, track: I64) -> npt.NDArray[np.intp]:
    """The stable order of events in file order (``chunk`` ascending) by chunk, then track: a
    radix sort of 16-bit keys where they fit (faster than a merge sort of 64-bit ones)."""
    if not len(track) or track.min() < 0 or track.max() >= 1 << 16:
        return np.argsort(track + chunk * (1 << 32), kind="stable")
    o = np.argsort(track.astype(np.uint16), kind="stable")
    if (chunk == chunk[0]).all():
        return o
    c = chunk[o]
    c16 = c - c.min()
    if c16.max() < 1 << 16:
        return o[np.argsort(c16.astype(np.uint16), kind="stable")]
    return o[np.argsort(c, kind="stable")]


def _pair(chunk: I64, ts: I64, track: I64, typ: I64, idx: I64, chunks: bool = True) -> tuple[I64, I64, I64]:
    """Begin and end packets of each slice, matched as Perfetto matches them (events of a track
    in time order, ties in file order, a stack per track), within each chunk (a chunk holds both
    ends of its slices); ``chunks=False`` with ``chunk`` all zero gives Perfetto's view of the
    whole file. Also each slice's depth on its track."""
    m = idx[(typ[idx] == SLICE_BEGIN) | (typ[idx] == SLICE_END)]
    if not len(m):
        return m, m, m
    # ``idx`` is in file order, and within a chunk file order is time order
    if chunks or (np.diff(ts[m]) >= 0).all():
        m = m[_by_chunk_and_track(chunk[m], track[m])]
    else:
        m = m[np.lexsort((m, ts[m], track[m]))]
    tr = track[m] + chunk[m] * (1 << 32)
    step = np.where(typ[m] == SLICE_BEGIN, 1, -1)
    depth = np.cumsum(step)
    first = np.flatnonzero(np.r_[True, tr[1:] != tr[:-1]])
    base = np.repeat(depth[first] - step[first], np.diff(np.r_[first, len(m)]))
    depth = depth - base
    level = np.where(step > 0, depth, depth + 1)
    o = np.lexsort((np.arange(len(m)), level, tr))
    m, stp = m[o], step[o]
    if len(m) % 2 or (stp[0::2] != 1).any() or (stp[1::2] != -1).any():
        raise PftraceError("slice begins and ends do not match")
    lv, tr2 = level[o], tr[o]
    if (lv[0::2] != lv[1::2]).any() or (tr2[0::2] != tr2[1::2]).any():
        raise PftraceError("slice begins and ends do not match")
    return m[0::2], m[1::2], lv[0::2] - 1


def _nest_fast(s: ScopeTable, depth: I64) -> bool:
    """Parent and depth from the slices' depths on their tracks (one track per thread, no
    zero-length scope: then they are what ``model.nest`` finds). False where that does not hold."""
    n = len(s)
    if not n or (s.cpu_end_ns == s.cpu_start_ns).any():
        return False
    order = np.lexsort((np.arange(n), s.cpu_start_ns, s.thread))
    lv = depth[order]
    parent_sorted = np.full(n, -1, np.int64)
    pos = np.arange(n, dtype=np.int64)
    for level in range(1, int(lv.max()) + 1 if n else 0):
        last = np.maximum.accumulate(np.where(lv == level - 1, pos, -1))
        at = lv == level
        parent_sorted[at] = last[at]
    parent = np.full(n, -1, np.int64)
    has = parent_sorted >= 0
    parent[order[has]] = order[parent_sorted[has]]
    if (s.thread[np.maximum(parent, 0)][has[np.argsort(order)]] != s.thread[has[np.argsort(order)]]).any():
        return False
    s.parent = parent
    s.depth = depth.astype(np.int32)
    return True


def _build(
    header: dict[str, Any],
    pk: _Packets,
    names: dict[int, str],
    cats: dict[int, str],
    ann_names: dict[int, str],
    strs: dict[int, str],
    tracks: dict[int, tuple[int, int, int]],
    threads: list[ThreadInfo],
    queues: list[QueueInfo],
    user_args: set[int] | None = None,
) -> Trace:
    ts, typ, track, chunk = _col(pk.ts), _col(pk.type), _col(pk.track), _col(pk.chunk)
    name, cat, flow, tflow = _col(pk.name), _col(pk.cat), _col(pk.flow), _col(pk.tflow)
    total = len(ts)
    # what each track is
    nt = max(tracks) + 1 if tracks else 1
    if nt > 2 * len(tracks) + 64:
        raise PftraceError("the track numbers are not the ones gputrace writes")
    tkind = np.full(nt, -1, np.int64)
    tidx = np.zeros(nt, np.int64)
    for u, (k, i, _ln) in tracks.items():
        tkind[u], tidx[u] = k, i
    if total and (track.max() >= nt or (tkind[track] < 0).any()):
        raise PftraceError("an event is on a track that the file does not describe")
    kind = tkind[track] if total else np.zeros(0, np.int64)
    # annotations: one column per name (int values; interned strings stay iids)
    ann_cols: dict[str, tuple[I64, I64]] = {}
    if pk.ann:
        a_pk = np.concatenate([a[0] for a in pk.ann])
        a_nm = np.concatenate([a[1] for a in pk.ann])
        a_val = np.concatenate([a[3] for a in pk.ann])
        for iid in distinct(a_nm).tolist():
            sel = np.flatnonzero(a_nm == iid)
            if user_args and iid in user_args:  # user arguments written as columns
                a_tag = np.concatenate([a[2] for a in pk.ann])[sel]
                for p, tag, v in zip(a_pk[sel].tolist(), a_tag.tolist(), a_val[sel].tolist(), strict=True):
                    val = strs[v] if tag == T_DA_STR_IID else bool(v) if tag == T_DA_BOOL else v
                    pk.args.setdefault(p, {})[ann_names[int(iid)]] = val
                continue
            ann_cols[ann_names[int(iid)]] = (a_pk[sel], a_val[sel])

    where_cache: dict[int, tuple[I64, I64]] = {}

    def ann(key: str, rows: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
        """The int annotation ``key`` of each packet in ``rows`` (0 where it has none), and where."""
        out = np.zeros(len(rows), np.int64)
        got = np.zeros(len(rows), bool)
        if key in ann_cols and len(rows):
            apk, av = ann_cols[key]
            hit = where_cache.get(id(rows))
            if hit is None or hit[0] is not rows:
                where = np.full(total, -1, np.int64)
                where[rows] = np.arange(len(rows))
                hit = where_cache[id(rows)] = (rows, where)
            pos = hit[1][apk]
            ok = pos >= 0
            out[pos[ok]] = av[ok]
            got[pos[ok]] = True
        return out, got

    # CPU slices
    on_threads = np.flatnonzero(kind == K_THREAD)
    cpu_b, cpu_e, _ = _pair(chunk, ts, track, typ, on_threads)
    # the depth Perfetto gives each slice (its events in time order across chunks); where that
    # pairs begins and ends the same way, it is the nesting (see _nest_fast)
    cpu_depth: I64 | None = None
    if len(cpu_b):
        wb, we, wd = (
            _pair(np.zeros_like(chunk), ts, track, typ, on_threads, chunks=False)
            if len(pk.chunk) > 1
            else (cpu_b, cpu_e, _)
        )
        end_of = np.full(total, -1, np.int64)
        depth_of = np.zeros(total, np.int64)
        end_of[wb] = we
        depth_of[wb] = wd
        if np.array_equal(end_of[cpu_b], cpu_e):
            cpu_depth = depth_of[cpu_b]
    # launch calls (per-operation records) share the threads' tracks; they are not scopes
    call_cats = [i for i, c in cats.items() if c in CALL_CATS]
    if call_cats and len(cpu_b):
        scope_rows = ~np.isin(cat[cpu_b], call_cats)
        cpu_b, cpu_e = cpu_b[scope_rows], cpu_e[scope_rows]
        if cpu_depth is not None:
            cpu_depth = cpu_depth[scope_rows]
    # rows as written (chunk after chunk, each in (start, thread, -end) order: what the scope
    # numbers in the file refer to), then rows as the model orders them (by start overall)
    written = np.lexsort((cpu_b, -ts[cpu_e], tidx[track[cpu_b]], ts[cpu_b], chunk[cpu_b]))
    cpu_b, cpu_e = cpu_b[written], cpu_e[written]
    n = len(cpu_b)
    order = np.lexsort((np.arange(n), -ts[cpu_e], tidx[track[cpu_b]], ts[cpu_b]))
    w2r = np.empty(n + 1, np.int64)  # written row -> row (and -1 -> -1)
    w2r[order] = np.arange(n)
    w2r[n] = -1
    cpu_b, cpu_e = cpu_b[order], cpu_e[order]
    if cpu_depth is not None:
        cpu_depth = cpu_depth[written][order]
    s = ScopeTable.empty(n)
    raw_names = [names[i] for i in name[cpu_b].tolist()]
    name_ids = {k: i for i, k in enumerate(dict.fromkeys(raw_names))}
    name_list = list(name_ids)
    s.name = np.fromiter(map(name_ids.__getitem__, raw_names), np.int32, n)
    s.thread = tidx[track[cpu_b]].astype(np.int32)
    s.cpu_start_ns = ts[cpu_b].copy()
    s.cpu_end_ns = ts[cpu_e].copy()
    fl_iid, fl_got = ann("flags", cpu_b)
    for i in np.flatnonzero(fl_got).tolist():
        s.flags[i] = flags_from_names(strs[int(fl_iid[i])].split(", "))
    if pk.args:
        with_args = np.flatnonzero(np.isin(cpu_b, np.fromiter(pk.args, np.int64, len(pk.args))))
        for i, p in zip(with_args.tolist(), cpu_b[with_args].tolist(), strict=True):
            a = dict(pk.args[p])
            fl = a.pop("\0flags", None)
            if fl:
                s.flags[i] = flags_from_names(fl.split(", "))
            if a:
                s.args[i] = a
    fl_rows = np.flatnonzero(flow[cpu_b] > 0)  # the scope flows' ids, sorted, and their rows
    fl_ids = flow[cpu_b][fl_rows]
    o = np.argsort(fl_ids, kind="stable")
    fl_ids, fl_rows = fl_ids[o], fl_rows[o]
    one_lane = not any(k == K_THREAD and lane for k, _i, lane in tracks.values())
    if not no_nesting(s) and not (one_lane and cpu_depth is not None and _nest_fast(s, cpu_depth)):
        nest(s)
    # GPU slices (with a terminating flow) and passes (with a scope annotation) on queue tracks
    q_b, q_e, _ = _pair(chunk, ts, track, typ, np.flatnonzero(kind == K_QUEUE))
    is_gpu = tflow[q_b] > 0
    g_b, g_e = q_b[is_gpu], q_e[is_gpu]
    fold_rows = fold_iid = np.zeros(0, np.int64)
    if len(g_b):
        f = tflow[g_b]
        at = np.minimum(np.searchsorted(fl_ids, f), max(len(fl_ids) - 1, 0))
        if not len(fl_ids) or (fl_ids[at] != f).any():
            raise PftraceError("a GPU slice's flow names no CPU slice")
        rows = fl_rows[at]
        st = ts[g_b]
        gpu_ns, has_neg = ann("gpu_ns", g_b)
        en = np.where(has_neg, st + gpu_ns, ts[g_e])
        s.gpu_start_ns[rows] = st
        s.gpu_end_ns[rows] = en
        unc, has_unc = ann("uncertainty_ns", g_b)
        o = np.argsort(f)  # written where it changes, in written order: carry it forward
        last = np.maximum.accumulate(np.where(has_unc[o], np.arange(len(o)), -1))
        s.uncertainty_ns[rows[o]] = np.where(last >= 0, unc[o][np.maximum(last, 0)], 0)
        gap, has_sub = ann("submit_to_start_ns", g_b)
        s.submit_ns[rows[has_sub]] = st[has_sub] - gap[has_sub]
        s.queue[rows] = tidx[track[g_b]].astype(np.int32)
        _, no_sub = ann("no_submit", g_b)
        look = np.flatnonzero(~has_sub & ~no_sub)  # submitted when the wait ending at its start began
        if len(look):
            w_b, w_e, _ = _pair(chunk, ts, track, typ, np.flatnonzero(kind == K_QUEUED))
            wait, row = _same_key(
                (chunk[w_b], tidx[track[w_b]], ts[w_e]), (chunk[g_b[look]], tidx[track[g_b[look]]], st[look])
            )
            s.submit_ns[rows[look[row]]] = ts[w_b[wait]]
        # a scope's one pass, written as its GPU slice: its label, or the chunk's
        fold_iid, folded = ann("pass", g_b)
        _, no_pass = ann("no_pass", g_b)
        default = np.array([*pk.chunk_pass, 0], np.int64)[chunk[g_b]]
        fold_iid = np.where(folded, fold_iid, default)
        folded = (folded | (default > 0)) & ~no_pass
        fold_rows, fold_iid = rows[folded], fold_iid[folded]
    p_b, p_e = q_b[~is_gpu], q_e[~is_gpu]
    labels: dict[str, int] = dict(name_ids)

    def intern_label(label: str) -> int:
        i = labels.get(label)
        if i is None:
            i = labels[label] = len(name_list)
            name_list.append(label)
        return i

    p_rows = np.zeros(0, np.int64)
    p_label = np.zeros(0, np.int32)
    p_sub = p_g0 = p_g1 = np.zeros(0, np.int64)
    if len(p_b):
        sc, _ = ann("scope", p_b)
        if (sc < 0).any() or (sc >= n).any():
            raise PftraceError("a GPU pass names a scope that the trace does not have")
        p_rows = w2r[sc]
        order = np.argsort(p_b, kind="stable")
        p_b, p_e, p_rows = p_b[order], p_e[order], p_rows[order]
        p_label = np.fromiter((intern_label(names[int(i)]) for i in name[p_b].tolist()), np.int32, len(p_b))
        p_g0 = ts[p_b]
        pg, pneg = ann("gpu_ns", p_b)
        p_g1 = np.where(pneg, p_g0 + pg, ts[p_e])
        gap, has_sub = ann("submit_to_start_ns", p_b)
        _, no_sub = ann("no_submit", p_b)
        p_sub = np.where(has_sub, p_g0 - gap, np.where(no_sub, NO_TIME, s.submit_ns[p_rows]))
    fold_ids = np.fromiter((intern_label(strs[int(i)]) for i in fold_iid.tolist()), np.int32)
    passes = with_folded(s, (p_rows, p_label, p_g0, p_g1, p_sub), fold_rows, fold_ids)
    spans = span_table(s, passes, bool(header.get("spans_cover_children")), lambda: intern_label(""))
    # marks and syncs: instants on thread tracks
    marks: list[Mark] = []
    inst = np.flatnonzero((typ == INSTANT) & (kind == K_THREAD))
    inst = inst[np.argsort(ts[inst], kind="stable")]
    for p in inst.tolist():
        kd = cats.get(int(cat[p]), "")
        if kd in ("mark", "sync"):
            marks.append(
                Mark(names[int(name[p])], int(ts[p]), int(tidx[track[p]]), kd, dict(pk.args.get(p, {})))
            )
    ops = _read_ops(
        ts, typ, track, name, cat, chunk, kind, tidx, names, cats, strs, s, ann, intern_label, w2r
    )
    final_names = (
        canonical_names(name_list, s, spans, ops)  # type: ignore[call-arg]
        if ops is not None
        else canonical_names(name_list, s, spans)
    )
    if "threads" not in header:
        header["threads"] = [{"tid": t.tid, "name": t.name} for t in threads]
    if "queues" not in header:
        header["queues"] = [_queue_dict(q) for q in queues]
    fits = {int(c["device"]): ClockFit.from_dict(c) for c in header.get("clock", [])}
    if ops is not None:
        trace = Trace(header, final_names, threads, queues, s, spans, marks, fits, ops)  # type: ignore[call-arg]
    else:
        trace = Trace(header, final_names, threads, queues, s, spans, marks, fits)
    # anomaly examples written as their scope and kinds: the rest is the scope's
    return trace


def _read_ops(
    ts: I64,
    typ: I64,
    track: I64,
    name: I64,
    cat: I64,
    chunk: I64,
    kind: I64,
    tidx: I64,
    names: dict[int, str],
    cats: dict[int, str],
    strs: dict[int, str],
    s: ScopeTable,
    ann: Callable[[str, I64], tuple[I64, npt.NDArray[np.bool_]]],
    intern: Callable[[str], int],
    w2r: I64,
) -> Any:
    """The per-operation records (an ``OpTable``), where the model has them and the file holds any."""
    from gputrace import model

    table = getattr(model, "OpTable", None)
    on_ops = np.flatnonzero(kind == K_OPS)
    if table is None or not len(on_ops):
        return None if table is None else table.empty()
    b, e, _ = _pair(chunk, ts, track, typ, on_ops)
    b, e = b[np.lexsort((b, ts[b]))], e[np.lexsort((b, ts[b]))]
    n = len(b)
    ops = table.empty(n)
    sc, _ = ann("scope", b)
    if (sc < -1).any() or (sc >= len(s)).any():
        raise PftraceError("an operation names a scope that the trace does not have")
    ops.scope = w2r[sc]
    kinds = {i: OP_CATS.index(c) for i, c in cats.items() if c in OP_CATS}
    ops.kind = _per_iid(cat[b], lambda c: kinds.get(c, 0))
    ops.name = _per_iid(name[b], lambda i: intern(names[i]))
    ops.queue = tidx[track[b]].astype(np.int32)
    th, has_th = ann("thread", b)
    default = np.where(ops.scope >= 0, s.thread[np.maximum(ops.scope, 0)] if len(s) else -1, -1)
    ops.thread = np.where(has_th, th, default).astype(np.int32)
    ops.correlation, _ = ann("correlation", b)
    ops.gpu_start_ns = ts[b].copy()
    g, neg = ann("gpu_ns", b)
    ops.gpu_end_ns = np.where(neg, ts[b] + g, ts[e])
    lts, seen = ann("launch_to_start_ns", b)
    dur, _ = ann("call_ns", b)
    ops.call_start_ns = np.where(seen, ts[b] - lts, NO_TIME)
    ops.call_end_ns = np.where(seen, ts[b] - lts + dur, NO_TIME)
    call, has_call = ann("call", b)
    ops.call_name = _per_iid(np.where(has_call, call, -1), lambda c: intern(strs[c] if c >= 0 else ""))
    ops.bytes, _ = ann("bytes", b)
    shape, has_shape = ann("grid,block", b)
    grid = np.zeros((n, 6), np.int64)
    rows = np.flatnonzero(has_shape)
    if len(rows):  # a few distinct shapes, each parsed once
        uniq, inv = np.unique(shape[rows], return_inverse=True)
        parsed = np.array([[int(x) for x in strs[int(u)].split(",")] for u in uniq.tolist()], np.int64)
        if parsed.shape[1:] != (6,):
            raise PftraceError("an operation's grid and block are not six integers")
        grid[rows] = parsed[inv.reshape(-1)]
    ops.grid, ops.block = grid[:, :3].copy(), grid[:, 3:].copy()
    ops.graph_id, _ = ann("graph id", b)
    ops.graph_node_id, _ = ann("graph node id", b)
    return ops


def _per_iid(iids: I64, fn: Callable[[int], int]) -> npt.NDArray[np.int32]:
    """``fn`` of each value, called once per distinct value, in order of first appearance."""
    if not len(iids):
        return np.zeros(0, np.int32)
    uniq, first, inv = np.unique(iids, return_index=True, return_inverse=True)
    out = np.zeros(len(uniq), np.int32)
    for k in np.argsort(first, kind="stable").tolist():
        out[k] = fn(int(uniq[k]))
    return out[inv.reshape(-1)]


def _same_key(a: tuple[I64, ...], b: tuple[I64, ...]) -> tuple[I64, I64]:
    """Pairs (i, j) where row i of the columns ``a`` equals row j of ``b``, for the rows of ``b``
    whose key occurs exactly once in ``a``."""
    na = len(a[0])
    side = np.r_[np.zeros(na, np.int64), np.ones(len(b[0]), np.int64)]
    cols = [np.concatenate([x, y]) for x, y in zip(a, b, strict=True)]
    o = np.lexsort((side, *cols[::-1]))
    eq = np.ones(len(o) - 1, bool) if len(o) else np.zeros(0, bool)
    for c in cols:
        eq &= c[o][1:] == c[o][:-1]
    # a row of b right after a row of a with its key, itself not after another row of a with it
    hit = np.flatnonzero(eq & (side[o][:-1] == 0) & (side[o][1:] == 1))
    once = np.ones(len(hit), bool)
    k = hit[hit >= 1]
    once[hit >= 1] = ~(eq[k - 1] & (side[o][k - 1] == 0))
    hit = hit[once]
    return o[hit], o[hit + 1] - na
