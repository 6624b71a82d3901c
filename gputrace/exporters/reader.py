"""The one reader: a parsed Chrome trace document (``orjson`` dicts) -> the ``Trace`` model.

A file gputrace wrote (its header under ``gputrace``, or, for a file cut short, the start header
under ``metadata.gputrace_stream``) is read back exactly; any other Chrome trace goes to
``from_chrome``. Events are sorted by kind in one pass, everything after is per column (numpy).
Refused with one sentence naming it: a value that cannot be a trace value, a negative ``gpu_us``
without the flag gputrace gives one (``empty_gpu_span``, ``degraded``), and an event that appears
twice (a file concatenated or edited by hand): the same CPU slice, or two GPU slices for a scope.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from itertools import count, repeat
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from gputrace.exporters.opener import NotAGputraceTrace, TraceFileError
from gputrace.exporters.plan import GPU_PID_BASE, OP_CATS, OVERLAP_TID_STEP
from gputrace.model import (
    FORMAT_VERSION,
    NO_TIME,
    ClockFit,
    Flag,
    Mark,
    OpTable,
    QueueInfo,
    ScopeTable,
    SpanTable,
    ThreadInfo,
    Trace,
    canonical_names,
    flags_from_names,
    nest,
)

Event = dict[str, Any]
I64 = npt.NDArray[np.int64]
Intern = Callable[[str], int]  # a name's id in the trace's names
MAX_ABS_US = 1e15  # beyond ~31 years in µs it is not a time: refused, not overflowed
NEGATIVE_GPU_OK = frozenset({"empty_gpu_span", "degraded"})  # flags under which gputrace writes one
_OP_KIND = {c: i for i, c in enumerate(OP_CATS)}


class Malformed(ValueError):
    """A value inside an event that cannot be a trace value; the message says which."""


def from_document(doc: Any, where: str = "<trace>", *, truncated: bool = False) -> Trace:
    """A ``Trace`` from a parsed gputrace document; ``NotAGputraceTrace`` carries any other."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NotAGputraceTrace(f"{where}: not a Chrome trace (no traceEvents list).", doc)
    header = doc.get("gputrace")
    if not isinstance(header, dict):
        meta = doc.get("metadata")
        header = meta.get("gputrace_stream") if isinstance(meta, dict) else None
        truncated = truncated or isinstance(header, dict)  # the writer never closed the file
    if not isinstance(header, dict) or "format_version" not in header:
        raise NotAGputraceTrace(f"{where}: a Chrome trace, but not one written by gputrace.", doc)
    if header["format_version"] != FORMAT_VERSION:
        raise TraceFileError(
            f"{where}: trace format version {header['format_version']!r} is not supported "
            f"(this gputrace reads version {FORMAT_VERSION})."
        )
    header = dict(header)
    if truncated or header.get("truncated"):  # (repaired: the start header stands in for the final one)
        header["truncated"] = True
    try:
        return build(doc["traceEvents"], header)
    except (KeyError, AttributeError, TypeError, ValueError, IndexError, OverflowError) as exc:
        if isinstance(exc, Malformed):
            why = f": {exc}"
        elif isinstance(exc, KeyError):
            why = f": the field {exc.args[0]!r} is missing"
        elif isinstance(exc, AttributeError):
            why = ": an event, its args or a header entry is not an object"
        else:
            why = f" ({type(exc).__name__}: {exc})"
        raise TraceFileError(f"{where}: the trace is malformed{why}.") from None


# -- columns ---------------------------------------------------------------------------------------
def _column(values: list[Any], what: str, kinds: str) -> npt.NDArray[Any]:
    """``np.array(values)``, refused unless a column of integers (``kinds`` "iu") or numbers
    ("iuf"): no strings, nulls, nested or ragged lists."""
    try:
        arr = np.array(values) if values else np.zeros(0, np.int64)
    except (ValueError, TypeError, OverflowError):  # ragged lists, mixed nesting
        arr = np.array([None])
    if arr.ndim != 1 or arr.dtype.kind not in kinds:
        ok, kind = ((int,), "an integer") if kinds == "iu" else ((int, float), "a number")
        bad = next((v for v in values if type(v) not in ok), None)
        raise Malformed(f"{what} must be {kind}, not {type(bad).__name__} {bad!r:.40}")
    return arr


