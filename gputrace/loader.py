"""Read a trace file written by gputrace back into the same ``Trace`` model.

>>> import gputrace, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.json")
>>> with gputrace.session(path, backend="cpu"):
...     with gputrace.trace("step"):
...         pass
>>> [s.name for s in gputrace.load(path)]
['step']
"""

from __future__ import annotations

import os
from collections.abc import Callable
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gputrace.errors import GputraceError
from gputrace.exporters.chrome import OP_CATS, OVERLAP_TID_STEP
from gputrace.model import (
    FORMAT_VERSION,
    NO_TIME,
    ClockFit,
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
from gputrace.readlimits import read_trace_bytes
from gputrace.tracecheck import negative_gpu_time, repeated_cpu_slice, repeated_gpu_scope


class TraceFileError(GputraceError):
    """A file that cannot be read as a trace; the message names the file and the problem."""


class NotAGputraceTrace(TraceFileError):
    """Valid JSON (maybe a Chrome trace from another tool), but not written by gputrace."""

    def __init__(self, message: str, document: Any = None) -> None:
        super().__init__(message)
        self.document = document


Progress = Callable[[str], None]


def read_document(path: str | os.PathLike[str], progress: Progress | None = None) -> Any:
    """The parsed JSON of a (possibly gzipped) file; ``TraceFileError`` with one sentence if not.

    ``progress`` (if given) is called with "read" once the bytes are in and "parsed" after JSON.
    """
    p = Path(path)
    try:  # bounded: regular files only, at most GPUTRACE_MAX_TRACE_BYTES (gzip: decompressed)
        raw = read_trace_bytes(p)
    except GputraceError as exc:
        raise TraceFileError(str(exc)) from None
    if not raw.strip():
        raise TraceFileError(f"{p}: the file is empty.")
    if progress is not None:
        progress("read")
    try:
        doc = orjson.loads(raw)
        if progress is not None:
            progress("parsed")
        return doc
    except orjson.JSONDecodeError as exc:
        detail = str(exc.args[0] if exc.args else exc)
        what = "truncated JSON" if "unexpected end" in detail.lower() else "not valid JSON"
        raise TraceFileError(f"{p}: {what} ({exc.args[0] if exc.args else exc}).") from None


def _looks_truncated(raw: bytes) -> bool:
    head = raw.lstrip()[:1]
    if head not in (b"{", b"["):
        return False
    try:
        orjson.loads(raw + b"]}")
    except orjson.JSONDecodeError as exc:
        return "unexpected end" in str(exc).lower() or "eof" in str(exc).lower()
    return True


def load(path: str | os.PathLike[str], *, progress: Progress | None = None) -> Trace:
    """Load a trace written by gputrace (``.json`` or ``.json.gz``).

    Raises ``TraceFileError`` (a ``GputraceError``) with one sentence naming the file and the
    problem for a missing, truncated, non-JSON or non-trace file; ``NotAGputraceTrace`` (a
    ``TraceFileError``) carries the parsed ``document`` of a JSON file gputrace did not write.
    ``progress`` is called with "read", "parsed" and "built" as loading goes on.
    """
    doc = read_document(path, progress)
    trace = from_document(doc, str(path))
    if progress is not None:
        progress("built")
    return trace


def from_document(doc: Any, where: str = "<trace>") -> Trace:
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NotAGputraceTrace(f"{where}: not a Chrome trace (no traceEvents list).", doc)
    header = doc.get("gputrace")
    if not isinstance(header, dict) or "format_version" not in header:
        raise NotAGputraceTrace(f"{where}: a Chrome trace, but not one written by gputrace.", doc)
    if header["format_version"] != FORMAT_VERSION:
        raise TraceFileError(
            f"{where}: trace format version {header['format_version']!r} is not supported "
            f"(this gputrace reads version {FORMAT_VERSION})."
        )
    try:
        return _build(doc["traceEvents"], header)
    except _Malformed as exc:
        raise TraceFileError(f"{where}: the trace is malformed: {exc}.") from None
    except KeyError as exc:
        raise TraceFileError(
            f"{where}: the trace is malformed: the field {exc.args[0]!r} is missing."
        ) from None
    except AttributeError:
        raise TraceFileError(
            f"{where}: the trace is malformed: an event, its args or a header entry is not an object."
        ) from None
    except (TypeError, ValueError, IndexError, OverflowError) as exc:
        raise TraceFileError(f"{where}: the trace is malformed ({type(exc).__name__}: {exc}).") from None


def _ns(us: float, base: int) -> int:
    return base + round(us * 1000.0)


# Anything beyond ~31 years in µs is not a time: refuse it instead of overflowing int64 ns.
MAX_ABS_US = 1e15


class _Malformed(ValueError):
    """A value inside an event that cannot be a trace value; the message says which."""


def _array(values: list[Any], empty: type[np.generic]) -> npt.NDArray[Any]:
    """``np.array(values)``, or an object array (refused by the callers) where numpy cannot."""
    if not values:
        return np.zeros(0, empty)
    try:
        return np.array(values)
    except (ValueError, TypeError, OverflowError):  # ragged lists, mixed nesting
        return np.array([None])


def _floats(values: list[Any], what: str, *, non_negative: bool = False) -> npt.NDArray[np.float64]:
    """Numbers as float64, refusing strings, nulls, nested lists and absurd magnitudes."""
    arr = _array(values, np.float64)
    if arr.ndim != 1 or arr.dtype.kind not in "iuf":
        bad = next((v for v in values if type(v) not in (int, float)), None)
        raise _Malformed(f"{what} must be a number, not {type(bad).__name__} {bad!r:.40}")
    out = arr.astype(np.float64)
    if len(out) and not (np.abs(out).max() < MAX_ABS_US):
        raise _Malformed(f"{what} holds an absurd value ({np.abs(out).max():g} µs)")
    if non_negative and len(out) and out.min() < 0:
        raise _Malformed(f"{what} holds a negative value ({out.min():g})")
    return out


def _ints(values: list[Any], what: str) -> npt.NDArray[np.int64]:
    arr = _array(values, np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        bad = next((v for v in values if type(v) is not int), None)
        raise _Malformed(f"{what} must be an integer, not {type(bad).__name__} {bad!r:.40}")
    return arr.astype(np.int64)


def _to_ns(us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    return np.rint(us * 1000.0).astype(np.int64)


def _no_nesting(s: ScopeTable) -> bool:
    """True when no scope starts before an earlier scope of its thread has ended (no parents)."""
    for th in np.unique(s.thread).tolist():
        rows = np.flatnonzero(s.thread == th)
        ends = np.maximum.accumulate(s.cpu_end_ns[rows])
        if (s.cpu_start_ns[rows][1:] < ends[:-1]).any():
            return False
    return True


def _build(events: list[Any], header: dict[str, Any]) -> Trace:
    base = int(header["base_ns"])
    pid = int(header.get("pid") or 1)
    threads = [ThreadInfo(int(t["tid"]), str(t["name"])) for t in header.get("threads", [])]
    thread_idx = {t.tid: i for i, t in enumerate(threads)}
    queues = [
        QueueInfo(int(q["device"]), str(q["device_name"]), str(q["backend"]), str(q["label"]))
        for q in header.get("queues", [])
    ]
    # One pass sorts the events by kind; everything after it is per-column and vectorised.
    cpu: list[dict[str, Any]] = []
    gpu: list[dict[str, Any]] = []
    passes: list[dict[str, Any]] = []
    op_events: list[dict[str, Any]] = []
    instants: list[dict[str, Any]] = []
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            cat = e.get("cat")
            if cat == "cpu":
                cpu.append(e)
            elif cat == "gpu":
                gpu.append(e)
            elif cat == "gpu.pass":
                passes.append(e)
            elif cat in OP_CATS and isinstance(e.get("args"), dict) and "op" in e["args"]:
                op_events.append(e)
        elif ph == "i":
            instants.append(e)
    n = len(cpu)
    raw_names = list(map(itemgetter("name"), cpu))
    name_ids: dict[Any, int] = {k: i for i, k in enumerate(dict.fromkeys(raw_names))}
    names = [str(k) for k in name_ids]
    label_ids: dict[str, int] = {}

    def intern_label(label: str) -> int:
        i = label_ids.get(label)
        if i is None:
            i = label_ids[label] = len(names)
            names.append(label)
        return i

    s = ScopeTable.empty(n)
    s.name = np.fromiter(map(name_ids.__getitem__, raw_names), np.int32, n)
    tids = _ints(list(map(itemgetter("tid"), cpu)), "a cpu slice's tid") % OVERLAP_TID_STEP
    s.thread = _thread_rows(tids, threads)
    ts = _floats(list(map(itemgetter("ts"), cpu)), "a cpu slice's ts")
    dur = _floats(list(map(itemgetter("dur"), cpu)), "a cpu slice's dur", non_negative=True)
    if why := repeated_cpu_slice(tids, s.name, ts, dur, cpu):
        raise _Malformed(why)
    s.cpu_start_ns = base + _to_ns(ts)
    s.cpu_end_ns = s.cpu_start_ns + _to_ns(dur)
    flags = np.zeros(n, np.uint32)
    for i in [i for i, e in enumerate(cpu) if "args" in e]:
        a = cpu[i]["args"]
        if a:
            a = dict(a)
            fl = a.pop("flags", None)
            if fl:
                flags[i] = flags_from_names(fl)
            if a:
                s.args[i] = a
    s.flags = flags
    if not _no_nesting(s):
        nest(s)

    if gpu:
        ga = list(map(itemgetter("args"), gpu))
        rows = _ints(list(map(itemgetter("scope"), ga)), "a gpu slice's scope")
        if rows.min() < 0 or rows.max() >= n:
            bad = int(rows.min() if rows.min() < 0 else rows.max())
            raise _Malformed(f"a gpu slice names scope {bad}, but the trace has {n} scopes")
        t0 = base + _to_ns(_floats(list(map(itemgetter("ts"), gpu)), "a gpu slice's ts"))
        s.gpu_start_ns[rows] = t0
        gpu_us = _floats(list(map(itemgetter("gpu_us"), ga)), "gpu_us")
        if why := repeated_gpu_scope(rows) or negative_gpu_time(gpu_us, ga):
            raise _Malformed(why)
        s.gpu_end_ns[rows] = t0 + _to_ns(gpu_us)
        with_sub = [i for i, a in enumerate(ga) if "submit_ts" in a]
        if with_sub:
            sub_us = _floats([ga[i]["submit_ts"] for i in with_sub], "submit_ts")
            s.submit_ns[rows[with_sub]] = base + _to_ns(sub_us)
        unc = _floats([a.get("uncertainty_us", 0.0) for a in ga], "uncertainty_us")
        s.uncertainty_ns[rows] = _to_ns(unc)
        gtid = _ints(list(map(itemgetter("tid"), gpu)), "a gpu slice's tid")
        s.queue[rows] = ((gtid % OVERLAP_TID_STEP) - 1).astype(np.int32)
        if s.queue.max() >= len(queues) or s.queue.min() < -1:
            raise _Malformed("a gpu slice is on a stream track that the header does not list")
        for i in [i for i, a in enumerate(ga) if a.get("flags")]:
            s.flags[rows[i]] = flags_from_names(ga[i]["flags"])

    has_gpu = s.gpu_start_ns != NO_TIME
    p_rows = np.zeros(0, np.int64)
    p_label = np.zeros(0, np.int32)
    p_sub = np.zeros(0, np.int64)
    p_g0 = p_g1 = np.zeros(0, np.int64)
    if passes:
        pa = list(map(itemgetter("args"), passes))
        p_rows = _ints(list(map(itemgetter("scope"), pa)), "a gpu pass's scope")
        if p_rows.min() < 0 or p_rows.max() >= n:
            raise _Malformed("a gpu pass names a scope that the trace does not have")
        p_label = np.fromiter((intern_label(str(e["name"])) for e in passes), np.int32, len(passes))
        p_g0 = base + _to_ns(_floats(list(map(itemgetter("ts"), passes)), "a gpu pass's ts"))
        p_dur = _floats(list(map(itemgetter("dur"), passes)), "a gpu pass's dur", non_negative=True)
        p_g1 = p_g0 + _to_ns(p_dur)
        p_sub = np.full(len(passes), NO_TIME, np.int64)
        with_sub = [i for i, a in enumerate(pa) if "submit_ts" in a]
        if with_sub:
            sub_us = _floats([pa[i]["submit_ts"] for i in with_sub], "submit_ts")
            p_sub[with_sub] = base + _to_ns(sub_us)
    with_pass = np.zeros(n, bool)
    with_pass[p_rows] = True
    # A scope-level event pair (cuda) is a span of its own; where spans are passes that their
    # scopes only hull (wgpu), a scope without passes of its own has none.
    unl = np.flatnonzero(has_gpu & ~with_pass) if not header.get("spans_cover_children") else p_rows[:0]
    unl_label = intern_label("") if len(unl) else 0
    sc = np.concatenate([p_rows, unl]).astype(np.int64)
    g0 = np.concatenate([p_g0, s.gpu_start_ns[unl]])
    g1 = np.concatenate([p_g1, s.gpu_end_ns[unl]])
    order = np.lexsort((g1, g0, sc))
    spans = SpanTable(
        scope=sc[order],
        label=np.concatenate([p_label, np.full(len(unl), unl_label, np.int32)])[order],
        queue=s.queue[sc][order].astype(np.int32),
        submit_ns=np.concatenate([p_sub, s.submit_ns[unl]])[order],
        gpu_start_ns=g0[order],
        gpu_end_ns=g1[order],
    )
    # a merged trace (gputrace merge) keeps each process's threads under its own pid
    procs = header.get("processes")
    pids = {pid} | ({int(p["pid"]) for p in procs} if isinstance(procs, list) else set())
    marks = [
        Mark(str(e["name"]), _ns(float(e["ts"]), base), thread_idx[int(e["tid"])], str(e["cat"]),
             dict(e.get("args") or {}))
        for e in instants
        if e.get("cat") in ("mark", "sync") and e.get("pid") in pids
    ]  # fmt: skip
    ops = _ops(
        op_events,
        base,
        n,
        threads,
        len(queues),
        lambda x: name_ids[x] if x in name_ids else intern_label(x),
    )
    names = canonical_names(names, s, spans, ops)
    fits = {int(c["device"]): ClockFit.from_dict(c) for c in header.get("clock", [])}
    return Trace(dict(header), names, threads, queues, s, spans, marks, fits, ops)


def _ops(
    events: list[dict[str, Any]], base: int, n_scopes: int, threads: list[ThreadInfo], n_queues: int,
    intern: Callable[[str], int],
) -> OpTable:  # fmt: skip
    """The per-operation records (kernel/memcpy/memset events gputrace wrote), in their order."""
    events = sorted(events, key=lambda e: int(e["args"]["op"]))
    n = len(events)
    ops = OpTable.empty(n)
    if not n:
        return ops
    a = [e["args"] for e in events]
    ops.scope = _ints([x["scope"] for x in a], "an operation's scope")
    if ops.scope.max() >= n_scopes or ops.scope.min() < -1:
        raise _Malformed("an operation names a scope that the trace does not have")
    ops.kind = np.array([OP_CATS.index(e["cat"]) for e in events], np.int32)
    ops.name = np.array([intern(str(e["name"])) for e in events], np.int32)
    ops.queue = _ints([x["queue"] for x in a], "an operation's queue").astype(np.int32)
    if ops.queue.max() >= n_queues or ops.queue.min() < 0:
        raise _Malformed("an operation is on a stream that the header does not list")
    by_tid = {t.tid: i for i, t in enumerate(threads)}
    ops.thread = np.array([by_tid.get(x["tid"], -1) if "tid" in x else -1 for x in a], np.int32)
    ops.correlation = _ints([x["correlation"] for x in a], "an operation's correlation")
    ops.gpu_start_ns = base + _to_ns(_floats([e["ts"] for e in events], "an operation's ts"))
    ops.gpu_end_ns = ops.gpu_start_ns + _to_ns(
        _floats([e["dur"] for e in events], "an operation's dur", non_negative=True)
    )
    seen = [i for i, x in enumerate(a) if "call_ts" in x]
    if seen:
        c0 = base + _to_ns(_floats([a[i]["call_ts"] for i in seen], "call_ts"))
        ops.call_start_ns[seen] = c0
        ops.call_end_ns[seen] = c0 + _to_ns(_floats([a[i]["call_dur_us"] for i in seen], "call_dur_us"))
    ops.call_name = np.array([intern(str(x.get("call", ""))) for x in a], np.int32)
    ops.bytes = _ints([x.get("bytes", 0) for x in a], "an operation's bytes")
    for col in ("grid", "block"):
        vals = [x.get(col, [0, 0, 0]) for x in a]
        if any(not isinstance(v, list) or len(v) != 3 for v in vals):
            raise _Malformed(f"an operation's {col} is not three integers")
        setattr(ops, col, _ints([i for v in vals for i in v], f"an operation's {col}").reshape(n, 3))
    ops.graph_id = _ints([x.get("graph id", 0) for x in a], "an operation's graph id")
    ops.graph_node_id = _ints([x.get("graph node id", 0) for x in a], "an operation's graph node id")
    return ops


def _thread_rows(tids: npt.NDArray[np.int64], threads: list[ThreadInfo]) -> npt.NDArray[np.int32]:
    """Row of ``threads`` for each tid; a tid the header does not list is malformed."""
    known = np.array([t.tid for t in threads], np.int64)
    if not len(tids):
        return np.zeros(0, np.int32)
    # the last listed thread wins for a repeated tid, as a dict would have it
    uniq, last = np.unique(known[::-1], return_index=True)
    idx = (len(known) - 1 - last).astype(np.int32)
    pos = np.searchsorted(uniq, tids)
    if not len(uniq):
        raise _Malformed("the header lists no threads, but the trace has cpu slices")
    ok = (pos < len(uniq)) & (uniq[np.minimum(pos, len(uniq) - 1)] == tids)
    if not ok.all():
        bad = int(tids[~ok][0])
        raise _Malformed(f"a cpu slice is on thread {bad}, which the header does not list")
    return idx[pos]
