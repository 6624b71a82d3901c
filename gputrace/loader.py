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

import gzip
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gputrace.errors import GputraceError
from gputrace.exporters.chrome import OVERLAP_TID_STEP
from gputrace.model import (
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
    flags_from_names,
    nest,
)


class TraceFileError(GputraceError):
    """A file that cannot be read as a trace; the message names the file and the problem."""


class NotAGputraceTrace(TraceFileError):
    """Valid JSON (maybe a Chrome trace from another tool), but not written by gputrace."""

    def __init__(self, message: str, document: Any = None) -> None:
        super().__init__(message)
        self.document = document


def read_document(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON of a (possibly gzipped) file; ``TraceFileError`` with one sentence if not."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise TraceFileError(f"{p}: no such file.") from None
    except IsADirectoryError:
        raise TraceFileError(f"{p}: is a directory, not a trace file.") from None
    except OSError as exc:
        raise TraceFileError(f"{p}: cannot be read ({exc.strerror or exc}).") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error):
            raise TraceFileError(f"{p}: the gzip data is truncated or corrupt.") from None
    if not raw.strip():
        raise TraceFileError(f"{p}: the file is empty.")
    try:
        return orjson.loads(raw)
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


def load(path: str | os.PathLike[str]) -> Trace:
    """Load a trace written by gputrace (``.json`` or ``.json.gz``).

    Raises ``TraceFileError`` (a ``GputraceError``) with one sentence naming the file and the
    problem for a missing, truncated, non-JSON or non-trace file.
    """
    doc = read_document(path)
    return from_document(doc, str(path))


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
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as exc:
        raise TraceFileError(
            f"{where}: the trace is malformed ({type(exc).__name__}: {exc})."
        ) from None


def _ns(us: float, base: int) -> int:
    return base + round(us * 1000.0)


def _build(events: list[Any], header: dict[str, Any]) -> Trace:
    base = int(header["base_ns"])
    pid = int(header.get("pid") or 1)
    threads = [ThreadInfo(int(t["tid"]), str(t["name"])) for t in header.get("threads", [])]
    thread_idx = {t.tid: i for i, t in enumerate(threads)}
    queues = [
        QueueInfo(int(q["device"]), str(q["device_name"]), str(q["backend"]), str(q["label"]))
        for q in header.get("queues", [])
    ]
    cpu = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") == "cpu"]
    n = len(cpu)
    names: list[str] = []
    name_ids: dict[str, int] = {}

    def intern(s: str) -> int:
        i = name_ids.get(s)
        if i is None:
            i = name_ids[s] = len(names)
            names.append(s)
        return i

    s = ScopeTable.empty(n)
    s.name = np.fromiter((intern(str(e["name"])) for e in cpu), np.int32, n)
    s.thread = np.fromiter((thread_idx[int(e["tid"]) % OVERLAP_TID_STEP] for e in cpu), np.int32, n)
    ts = np.fromiter((float(e["ts"]) for e in cpu), np.float64, n)
    dur = np.fromiter((float(e["dur"]) for e in cpu), np.float64, n)
    s.cpu_start_ns = base + np.rint(ts * 1000.0).astype(np.int64)
    s.cpu_end_ns = s.cpu_start_ns + np.rint(dur * 1000.0).astype(np.int64)
    flags = np.zeros(n, np.uint32)
    for i, e in enumerate(cpu):
        a = e.get("args")
        if a:
            a = dict(a)
            fl = a.pop("flags", None)
            if fl:
                flags[i] = flags_from_names(fl)
            if a:
                s.args[i] = a
    s.flags = flags
    nest(s)
    span_rows: list[tuple[int, int, int, int, int, int]] = []
    passes_of: dict[int, int] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat == "gpu":
            a = e["args"]
            r = int(a["scope"])
            t0 = _ns(float(e["ts"]), base)
            s.gpu_start_ns[r] = t0
            s.gpu_end_ns[r] = t0 + round(float(a["gpu_us"]) * 1000.0)
            if "submit_ts" in a:
                s.submit_ns[r] = _ns(float(a["submit_ts"]), base)
            s.uncertainty_ns[r] = round(float(a.get("uncertainty_us", 0.0)) * 1000.0)
            s.queue[r] = (int(e["tid"]) % OVERLAP_TID_STEP) - 1
            if a.get("flags"):
                s.flags[r] = flags_from_names(a["flags"])
        elif cat == "gpu.pass":
            a = e["args"]
            r = int(a["scope"])
            t0 = _ns(float(e["ts"]), base)
            sub = _ns(float(a["submit_ts"]), base) if "submit_ts" in a else NO_TIME
            span_rows.append((r, intern(str(e["name"])), -1, sub, t0, t0 + round(float(e["dur"]) * 1000.0)))
            passes_of[r] = passes_of.get(r, 0) + 1
    for r in np.flatnonzero(s.gpu_start_ns != NO_TIME).tolist():
        if r not in passes_of:
            span_rows.append((r, intern(""), -1, int(s.submit_ns[r]), int(s.gpu_start_ns[r]), int(s.gpu_end_ns[r])))
    span_rows = [(r, lab, int(s.queue[r]), sub, g0, g1) for r, lab, _, sub, g0, g1 in span_rows]
    span_rows.sort(key=lambda x: (x[0], x[4], x[5]))
    spans = SpanTable.empty(len(span_rows))
    if span_rows:
        cols = list(zip(*span_rows, strict=True))
        spans = SpanTable(
            scope=np.array(cols[0], np.int64),
            label=np.array(cols[1], np.int32),
            queue=np.array(cols[2], np.int32),
            submit_ns=np.array(cols[3], np.int64),
            gpu_start_ns=np.array(cols[4], np.int64),
            gpu_end_ns=np.array(cols[5], np.int64),
        )
    marks = [
        Mark(str(e["name"]), _ns(float(e["ts"]), base), thread_idx[int(e["tid"])], str(e["cat"]), dict(e.get("args") or {}))
        for e in events
        if isinstance(e, dict) and e.get("ph") == "i" and e.get("cat") in ("mark", "sync") and e.get("pid") == pid
    ]
    names = canonical_names(names, s, spans)
    fits = {int(c["device"]): ClockFit.from_dict(c) for c in header.get("clock", [])}
    return Trace(dict(header), names, threads, queues, s, spans, marks, fits)