def floats(values: list[Any], what: str, *, non_negative: bool = False) -> npt.NDArray[np.float64]:
    """Numbers as float64, refusing what ``_column`` refuses and absurd magnitudes."""
    out = _column(values, what, "iuf").astype(np.float64)
    if len(out) and not (np.abs(out).max() < MAX_ABS_US):
        raise Malformed(f"{what} holds an absurd value ({np.abs(out).max():g} µs)")
    if non_negative and len(out) and out.min() < 0:
        raise Malformed(f"{what} holds a negative value ({out.min():g})")
    return out


def ints(values: list[Any], what: str) -> I64:
    return _column(values, what, "iu").astype(np.int64)


def _col(events: list[Any], key: str) -> list[Any]:
    """``[e[key] for e in events]``, in C; KeyError where an event lacks ``key``."""
    return list(map(itemgetter(key), events))


def _get(events: list[Any], key: str, default: Any) -> list[Any]:
    return list(map(dict.get, events, repeat(key), repeat(default)))


def _ns(us: npt.NDArray[np.float64]) -> I64:
    return np.rint(us * 1000.0).astype(np.int64)


def _optional_ns(args: list[Any], key: str, base: int) -> tuple[list[int], I64]:
    """The rows of ``args`` that hold the time ``key`` (µs), and those times (ns)."""
    rows = [i for i, a in enumerate(args) if key in a]
    return rows, base + _ns(floats([args[i][key] for i in rows], key))


def _interned(values: list[Any], intern: Intern) -> npt.NDArray[np.int32]:
    """Name ids for ``values`` (each as ``str``), interning each distinct value once (a value
    that cannot be a name, such as a list, raises ``TypeError``: the file is malformed)."""
    first_met: defaultdict[Any, int] = defaultdict(count().__next__)
    local = np.fromiter(map(first_met.__getitem__, values), np.int32, len(values))
    return np.array([intern(str(k)) for k in first_met], np.int32)[local] if len(local) else local


# -- the events, by kind ---------------------------------------------------------------------------
def classify(events: list[Any]) -> tuple[list[Event], ...]:
    """CPU slices, GPU slices, passes, instants, operations and name events, each in file order."""
    kinds: tuple[list[Event], ...] = tuple([] for _ in range(6))
    cpu, gpu, passes, instants, ops, names = kinds
    slices = {"cpu": cpu.append, "gpu": gpu.append, "gpu.pass": passes.append}
    slices.update(dict.fromkeys(OP_CATS, ops.append))
    others = {"i": instants.append, "M": names.append}
    for e in events:
        ph = e.get("ph")
        add = slices.get(e.get("cat")) if ph == "X" else others.get(ph)  # type: ignore[arg-type]
        if add is not None:
            add(e)
    return kinds


def _queue(q: dict[str, Any]) -> QueueInfo:
    return QueueInfo(int(q["device"]), str(q["device_name"]), str(q["backend"]), str(q["label"]))


def _names_from_metadata(events: list[Event]) -> tuple[list[ThreadInfo], list[QueueInfo]]:
    """Threads and queues from the name events (a cut file has no final header listing them)."""
    threads: dict[int, ThreadInfo] = {}
    queues: dict[int, QueueInfo] = {}
    for e in events:
        if e.get("name") != "thread_name":
            continue
        p, tid, a = int(e["pid"]), int(e["tid"]), e.get("args") or {}
        if p >= GPU_PID_BASE:
            q = a.get("queue")
            if isinstance(q, dict) and tid < OVERLAP_TID_STEP:
                queues[tid - 1] = _queue(q)
        elif tid < OVERLAP_TID_STEP:
            threads.setdefault(tid, ThreadInfo(tid, str(a.get("name", ""))))
    qlist = [queues.get(i, QueueInfo(0, "GPU", "", f"queue {i}")) for i in range(max(queues, default=-1) + 1)]
    return list(threads.values()), qlist


def _refuse_repeats(tid: I64, name: Any, ts: Any, dur: Any, events: list[Event]) -> None:
    """Refuse the CPU slices if one appears twice (every field equal)."""
    order = np.lexsort((dur, ts, name, tid))
    same = np.ones(len(order) - 1, bool)
    for col in (tid, name, ts, dur):
        c = col[order]
        same &= c[1:] == c[:-1]
    for k in np.flatnonzero(same).tolist():
        a, b = events[int(order[k])], events[int(order[k + 1])]
        try:
            repeated = a == b
        except RecursionError:  # args nested deeper than Python compares
            repeated = False
        if repeated:
            raise Malformed(
                f"the cpu slice {str(a.get('name'))[:60]!r} at ts {a.get('ts')} appears twice "
                "(was the file concatenated or edited?)"
            )


# -- the trace -------------------------------------------------------------------------------------
def build(events: list[Any], header: dict[str, Any]) -> Trace:
    base = int(header["base_ns"])
    pid = int(header.get("pid") or 1)
    cpu, gpu, pass_events, instants, op_events, name_events = classify(events)
    if "threads" in header:
        threads = [ThreadInfo(int(t["tid"]), str(t["name"])) for t in header["threads"]]
        queues = [_queue(q) for q in header.get("queues", [])]
    else:  # a file cut short: only its start header
        threads, queues = _names_from_metadata(name_events)
        header["threads"] = [asdict(t) for t in threads]
        header["queues"] = [asdict(q) for q in queues]
    n = len(cpu)
    # numbered as first met: the scopes' names, then labels and operations'
    name_ids: defaultdict[str, int] = defaultdict(count().__next__)
    intern: Intern = name_ids.__getitem__
    s = ScopeTable.empty(n)
    s.name = _interned(_col(cpu, "name"), intern)
    tids = ints(_col(cpu, "tid"), "a cpu slice's tid") % OVERLAP_TID_STEP
    thread_row = {t.tid: i for i, t in enumerate(threads)}  # the last listed wins a repeat
    if n and not thread_row:
        raise Malformed("the header lists no threads, but the trace has cpu slices")
    s.thread = np.fromiter(map(thread_row.get, tids.tolist(), repeat(-1)), np.int32, n)
    if (s.thread < 0).any():
        raise Malformed(
            f"a cpu slice is on thread {int(tids[s.thread < 0][0])}, which the header does not list"
        )
    ts = floats(_col(cpu, "ts"), "a cpu slice's ts")
    dur = floats(_col(cpu, "dur"), "a cpu slice's dur", non_negative=True)
    # a slice can only repeat another with the same start: none where starts only increase
    if n > 1 and not (np.diff(ts) > 0).all():
        _refuse_repeats(tids, s.name, ts, dur, cpu)
    s.cpu_start_ns = base + _ns(ts)
    s.cpu_end_ns = s.cpu_start_ns + _ns(dur)
    for i, a in enumerate(_get(cpu, "args", None)):
        if a:
            a = dict(a)
            fl = a.pop("flags", None)
            if fl:
                s.flags[i] = flags_from_names(fl)
            if a:
                s.args[i] = a
    folded = _gpu_slices(s, gpu, base, len(queues), intern)
    passes = np.concatenate([folded, _passes(pass_events, n, base, intern)])
    ops = _ops(op_events, base, n, thread_row, len(queues), intern)
    if not (np.diff(s.cpu_start_ns) > 0).all():  # a streamed file's scopes come as they ended
        order = np.lexsort((-s.cpu_end_ns, s.thread, s.cpu_start_ns))
        new_row = np.empty(n, np.int64)
        new_row[order] = np.arange(n)
        ops.scope = np.where(ops.scope >= 0, new_row[np.maximum(ops.scope, 0)], -1)
        s = ScopeTable(
            **{c: getattr(s, c)[order] for c in ScopeTable.COLUMNS},
            args=dict(sorted((int(new_row[k]), v) for k, v in s.args.items())),
        )
        passes[:, 0] = new_row[passes[:, 0]]
    nest(s)
    spans = _span_table(s, passes, bool(header.get("spans_cover_children")), intern)
    procs = header.get("processes")  # a merged trace keeps each process's threads under its pid
    pids = {pid} | ({int(p["pid"]) for p in procs} if isinstance(procs, list) else set())
    marks = [
        Mark(str(e["name"]), base + round(float(e["ts"]) * 1000.0), thread_row[int(e["tid"])], str(e["cat"]),
             dict(e.get("args") or {}))
        for e in instants
        if e.get("cat") in ("mark", "sync") and e.get("pid") in pids
    ]  # fmt: skip
    marks.sort(key=lambda m: (m.ts_ns, m.thread, m.name))
    names = canonical_names(list(name_ids), s, spans, ops)
    fits = {int(c["device"]): ClockFit.from_dict(c) for c in header.get("clock", [])}
    trace = Trace(header, names, threads, queues, s, spans, marks, fits, ops)
    an = header.get("anomalies")
    if isinstance(an, dict) and (an.get("truncated") or header.get("truncated")):
        from gputrace.resolver import anomaly_report  # the file keeps a few examples; rebuild them

        header["anomalies"] = anomaly_report(trace)
    return trace


def _gpu_slices(s: ScopeTable, gpu: list[Event], base: int, nq: int, intern: Intern) -> I64:
    """Each scope's GPU fields from its GPU slice (``bind_id``: its scope); returns the passes
    folded into their scope's slice as ``_passes`` does: (scope, label, start, end, submission)."""
    if not gpu:
        return np.zeros((0, 5), np.int64)
    n = len(s)
    rows = ints(_col(gpu, "bind_id"), "a gpu slice's scope")
    if rows.min() < 0 or rows.max() >= n:
        bad = int(rows.min() if rows.min() < 0 else rows.max())
        raise Malformed(f"a gpu slice names scope {bad}, but the trace has {n} scopes")
    if (counts := np.bincount(rows, minlength=n)).max() > 1:
        raise Malformed(
            f"scope {int(np.argmax(counts > 1))} has two gpu slices (was the file concatenated or edited?)"
        )
    ga = _col(gpu, "args")
    t0 = base + _ns(floats(_col(gpu, "ts"), "a gpu slice's ts"))
    g_us = floats(_col(ga, "gpu_us"), "gpu_us")  # as measured: may be below zero, flagged
    flags = _col(ga, "flags")
    for i in np.flatnonzero(g_us < 0).tolist():
        if not (
            isinstance(flags[i], list)
            and NEGATIVE_GPU_OK.intersection(f for f in flags[i] if isinstance(f, str))
        ):
            raise Malformed(
                f"gpu_us holds a negative value ({g_us[i]:g}) for scope {int(rows[i])}, which is not flagged"
            )
    s.gpu_start_ns[rows] = t0
    s.gpu_end_ns[rows] = t0 + _ns(g_us)
    sub, sub_ns = _optional_ns(ga, "submit_ts", base)
    s.submit_ns[rows[sub]] = sub_ns
    s.uncertainty_ns[rows] = _ns(floats(_col(ga, "uncertainty_us"), "uncertainty_us"))
    s.queue[rows] = ((ints(_col(gpu, "tid"), "a gpu slice's tid") % OVERLAP_TID_STEP) - 1).astype(np.int32)
    if s.queue.max() >= nq or s.queue.min() < -1:
        raise Malformed("a gpu slice is on a stream track that the header does not list")
    for i, fl in enumerate(flags):
        if fl:
            s.flags[rows[i]] |= np.uint32(flags_from_names(fl))
    folded = [i for i, a in enumerate(ga) if "pass" in a]
    r, label = rows[folded], np.array([intern(str(ga[i]["pass"])) for i in folded], np.int64)
    return np.stack([r, label, s.gpu_start_ns[r], s.gpu_end_ns[r], s.submit_ns[r]], axis=1)


def _passes(events: list[Event], n: int, base: int, intern: Intern) -> I64:
    """wgpu passes written as child slices of their scope's GPU slice."""
    if not events:
        return np.zeros((0, 5), np.int64)
    pa = _col(events, "args")
    rows = ints(_col(pa, "scope"), "a gpu pass's scope")
    if rows.min() < 0 or rows.max() >= n:
        raise Malformed("a gpu pass names a scope that the trace does not have")
    g0 = base + _ns(floats(_col(events, "ts"), "a gpu pass's ts"))
    g1 = g0 + _ns(floats(_col(events, "dur"), "a gpu pass's dur", non_negative=True))
    sub = np.full(len(events), NO_TIME, np.int64)
    has, sub_ns = _optional_ns(pa, "submit_ts", base)
    sub[has] = sub_ns
    labels = np.array([intern(str(x)) for x in _col(events, "name")], np.int64)
    return np.stack([rows, labels, g0, g1, sub], axis=1)


def _span_table(s: ScopeTable, p: I64, covers_children: bool, intern: Intern) -> SpanTable:
    """One span per pass, plus (where spans do not merely hull passes, as cuda's) one
    scope-level span, unlabelled, for each GPU scope without a pass; by scope, start and end."""
    with_pass = np.zeros(len(s), bool)
    with_pass[p[:, 0]] = True
    unl = np.flatnonzero((s.gpu_start_ns != NO_TIME) & ~with_pass & (not covers_children))
    label = intern("") if len(unl) else 0
    sc = np.concatenate([p[:, 0], unl])
    g0 = np.concatenate([p[:, 2], s.gpu_start_ns[unl]])
    g1 = np.concatenate([p[:, 3], s.gpu_end_ns[unl]])
    order = np.lexsort((g1, g0, sc))
    return SpanTable(
        scope=sc[order],
        label=np.concatenate([p[:, 1], np.full(len(unl), label)])[order].astype(np.int32),
        queue=s.queue[sc][order].astype(np.int32),
        submit_ns=np.concatenate([p[:, 4], s.submit_ns[unl]])[order],
        gpu_start_ns=g0[order],
        gpu_end_ns=g1[order],
    )


def _ops(
    events: list[Event], base: int, n_scopes: int, thread_row: dict[int, int], nq: int, intern: Intern
) -> OpTable:
    """The per-operation records (kernel/memcpy/memset events gputrace wrote), by (ts, op)."""
    events = [e for e in events if isinstance(e.get("args"), dict) and "op" in e["args"]]
    n = len(events)
    ops = OpTable.empty(n)
    if not n:
        return ops
    ts = floats(_col(events, "ts"), "an operation's ts")
    order = np.lexsort((ints(_col(_col(events, "args"), "op"), "an operation's op"), ts))
    events = [events[i] for i in order.tolist()]
    a = _col(events, "args")
    ops.scope = ints(_col(a, "scope"), "an operation's scope")
    if ops.scope.max() >= n_scopes or ops.scope.min() < -1:
        raise Malformed("an operation names a scope that the trace does not have")
    ops.kind = np.fromiter(map(_OP_KIND.__getitem__, _col(events, "cat")), np.int32, n)
    ops.name = _interned(_col(events, "name"), intern)
    ops.queue = ints(_col(a, "queue"), "an operation's queue").astype(np.int32)
    if ops.queue.max() >= nq or ops.queue.min() < 0:
        raise Malformed("an operation is on a stream that the header does not list")
    ops.thread = np.fromiter(map(thread_row.get, _get(a, "tid", None), repeat(-1)), np.int32, n)  # type: ignore[arg-type]
    ops.correlation = ints(_col(a, "correlation"), "an operation's correlation")
    dur = floats(_col(events, "dur"), "an operation's dur", non_negative=True)
    ops.gpu_start_ns = base + _ns(ts[order])
    ops.gpu_end_ns = ops.gpu_start_ns + _ns(dur)
    seen, c0 = _optional_ns(a, "call_ts", base)
    ops.call_start_ns[seen] = c0
    ops.call_end_ns[seen] = c0 + _ns(floats([a[i]["call_dur_us"] for i in seen], "call_dur_us"))
    ops.call_name = _interned(_get(a, "call", ""), intern)
    ops.bytes = ints(_get(a, "bytes", 0), "an operation's bytes")
    for col in ("grid", "block"):
        vals = _get(a, col, [0, 0, 0])
        if any(not isinstance(v, list) or len(v) != 3 for v in vals):
            raise Malformed(f"an operation's {col} is not three integers")
        setattr(ops, col, ints([i for v in vals for i in v], f"an operation's {col}").reshape(n, 3))
    ops.graph_id = ints(_get(a, "graph id", 0), "an operation's graph id")
    ops.graph_node_id = ints(_get(a, "graph node id", 0), "an operation's graph node id")
    return ops


# -- Chrome traces written by other tools --------------------------------------------------------
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu"})
ROW_COLUMNS = ("thread", "cpu_start_ns", "cpu_end_ns", "submit_ns", "gpu_start_ns", "gpu_end_ns", "queue")
FOREIGN_MAX_US = 1e16  # absolute epoch µs (~1.7e15) are fine; beyond this it is not a time


def _num(v: Any) -> bool:
    return type(v) in (int, float) and abs(v) < FOREIGN_MAX_US


def from_chrome(doc: Any, where: str) -> Trace:
    """A ``Trace`` from a Chrome trace written by another tool (PyTorch's profiler, say); its
    complete (X) slices read as CPU slices and, with a GPU category (``GPU_CATS``), GPU work on
    its ``args.device``/``args.stream`` (else pid/tid), enqueued by the CPU slice of the same
    ``args.correlation`` (docs/trace-format.md, "Traces from other tools"). No clock fit: the
    other tool placed GPU times on its CPU clock. ``TraceFileError`` if it has no slices.

    >>> doc = {"traceEvents": [
    ...     {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
    ...      "ts": 10.0, "dur": 5.0, "args": {"correlation": 7}},
    ...     {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20.0, "dur": 3.5,
    ...      "args": {"correlation": 7, "device": 0, "stream": 7}}]}
    >>> t = from_chrome(doc, "torch.json")
    >>> sc = t.find("gemm")[0]
    >>> sc.gpu_ns, sc.queue_gap_ns, sc.cpu_ns
    (3500, 10000, 5000)
    """
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceFileError(f"{where}: not a Chrome trace (no traceEvents list).")
    cpu: list[dict[str, Any]] = []
    gpu: list[dict[str, Any]] = []
    ranges = 0
    for e in events:
        if not (isinstance(e, dict) and e.get("ph") == "X" and _num(e.get("ts")) and _num(e.get("dur"))):
            continue
        if e["dur"] < 0 or e.get("cat") == "Trace":  # (Kineto's "PyTorch Profiler (0)": the session)
            continue
        if e.get("cat") == "gpu_user_annotation":  # a CPU range's span on the stream, not work:
            ranges += 1  # the range's GPU figures come from its kernels
            continue
        (gpu if str(e.get("cat", "")).lower() in GPU_CATS else cpu).append(e)
    if not cpu and not gpu:
        raise TraceFileError(
            f"{where}: a Chrome trace not written by gputrace, with no complete (X) slices to summarize."
        )
    threads: dict[tuple[Any, Any], int] = {}
    queues: dict[tuple[Any, Any], int] = {}
    launch: dict[Any, int] = {}  # correlation id -> cpu row
    rows: list[tuple[str, int, int, int, int, int, int, int]] = []  # name, then ROW_COLUMNS
    home = _overhead_threads(cpu)
    for e in cpu:
        key = home.get(id(e)) or (e.get("pid"), e.get("tid"))
        th = threads.setdefault(key, len(threads))
        c0 = round(e["ts"] * 1000.0)
        c1 = c0 + round(e["dur"] * 1000.0)
        args = e.get("args")
        if isinstance(args, dict) and "correlation" in args:
            with contextlib.suppress(TypeError):  # an unhashable correlation id links nothing
                launch.setdefault(args["correlation"], len(rows))
        rows.append((str(e.get("name", "")), th, c0, c1, NO_TIME, NO_TIME, NO_TIME, -1))
    matched = 0
    for e in gpu:
        raw_args = e.get("args")
        gargs: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        qkey = (gargs.get("device", e.get("pid")), gargs.get("stream", e.get("tid")))
        q = queues.setdefault(qkey, len(queues))
        g0 = round(e["ts"] * 1000.0)
        g1 = g0 + round(e["dur"] * 1000.0)
        corr = gargs.get("correlation")
        lr = launch.get(corr) if isinstance(corr, (int, str)) else None
        if lr is not None:
            matched += 1
            _, th, c0, c1, _, _, _, _ = rows[lr]
            rows.append((str(e.get("name", "")), th, c0, c1, c0, g0, g1, q))
        else:
            th = threads.setdefault(("gpu", qkey), len(threads))
            rows.append((str(e.get("name", "")), th, g0, g0, NO_TIME, g0, g1, q))
    rows.sort(key=lambda r: (r[2], r[1], -r[3]))
    ids: dict[str, int] = {}
    s = ScopeTable.empty(len(rows))
    cols = list(zip(*rows, strict=True))
    s.name = np.array([ids.setdefault(nm, len(ids)) for nm in cols[0]], np.int32)
    for col, values in zip(ROW_COLUMNS, cols[1:], strict=True):
        setattr(s, col, np.array(values, getattr(s, col).dtype))
    nest(s)
    from gputrace.flags import flag_outliers

    flags = np.zeros(len(rows), np.int64)
    flags[np.unique(s.name, return_index=True)[1]] |= int(Flag.COLD)  # the first call of each name
    flag_outliers(s, s.has_gpu(), flags)
    s.flags = flags.astype(np.uint32)
    spans = SpanTable.empty(0)
    names = canonical_names(list(ids), s, spans)
    # (each dict numbers its keys in the order they were added)
    thread_infos = [
        ThreadInfo(i, f"pid {k[0]} tid {k[1]}" if k[0] != "gpu" else f"GPU stream {k[1]}")
        for i, k in enumerate(threads)
    ]
    queue_infos = [
        QueueInfo(int(k[0]) if isinstance(k[0], int) else i, f"GPU {k[0]}", "chrome", f"stream {k[1]}")
        for i, k in enumerate(queues)
    ]
    gpu_rows = s.has_gpu()  # (every row has a CPU window: a GPU slice's own start, at least)
    start = int(np.concatenate([s.cpu_start_ns, s.gpu_start_ns[gpu_rows]]).min())
    end = int(np.concatenate([s.cpu_end_ns, s.gpu_end_ns[gpu_rows]]).max())
    note = (
        f"{where} was not written by gputrace: read its {len(cpu)} CPU and {len(gpu)} GPU slices "
        f"({matched} GPU slices matched to their launch); no clock fit, anomaly flags are cold "
        "calls and outliers only."
    )
    if ranges:
        note += (
            f" Its {ranges} GPU spans of record_function ranges (gpu_user_annotation) are not read as work."
        )
    header: dict[str, Any] = {"format_version": FORMAT_VERSION, "backend": "other tool", "source": "chrome"}
    header.update(source_note=note, start_ns=start, base_ns=start, end_ns=end, clock=[])
    top = doc if isinstance(doc, dict) else {}
    host = next((top[k] for k in ("host_name", "hostname") if isinstance(top.get(k), str)), None)
    if host:  # PyTorch's profiler writes the host's name at the top level
        header["host"] = {"name": host}
    return Trace(header, names, thread_infos, queue_infos, s, spans, [], {})


def _overhead_threads(cpu: list[dict[str, Any]]) -> dict[int, tuple[Any, Any]]:
    """Kineto writes the profiler's own overhead ("Activity Buffer Request", inside whatever op
    was running) on a process of its own (pid -1); ``key_averages`` counts it as a child of that
    op. Each such slice goes to the one thread whose slices enclose it (``id`` -> (pid, tid))."""
    over = [e for e in cpu if e.get("cat") == "overhead" and e.get("pid") == -1]
    if not over:
        return {}
    rest = [e for e in cpu if not (e.get("cat") == "overhead" and e.get("pid") == -1)]
    t0 = np.array([e["ts"] for e in rest], float)
    t1 = t0 + np.array([e["dur"] for e in rest], float)
    out = {}
    for e in over:
        inside = np.flatnonzero((t0 <= e["ts"]) & (t1 >= e["ts"] + e["dur"]))
        keys = {(rest[i].get("pid"), rest[i].get("tid")) for i in inside.tolist()}
        if len(keys) == 1:
            out[id(e)] = keys.pop()
    return out
