"""Chrome/Perfetto JSON (``.json``, ``.json.gz``): writer, streaming writer and reader.

The file is written so that any prefix of it that ends at a chunk boundary can be read back::

    {"displayTimeUnit":"ms","metadata":{"gputrace_stream":{...header at start...}},"traceEvents":[
    {event},{event},...,{event},            <- one line per chunk (one sync), flushed to the OS
    {event},...,{event},
    {closing event}
    ],"gputrace":{...final header: full clock fit, anomaly counts, end time...}}

Serialised JSON holds no raw newline, so a line is a chunk. A file cut anywhere (SIGKILL,
``os._exit``, a full disk) is read up to its last complete line, with ``"truncated": true`` in the
header; a ``.json.gz`` is flushed (``Z_SYNC_FLUSH``) after each chunk, so the same holds for it.
``gputrace view`` serves a cut file repaired, so Perfetto and the viewer open it too.

The keys before ``traceEvents`` are ones Perfetto's JSON tokenizer knows (``displayTimeUnit``,
``metadata``): it stops reading at the first top-level key it does not know, so the gputrace
header sits inside ``metadata`` at the start and under its own key only after the events. The
tokenizer also imports the complete events of a ``traceEvents`` array that ends early.
"""

from __future__ import annotations

import os
import zlib
from collections import defaultdict, deque
from collections.abc import Callable
from itertools import chain, compress, count, repeat
from operator import attrgetter, is_, is_not, itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from gputrace.errors import GputraceError
from gputrace.exporters._reading import no_nesting, span_table, with_folded
from gputrace.exporters.chrome import (
    GPU_PID_BASE,
    OP_CATS,
    OVERLAP_TID_STEP,
    Encoder,
    file_header,
    capped_header,
    queue_dict,
)
from gputrace.gcpause import gc_paused
from gputrace.jsonsafe import dumps
from gputrace.loader import NotAGputraceTrace, TraceFileError, read_bytes
from gputrace.model import (
    FORMAT_VERSION,
    NO_TIME,
    ClockFit,
    Mark,
    OpTable,
    QueueInfo,
    ScopeTable,
    ThreadInfo,
    Trace,
    canonical_names,
    flags_from_names,
    nest,
)
from gputrace.readlimits import gunzip_trace
from gputrace.tracecheck import negative_gpu_time, repeated_cpu_slice, repeated_gpu_scope

EXTENSIONS = (".json", ".json.gz")
Progress = Callable[[str], None]

PREFIX = b'{"displayTimeUnit":"ms","metadata":{"gputrace_stream":'
EVENTS_OPEN = b'},"traceEvents":[\n'
CLOSE = b'\n],"gputrace":'
GZIP_LEVEL = 1  # speed first: level 1 already gives most of the ratio on trace events


class StreamWriter:
    """Append chunks to a trace file as a session runs; ``close`` writes the final header.

    Each ``append`` is one ``write`` to the OS (and, for gzip, a sync flush first), so after it
    returns the chunk survives the process being killed.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        *,
        gzip: bool | None = None,
        start_header: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self._gz = self.path.name.endswith(".gz") if gzip is None else gzip
        self._z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31) if self._gz else None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._enc = Encoder(header)
        self.closed = False
        try:
            start = capped_header(header) if start_header is None else start_header
            self._write(PREFIX + dumps(start) + EVENTS_OPEN)
        except BaseException:
            self.closed = True
            os.close(self._fd)
            raise

    @property
    def rows(self) -> int:
        """Scopes written so far."""
        return self._enc.rows

    def append(self, chunk: Trace) -> None:
        parts = self._enc.encode(chunk)
        if parts:
            self._write([*parts, b"\n"])

    def _write(self, data: bytes | list[Any], final: bool = False) -> None:
        """Bytes, or a chunk given in bytes-like pieces: compressed piece by piece and written
        with one ``writev`` (never joined into one more copy of the chunk)."""
        parts = [data] if isinstance(data, bytes) else data
        if self._z is not None:
            z = self._z
            parts = [*map(z.compress, parts), z.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH)]
        bufs = [m for m in (memoryview(p).cast("B") for p in parts) if m.nbytes]
        if not hasattr(os, "writev"):
            bufs = [memoryview(b"".join(bufs))]
        i = 0
        while i < len(bufs):
            n = os.writev(self._fd, bufs[i : i + 512]) if len(bufs) - i > 1 else os.write(self._fd, bufs[i])
            while n and i < len(bufs):
                if n >= len(bufs[i]):
                    n -= len(bufs[i])
                    i += 1
                else:
                    bufs[i] = bufs[i][n:]
                    n = 0

    def close(self, header: dict[str, Any]) -> None:
        if self.closed:
            return
        self.closed = True
        enc = self._enc
        header = capped_header(header)
        header.setdefault("threads", [{"tid": t.tid, "name": t.name} for t in enc.threads.values()])
        header.setdefault("queues", [queue_dict(q) for q in enc.queues])
        header["base_ns"] = enc.base
        if enc.ops_not_drawn:
            header["ops_not_drawn"] = enc.ops_not_drawn
        last = {"ph": "M", "name": "process_sort_index", "pid": enc.pid, "tid": 0, "args": {"sort_index": 0}}
        tail = dumps(last) + CLOSE + dumps(header)
        if enc.has_ops:
            # Holistic Trace Analysis finds the rank with the regex '"rank":\s+(\d+)' (PyTorch
            # writes indented JSON), so this one key keeps its space.
            tail += b',"distributedInfo": {"rank": %d}' % int(header.get("rank") or 0)
        try:
            self._write(tail + b"}\n", final=True)
        finally:
            os.close(self._fd)

    def abandon(self) -> None:
        """Close the file as it stands (what a crash would leave: it reads as truncated)."""
        if not self.closed:
            self.closed = True
            os.close(self._fd)


def start_stub(header: dict[str, Any]) -> dict[str, Any]:
    """What the header before the events needs when the whole header follows them."""
    keep = ("format_version", "version", "backend", "start_ns", "base_ns", "pid", "rank", "host", "processes")
    return {k: header[k] for k in keep if k in header}


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write the whole ``trace`` (gzip when the name ends in ``.gz``); atomic: temp file + rename."""
    p = Path(path)
    header = file_header(trace)
    tmp = p.with_name(p.name + ".partial")
    try:
        # the whole header follows the events; the one before them is what a cut file needs
        w = StreamWriter(tmp, header, gzip=p.name.endswith(".gz"), start_header=start_stub(header))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        w.append(trace)
        w.close(header)
        tmp.replace(p)  # a crash mid-write never leaves a truncated trace under the real name
    except BaseException:
        w.abandon()
        tmp.unlink(missing_ok=True)
        raise
    return p


# -- reading ---------------------------------------------------------------------------------------
def decode(raw: bytes, where: str) -> tuple[Any, bool]:
    """The parsed document of a file's (decompressed) bytes, and whether it had to be repaired."""
    try:
        return orjson.loads(raw), False
    except orjson.JSONDecodeError as exc:
        fixed = repair(raw)
        if fixed is not None:
            try:
                return orjson.loads(fixed), True
            except orjson.JSONDecodeError:
                pass
        detail = str(exc.args[0] if exc.args else exc)
        what = "truncated JSON" if "unexpected end" in detail.lower() else "not valid JSON"
        raise TraceFileError(f"{where}: {what} ({detail}).") from None


def repair(raw: bytes) -> bytes | None:
    """A streamed file cut short, closed after its last complete chunk, with its start header
    (marked ``"truncated": true``) as the final one; None if it is not such a file."""
    if not raw.startswith(PREFIX):
        return None
    start = raw.find(EVENTS_OPEN)
    if start < 0:
        return None
    try:
        header = orjson.loads(raw[len(PREFIX) : start])
    except orjson.JSONDecodeError:
        return None
    header["truncated"] = True
    tail = CLOSE + dumps(header) + b"}\n"
    body_start = start + len(EVENTS_OPEN)
    end = raw.rfind(b",\n", body_start - 1)
    if end < body_start:
        return raw[:body_start] + tail
    return raw[:end] + tail


def servable(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes as a viewer should get them: as they are, or, for a streamed file cut
    short (a killed program, or one still running), closed after its last complete chunk."""
    data = read_bytes(path)  # bounded (gputrace.readlimits): a FIFO is refused, not waited on
    gz = data[:2] == b"\x1f\x8b"
    if gz:
        d = zlib.decompressobj(31)
        try:
            raw = d.decompress(data)
        except zlib.error:
            return data
        if d.eof:
            return data
    else:
        raw = data
    if not raw.startswith(PREFIX) or raw.rfind(CLOSE, max(0, len(raw) - (1 << 20))) >= 0:
        return data  # not streamed by gputrace, or closed: the final header follows the events
    fixed = repair(raw)
    if fixed is None:
        return data
    if gz:
        z = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
        return z.compress(fixed) + z.flush()
    return fixed


def read_raw(path: str | os.PathLike[str]) -> tuple[bytes, bool]:
    """A file's bytes, decompressed; True when a gzip stream ends early (kept up to its end)."""
    raw = read_bytes(path)  # bounded (gputrace.readlimits)
    if raw[:2] != b"\x1f\x8b":
        return raw, False
    try:  # capped like every read; a stream cut short is kept up to its end
        return gunzip_trace(raw, path)
    except GputraceError as exc:
        raise TraceFileError(str(exc)) from None


def read_document(path: str | os.PathLike[str], progress: Progress | None = None) -> tuple[Any, bool]:
    """The parsed JSON of a gputrace or Chrome trace file, repaired if it was cut short."""
    raw, cut = read_raw(path)
    return _document(raw, cut, path, progress)


def _document(
    raw: bytes, cut: bool, path: str | os.PathLike[str], progress: Progress | None
) -> tuple[Any, bool]:
    if not raw or raw.isspace():  # (no copy of the file, as strip() would make)
        raise TraceFileError(f"{path}: the file is empty.")
    if progress is not None:
        progress("read")
    try:
        doc, repaired = decode(raw, str(path))
    except TraceFileError:
        if cut:
            raise TraceFileError(f"{path}: the gzip data is truncated or corrupt.") from None
        raise
    if cut and not (isinstance(doc, dict) and "gputrace_stream" in (doc.get("metadata") or {})):
        # only a streamed gputrace file is meant to be readable when cut short
        raise TraceFileError(f"{path}: the gzip data is truncated or corrupt.")
    if progress is not None:
        progress("parsed")
    return doc, cut or repaired


def read(path: str | os.PathLike[str], progress: Progress | None = None) -> Trace:
    with gc_paused():
        raw, cut = read_raw(path)
        fast = _read_fast(raw, str(path), progress, cut=cut)
        if fast is not None:
            trace = fast
        else:
            doc, truncated = _document(raw, cut, path, progress)
            trace = from_document(doc, str(path), truncated=truncated)
            del doc  # freed here, while the collector still sleeps
    if progress is not None:
        progress("built")
    return trace


# -- the fast path: msgspec decodes the events into slotted structs (gputrace.exporters.
# _json_structs), skipping the fields gputrace does not read and keeping each event's args as raw
# bytes, decoded (in batches) only for the events whose args are read. About 2-3x faster than
# dicts from orjson, and their garbage is cheap.
# Anything unexpected (a cut file, a damaged one, another tool's trace) falls back to the plain
# path, which gives the same trace or the same one-sentence error as before.
_S: Any = None  # gputrace.exporters._json_structs, once a read has imported it


def _fast() -> Any:
    """The fast path's struct module, or None where msgspec is missing (every file still reads)."""
    global _S
    if _S is None:
        try:
            from gputrace.exporters import _json_structs
        except ImportError:  # pragma: no cover - msgspec is a dependency
            return None
        _S = _json_structs
    return _S


def _is_struct(x: Any) -> bool:
    """A decoded struct (the fast path), not a dict (the plain path)."""
    return hasattr(type(x), "__struct_config__")


def _decode_field(
    events: list[Any] | tuple[Any, ...], key: str, as_: str = "", *, rows: list[int] | None = None
) -> None:
    """Decode ``key`` (raw JSON) of the events that have it (``rows``, where known), in one
    call: to dicts, or to the args structs named by ``as_`` (only the fields the reader takes)."""
    present = _present(list(map(attrgetter(key), events)), _S.RAW_NONE) if rows is None else rows
    if not present:  # (absent: left as it is)
        return
    if len(present) == len(events):
        sel = list(map(attrgetter(key), events))
    else:
        sel = list(map(attrgetter(key), map(events.__getitem__, present)))
    if as_:  # each on its own: no copy of them all joined (as fast per byte)
        values = list(map(_S.ARGS_DECODERS[as_].decode, sel))
    else:
        values = orjson.loads(b"[" + b",".join(sel) + b"]")
    kept = events if len(present) == len(events) else map(events.__getitem__, present)
    if len(values) != len(present):
        raise ValueError("the args decoded are not one per event")
    deque(map(setattr, kept, repeat(key), values), maxlen=0)  # (setattr on each, in C)


def _present(values: list[Any], absent: Any) -> list[int]:
    """Rows of ``values`` that are not ``absent`` (a sentinel), found in C."""
    if values.count(absent) == len(values):  # (by identity first: the usual, sparse case)
        return []
    return list(compress(range(len(values)), map(is_not, values, repeat(absent))))


def _read_fast(
    raw: bytes, where: str, progress: Progress | None, *, cut: bool = False, repaired: bool = False
) -> Trace | None:
    """The trace of a gputrace JSON file, or None where the plain path must read it. A streamed
    file cut short (``cut``: its gzip stream ends early) reads up to its last chunk, as there."""
    fast = _fast()
    if fast is None:
        return None
    if progress is not None and not repaired:
        progress("read")
    try:
        doc: Any = fast.DOC_DECODER.decode(raw)
    except fast.msgspec.DecodeError:  # not JSON here: a streamed file is closed after its last chunk
        fixed = None if repaired or not raw.startswith(PREFIX) else repair(raw)
        return None if fixed is None else _read_fast(fixed, where, progress, cut=cut, repaired=True)
    except Exception:  # another shape: the plain path says what it is
        return None
    if cut and "gputrace_stream" not in (doc.metadata if isinstance(doc.metadata, dict) else {}):
        return None  # only a streamed gputrace file reads when cut short: the plain path refuses it
    truncated = cut or repaired
    header = doc.gputrace
    if isinstance(header, dict) and header.get("truncated"):
        truncated = True
    if not isinstance(header, dict):
        meta = doc.metadata
        header = meta.get("gputrace_stream") if isinstance(meta, dict) else None
        truncated = True
    if not isinstance(header, dict) or header.get("format_version") != FORMAT_VERSION:
        return None
    if progress is not None:
        progress("parsed")
    header = dict(header)
    if truncated:
        header["truncated"] = True
    try:
        return _build(doc.traceEvents, header)
    except Exception:  # a malformed value: the plain path names it
        return None


def _classify_structs(events: list[Any]) -> tuple[Any, ...]:
    """``_classify`` for decoded structs; the args of the events kept are decoded here, in one
    batch per kind."""
    complete, instant, async_begin, unset = _S.Complete, _S.Instant, _S.AsyncBegin, _S.UNSET
    metadata, async_end = _S.Metadata, _S.AsyncEnd
    names: list[Any] = []
    cpu: list[Any] = []
    gpu: list[Any] = []
    passes: list[Any] = []
    instants: list[Any] = []
    waits: list[Any] = []
    op_events: list[Any] = []
    no_cat: list[Any] = []
    cpu_add, gpu_add, instant_add, wait_add = cpu.append, gpu.append, instants.append, waits.append
    no_cat_names: list[Any] = []
    no_cat_add, no_cat_name = no_cat.append, no_cat_names.append
    # the rows of the cpu and gpu slices that have args, noted as they are met
    cpu_rows: list[int] = []
    gpu_rows: list[int] = []
    cpu_row, gpu_row, raw_none = cpu_rows.append, gpu_rows.append, _S.RAW_NONE

    def cat_cpu(e: Any) -> None:  # (older files: cat "cpu" / "gpu")
        if e.args is not raw_none:
            cpu_row(len(cpu))
        cpu_add(e)

    def cat_gpu(e: Any) -> None:
        if e.args is not raw_none:
            gpu_row(len(gpu))
        gpu_add(e)

    by_cat = {"cpu": cat_cpu, "gpu": cat_gpu, "gpu.pass": passes.append}
    by_cat.update(dict.fromkeys(OP_CATS, op_events.append))
    route = by_cat.get
    for e in events:  # (the kinds most frequent first)
        kind = type(e)
        if kind is complete:
            cat = e.cat
            if cat is unset or cat is None:
                if e.pid >= GPU_PID_BASE:
                    if e.args is not raw_none:
                        gpu_row(len(gpu))
                    gpu_add(e)
                else:
                    if e.args is not raw_none:
                        cpu_row(len(cpu))
                    cpu_add(e)
            else:
                add = route(cat) if type(cat) is str else None
                if add is not None:
                    add(e)
        elif kind is async_begin:  # a wait: named "queued…" with no cat (older files: cat "queued")
            if e.cat is unset:
                no_cat_add(e)
                no_cat_name(e.name)
            elif e.cat == "queued":
                wait_add(e)
        elif kind is async_end:
            continue
        elif kind is instant:
            instant_add(e)
        elif kind is metadata:
            names.append(e)
    if no_cat:  # (a few distinct names: each is looked at once)
        # (a wait's name is kept as its raw JSON, cheaper than a str: one stream, one name)
        first = no_cat_names[0]
        keys = [bytes(first)] if no_cat_names.count(first) == len(no_cat_names) else None
        if keys is None:
            keys = list(map(bytes, no_cat_names))
        distinct = set(keys)
        queued = {k for k in distinct if _queued(k)}
        if len(queued) == len(distinct):
            waits += no_cat
        else:
            waits += compress(no_cat, map(queued.__contains__, keys))
    _decode_field(cpu, "args", rows=cpu_rows)
    for group in (passes, instants):
        _decode_field(group, "args")
    _decode_field(gpu, "args", "gpu", rows=gpu_rows)  # args that are no object: the plain path
    _decode_field(op_events, "args", "op")
    if op_events:  # an operation's record has args and an op number
        op_args = list(map(attrgetter("args"), op_events))
        if op_args.count(raw_none) or unset in map(attrgetter("op"), op_args):
            op_events = [e for e in op_events if e.args is not raw_none and e.args.op is not unset]
    # (a wait without an id2 object, which the plain path passes over, fails when its id2.local
    # is gathered: the plain path reads that file)
    return cpu, gpu, passes, instants, waits, op_events, names, {"cpu": cpu_rows, "gpu": gpu_rows}


def _queued(name: bytes) -> bool:
    """Whether a raw JSON name (empty: none) is a wait's: a str starting "queued"."""
    if not name:
        return False
    text = orjson.loads(name)
    return type(text) is str and text.startswith("queued")


def _get_col(objs: list[Any] | tuple[Any, ...], key: str, default: Any) -> list[Any]:
    """``[o.get(key, default) for o in objs]``, in C."""
    if not objs or not _is_struct(objs[0]):
        return list(map(dict.get, objs, repeat(key), repeat(default)))
    vals = list(map(attrgetter(key.replace(" ", "_")), objs))
    unset = _S.UNSET
    if any(map(is_, vals, repeat(unset))):
        vals = [default if v is unset else v for v in vals]
    return vals


def _col(events: list[Any] | tuple[Any, ...], key: str, *, number: bool = False) -> list[Any]:
    """``[e[key] for e in events]``, in C; KeyError where an event lacks ``key``. (Of structs, a
    ``number`` column is not checked here: an absent value, UNSET, is refused as no number.)"""
    if not events or not _is_struct(events[0]):
        return list(map(itemgetter(key), events))
    vals = list(map(attrgetter(key.replace(" ", "_")), events))
    if not number and any(map(is_, vals, repeat(_S.RAW_NONE if key in _S.RAW_FIELDS else _S.UNSET))):
        raise KeyError(key)
    return vals


def from_document(doc: Any, where: str = "<trace>", *, truncated: bool = False) -> Trace:
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NotAGputraceTrace(f"{where}: not a Chrome trace (no traceEvents list).", doc)
    header = doc.get("gputrace")
    if isinstance(header, dict) and header.get("truncated"):
        truncated = True  # repaired: the start header stands in for the final one
    if not isinstance(header, dict):
        meta = doc.get("metadata")
        header = meta.get("gputrace_stream") if isinstance(meta, dict) else None
        if isinstance(header, dict):
            truncated = True  # the final header is missing: the writer never closed the file
    if not isinstance(header, dict) or "format_version" not in header:
        raise NotAGputraceTrace(f"{where}: a Chrome trace, but not one written by gputrace.", doc)
    if header["format_version"] != FORMAT_VERSION:
        raise TraceFileError(
            f"{where}: trace format version {header['format_version']!r} is not supported "
            f"(this gputrace reads version {FORMAT_VERSION})."
        )
    header = dict(header)
    if truncated:
        header["truncated"] = True
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


def _floats_of(
    events: list[Any] | tuple[Any, ...], key: str, what: str, *, non_negative: bool = False
) -> npt.NDArray[np.float64]:
    """``_floats`` of the events' ``key``. Decoded structs hold it typed (a number, or UNSET,
    which numpy refuses): gathered straight into the array."""
    if not events or not _is_struct(events[0]):
        return _floats(_col(events, key, number=True), what, non_negative=non_negative)
    out = np.fromiter(map(attrgetter(key), events), np.float64, len(events))
    if not (np.abs(out).max() < MAX_ABS_US) or (non_negative and out.min() < 0):
        raise _Malformed(f"{what} holds an absurd or negative value")  # (the plain path names it)
    return out


def _ints_of(events: list[Any] | tuple[Any, ...], key: str, what: str) -> npt.NDArray[np.int64]:
    """``_ints`` of the events' ``key``; of structs, typed as for ``_floats_of``."""
    if not events or not _is_struct(events[0]):
        return _ints(_col(events, key, number=True), what)
    return np.fromiter(map(attrgetter(key), events), np.int64, len(events))


def _to_ns(us: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    return np.rint(us * 1000.0).astype(np.int64)


def _names_from_metadata(events: list[Any], pid: int) -> tuple[list[ThreadInfo], list[QueueInfo]]:
    """Threads and queues from the name events (a cut file has no final header listing them)."""
    threads: dict[int, ThreadInfo] = {}
    queues: dict[int, QueueInfo] = {}
    if events and _is_struct(events[0]):
        events = [e for e in events if type(e) is _S.Metadata]  # the others are no name events
    for e in events:
        if e.get("ph") != "M" or e.get("name") != "thread_name":
            continue
        p, tid, a = int(e["pid"]), int(e["tid"]), e.get("args") or {}
        if p >= GPU_PID_BASE:
            q = a.get("queue")
            if isinstance(q, dict) and tid < OVERLAP_TID_STEP:
                queues[tid - 1] = QueueInfo(
                    int(q["device"]), str(q["device_name"]), str(q["backend"]), str(q["label"])
                )
        elif tid < OVERLAP_TID_STEP:
            threads.setdefault(tid, ThreadInfo(tid, str(a.get("name", ""))))
    qlist = [queues.get(i, QueueInfo(0, "GPU", "", f"queue {i}")) for i in range(max(queues, default=-1) + 1)]
    return list(threads.values()), qlist


def _pick(events: list[Any] | tuple[Any, ...], rows: npt.NDArray[np.intp]) -> tuple[Any, ...]:
    """``events[rows]`` as a tuple, selected in C."""
    if len(rows) == 0:
        return ()
    if len(rows) == 1:
        return (events[int(rows[0])],)
    return itemgetter(*rows.tolist())(events)  # type: ignore[no-any-return]


def _classify(events: list[Any]) -> tuple[Any, ...]:
    """The events gputrace reads, by kind, each in file order: cpu slices, gpu slices, passes,
    instants, queued waits, operations and name events. (A plain loop: faster here than numpy
    selection.)"""
    cpu: list[dict[str, Any]] = []
    gpu: list[dict[str, Any]] = []
    passes: list[dict[str, Any]] = []
    instants: list[dict[str, Any]] = []
    waits: list[dict[str, Any]] = []
    op_events: list[dict[str, Any]] = []
    names: list[dict[str, Any]] = []
    args_rows: dict[str, list[int]] = {}  # (the rows with args: found where needed)
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            cat = e.get("cat")
            if cat is None:  # a scope's slice: CPU in a Python process, GPU in a GPU process
                (gpu if e["pid"] >= GPU_PID_BASE else cpu).append(e)
            elif cat == "cpu":
                cpu.append(e)
            elif cat == "gpu":
                gpu.append(e)
            elif cat == "gpu.pass":
                passes.append(e)
            elif cat in OP_CATS and isinstance(e.get("args"), dict) and "op" in e["args"]:
                op_events.append(e)
        elif ph == "i":
            instants.append(e)
        elif ph == "b" and isinstance(e.get("id2"), dict) and _is_wait(e.get("cat"), e.get("name")):
            waits.append(e)
        elif ph == "M":
            names.append(e)
    return cpu, gpu, passes, instants, waits, op_events, names, args_rows


def _is_wait(cat: Any, name: Any) -> bool:
    """Whether an async begin is a scope's wait: named "queued…" with no category (its end has
    neither name nor category, docs/output.md), or, in older files, ``cat: "queued"``."""
    return cat == "queued" or (cat is None and type(name) is str and name.startswith("queued"))


def _build(events: list[Any], header: dict[str, Any]) -> Trace:
    base = int(header["base_ns"])
    pid = int(header.get("pid") or 1)
    # One pass sorts the events by kind; everything after it is per-column and vectorised.
    structs = bool(events) and _is_struct(events[0])
    cpu, gpu, passes, instants, waits, op_events, name_events, args_rows = (
        _classify_structs if structs else _classify
    )(events)
    if "threads" in header:
        threads = [ThreadInfo(int(t["tid"]), str(t["name"])) for t in header.get("threads", [])]
        queues = [
            QueueInfo(int(q["device"]), str(q["device_name"]), str(q["backend"]), str(q["label"]))
            for q in header.get("queues", [])
        ]
    else:
        threads, queues = _names_from_metadata(name_events, pid)
        header["threads"] = [{"tid": t.tid, "name": t.name} for t in threads]
        header["queues"] = [queue_dict(q) for q in queues]
    thread_idx = {t.tid: i for i, t in enumerate(threads)}
    n = len(cpu)
    # each distinct name numbered as first met, in one pass (a missing name: KeyError, as _col)
    first_met: defaultdict[Any, int] = defaultdict(count().__next__)
    get_name = attrgetter("name") if structs else itemgetter("name")
    name_col = np.fromiter(map(first_met.__getitem__, map(get_name, cpu)), np.int32, n)
    name_ids: dict[Any, int] = dict(first_met)
    if structs and _S.UNSET in name_ids:
        raise KeyError("name")
    names = [str(k) for k in name_ids]
    label_ids: dict[str, int] = {}

    def intern_label(label: str) -> int:
        i = label_ids.get(label)
        if i is None:
            i = label_ids[label] = len(names)
            names.append(label)
        return i

    s = ScopeTable.empty(n)
    s.name = name_col
    tids = _ints_of(cpu, "tid", "a cpu slice's tid") % OVERLAP_TID_STEP
    s.thread = _thread_rows(tids, threads)
    ts = _floats_of(cpu, "ts", "a cpu slice's ts")
    dur = _floats_of(cpu, "dur", "a cpu slice's dur", non_negative=True)
    # a slice can only repeat another with the same start: none where starts only increase
    if not (np.diff(ts) > 0).all() and (why := repeated_cpu_slice(tids, s.name, ts, dur, cpu)):
        raise _Malformed(why)
    s.cpu_start_ns = base + _to_ns(ts)
    s.cpu_end_ns = s.cpu_start_ns + _to_ns(dur)
    flags = np.zeros(n, np.uint32)
    a_rows = np.array(args_rows["cpu"], np.intp) if "cpu" in args_rows else _with_key(cpu, "args")
    for i, a in zip(a_rows.tolist(), _col(_pick(cpu, a_rows), "args"), strict=True):
        if a:
            a = dict(a)
            fl = a.pop("flags", None)
            if fl:
                flags[i] = flags_from_names(fl)
            if a:
                s.args[i] = a
    s.flags = flags

    fold_rows, fold_labels = np.zeros(0, np.int64), []
    if gpu:
        # args are rare on a GPU slice (flags, the uncertainty where it changes): look at those only
        ga, with_key = _gpu_args(gpu, args_rows.get("gpu"))
        # the scope is the flow's bind_id (older files: args.scope)
        try:
            rows = _ints_of(gpu, "bind_id", "a gpu slice's scope")
        except (KeyError, TypeError):
            scope_ids = [e["bind_id"] if "bind_id" in e else e["args"]["scope"] for e in gpu]
            rows = _ints(scope_ids, "a gpu slice's scope")
        if rows.min() < 0 or rows.max() >= n:
            bad = int(rows.min() if rows.min() < 0 else rows.max())
            raise _Malformed(f"a gpu slice names scope {bad}, but the trace has {n} scopes")
        t0 = base + _to_ns(_floats_of(gpu, "ts", "a gpu slice's ts"))
        # (rows are in 0..n-1 here: a count per scope finds a repeat faster than sorting)
        if np.bincount(rows, minlength=n).max(initial=0) > 1 and (why := repeated_gpu_scope(rows)):
            raise _Malformed(why)
        s.gpu_start_ns[rows] = t0
        g_dur = _floats_of(gpu, "dur", "a gpu slice's dur", non_negative=True)
        with_us = with_key("gpu_us")  # negative durations, as measured
        if with_us:
            g_dur[with_us] = _floats([ga[i]["gpu_us"] for i in with_us], "gpu_us")
        if why := negative_gpu_time(g_dur, ga):
            raise _Malformed(why)
        s.gpu_end_ns[rows] = t0 + _to_ns(g_dur)
        with_sub = with_key("submit_ts")
        if with_sub:
            sub_us = _floats([ga[i]["submit_ts"] for i in with_sub], "submit_ts")
            s.submit_ns[rows[with_sub]] = base + _to_ns(sub_us)
        if waits:  # a wait slice starts at the submission (id2.local names the scope)
            if structs:  # (an id2 that is no object, or null: the plain path)
                w_rows = _ints_of(waits, "id2.local", "a wait's id")
            else:
                w_rows = _ints(_col(_col(waits, "id2"), "local"), "a wait's id")
            if len(w_rows) and (w_rows.min() < 0 or w_rows.max() >= n):
                raise _Malformed("a queued wait names a scope that the trace does not have")
            s.submit_ns[w_rows] = base + _to_ns(_floats_of(waits, "ts", "a wait's ts"))
        # written where it changes: carried forward over the GPU slices in file order
        with_unc = with_key("uncertainty_us")
        unc = np.zeros(len(ga), np.float64)
        if with_unc:
            unc[with_unc] = _floats([ga[i]["uncertainty_us"] for i in with_unc], "uncertainty_us")
            known = np.zeros(len(ga), np.int64)
            known[with_unc] = with_unc
            unc = unc[np.maximum.accumulate(known)]
            unc[: with_unc[0]] = 0.0
        s.uncertainty_ns[rows] = _to_ns(unc)
        gtid = _ints_of(gpu, "tid", "a gpu slice's tid")
        s.queue[rows] = ((gtid % OVERLAP_TID_STEP) - 1).astype(np.int32)
        if s.queue.max() >= len(queues) or s.queue.min() < -1:
            raise _Malformed("a gpu slice is on a stream track that the header does not list")
        for i in [i for i in with_key("flags") if ga[i].get("flags")]:
            s.flags[rows[i]] = flags_from_names(ga[i]["flags"])
        folded = with_key("pass")  # a scope's one pass, as its slice
        fold_rows, fold_labels = rows[folded], [str(ga[i]["pass"]) for i in folded]

    p_rows = np.zeros(0, np.int64)
    p_label = np.zeros(0, np.int32)
    p_sub = np.zeros(0, np.int64)
    p_g0 = p_g1 = np.zeros(0, np.int64)
    if passes:
        pa = _col(passes, "args")
        p_rows = _ints_of(pa, "scope", "a gpu pass's scope")
        if p_rows.min() < 0 or p_rows.max() >= n:
            raise _Malformed("a gpu pass names a scope that the trace does not have")
        p_label = np.fromiter((intern_label(str(x)) for x in _col(passes, "name")), np.int32, len(passes))
        p_g0 = base + _to_ns(_floats_of(passes, "ts", "a gpu pass's ts"))
        p_dur = _floats_of(passes, "dur", "a gpu pass's dur", non_negative=True)
        p_g1 = p_g0 + _to_ns(p_dur)
        p_sub = np.full(len(passes), NO_TIME, np.int64)
        with_sub = [i for i, a in enumerate(pa) if "submit_ts" in a]
        if with_sub:
            sub_us = _floats([pa[i]["submit_ts"] for i in with_sub], "submit_ts")
            p_sub[with_sub] = base + _to_ns(sub_us)
    fold_ids = np.array([intern_label(x) for x in fold_labels], np.int32)
    passes = with_folded(s, (p_rows, p_label, p_g0, p_g1, p_sub), fold_rows, fold_ids)
    # A streamed file holds scopes in the order they ended, chunk by chunk: put them in start order.
    if (np.diff(s.cpu_start_ns) > 0).all():
        order = np.arange(n)  # starts only increase: already in start order
    else:
        order = np.lexsort((-s.cpu_end_ns, s.thread, s.cpu_start_ns))
    ops = _ops(
        op_events, base, n, threads, len(queues), lambda x: name_ids[x] if x in name_ids else intern_label(x)
    )
    row_of = None  # the file's scope numbers -> the trace's rows, where they differ
    if n and (order != np.arange(n)).any():
        new_row = row_of = np.empty(n, np.int64)
        new_row[order] = np.arange(n)
        ops.scope = np.where(ops.scope >= 0, new_row[np.maximum(ops.scope, 0)], -1)
        s, moved = _reorder(s, order, passes[0])
        passes = (moved, *passes[1:])
    if not no_nesting(s):
        nest(s)
    spans = span_table(s, passes, bool(header.get("spans_cover_children")), lambda: intern_label(""))
    # a merged trace (gputrace merge) keeps each process's threads under its own pid
    procs = header.get("processes")
    pids = {pid} | ({int(p["pid"]) for p in procs} if isinstance(procs, list) else set())
    marks = [
        Mark(str(e["name"]), _ns(float(e["ts"]), base), thread_idx[int(e["tid"])], str(e["cat"]),
             dict(e.get("args") or {}))
        for e in instants
        if e.get("cat") in ("mark", "sync") and e.get("pid") in pids
    ]  # fmt: skip
    marks.sort(key=lambda m: (m.ts_ns, m.thread, m.name))
    names = canonical_names(names, s, spans, ops)
    fits = {int(c["device"]): ClockFit.from_dict(c) for c in header.get("clock", [])}
    trace = Trace(header, names, threads, queues, s, spans, marks, fits, ops)
    an = header.get("anomalies")
    if isinstance(an, dict) and (an.get("truncated") or header.get("truncated")):
        from gputrace.resolver import anomaly_report  # the file keeps a few examples; rebuild them

        header["anomalies"] = anomaly_report(trace)
    return trace


def _ops(
    events: list[dict[str, Any]] | tuple[Any, ...], base: int, n_scopes: int, threads: list[ThreadInfo],
    n_queues: int, intern: Callable[[str], int],
) -> OpTable:  # fmt: skip
    """The per-operation records (kernel/memcpy/memset events gputrace wrote), in their order."""
    n = len(events)
    ops = OpTable.empty(n)
    if not n:
        return ops
    events = _gpu_start_order(events)
    a = _col(events, "args")
    ops.scope = _ints_of(a, "scope", "an operation's scope")
    if ops.scope.max() >= n_scopes or ops.scope.min() < -1:
        raise _Malformed("an operation names a scope that the trace does not have")
    ops.kind = np.fromiter(map(_OP_KIND.__getitem__, _col(events, "cat")), np.int32, n)
    ops.name = _interned(_col(events, "name"), intern)
    ops.queue = _ints_of(a, "queue", "an operation's queue").astype(np.int32)
    if ops.queue.max() >= n_queues or ops.queue.min() < 0:
        raise _Malformed("an operation is on a stream that the header does not list")
    by_tid = {t.tid: i for i, t in enumerate(threads)}
    # an absent tid reads as None, which no thread has (ThreadInfo.tid is an int)
    tid_of = _get_col(a, "tid", None)
    ops.thread = np.fromiter(map(by_tid.get, tid_of, repeat(-1)), np.int32, n)  # type: ignore[arg-type]
    ops.correlation = _ints_of(a, "correlation", "an operation's correlation")
    ops.gpu_start_ns = base + _to_ns(_floats_of(events, "ts", "an operation's ts"))
    ops.gpu_end_ns = ops.gpu_start_ns + _to_ns(
        _floats_of(events, "dur", "an operation's dur", non_negative=True)
    )
    seen = _with_key(a, "call_ts")
    if len(seen):
        sa = a if len(seen) == n else _pick(a, seen)
        c0 = base + _to_ns(_floats_of(sa, "call_ts", "call_ts"))
        ops.call_start_ns[seen] = c0
        ops.call_end_ns[seen] = c0 + _to_ns(_floats_of(sa, "call_dur_us", "call_dur_us"))
    if _is_struct(a[0]):  # typed, with their defaults where absent (gputrace.exporters._json_structs)
        ops.call_name = _interned(list(map(attrgetter("call"), a)), intern)
        for col in ("bytes", "graph_id", "graph_node_id"):
            setattr(ops, col, np.fromiter(map(attrgetter(col), a), np.int64, n))
        for col in ("grid", "block"):  # three integers each
            triples = map(attrgetter(col), a)
            setattr(ops, col, np.fromiter(chain.from_iterable(triples), np.int64, 3 * n).reshape(n, 3))
        return ops
    ops.call_name = _interned(_get_col(a, "call", ""), intern)
    ops.bytes = _ints(_get_col(a, "bytes", 0), "an operation's bytes")
    for col in ("grid", "block"):
        vals = _get_col(a, col, [0, 0, 0])
        arr = _array(vals, np.int64)
        if arr.shape == (n, 3) and arr.dtype.kind in "iu":
            setattr(ops, col, arr.astype(np.int64))
            continue
        if any(not isinstance(v, list) or len(v) != 3 for v in vals):
            raise _Malformed(f"an operation's {col} is not three integers")
        setattr(ops, col, _ints([i for v in vals for i in v], f"an operation's {col}").reshape(n, 3))
    ops.graph_id = _ints(_get_col(a, "graph id", 0), "an operation's graph id")
    ops.graph_node_id = _ints(_get_col(a, "graph node id", 0), "an operation's graph node id")
    return ops


_OP_KIND = {c: i for i, c in enumerate(OP_CATS)}
_NO_ARGS: dict[str, Any] = {}


def _gpu_args(
    gpu: list[Any] | tuple[Any, ...], a_rows: list[int] | None = None
) -> tuple[list[Any], Callable[[str], list[int]]]:
    """Each GPU slice's args (an empty dict where it has none), and a function giving the rows
    whose args hold a key. Args are rare on a GPU slice except in CUPTI traces. ``a_rows``: the
    rows with args, where they are known."""
    ga: list[Any] = [_NO_ARGS] * len(gpu)
    if a_rows is None:
        a_rows = _with_key(gpu, "args").tolist()
    values = _col([gpu[i] for i in a_rows], "args")
    if values and _is_struct(values[0]):
        # args holding none of the keys read (a CUPTI slice's timing source) count as none
        kept = [(i, v) for i, v in zip(a_rows, values, strict=True) if v != _S.NO_GPU_ARGS]
        for i, v in kept:
            ga[i] = v
        rows = [i for i, _ in kept]
        unset = _S.UNSET
        return ga, lambda key: [i for i in rows if getattr(ga[i], _S.ATTR.get(key, key)) is not unset]
    for i, v in zip(a_rows, values, strict=True):
        ga[i] = v or _NO_ARGS
    a_rows = [i for i in a_rows if ga[i] is not _NO_ARGS]
    return ga, lambda key: [i for i in a_rows if key in ga[i]]


def _with_key(events: list[Any] | tuple[Any, ...], key: str) -> npt.NDArray[np.intp]:
    """Rows of the events that have ``key``."""
    if not events or not _is_struct(events[0]):
        has = map(dict.__contains__, events, repeat(key))
        return np.flatnonzero(np.fromiter(has, bool, len(events)))
    absent = _S.RAW_NONE if key in _S.RAW_FIELDS else _S.UNSET
    return np.array(_present(list(map(attrgetter(key.replace(" ", "_")), events)), absent), np.intp)


def _gpu_start_order(events: list[Any] | tuple[Any, ...]) -> list[Any] | tuple[Any, ...]:
    """The operation events by (ts, op number), stably: the order the writer keeps."""
    if _is_struct(events[0]):  # typed: numbers (an absent ts fails here: the plain path)
        ts = np.fromiter(map(attrgetter("ts"), events), np.float64, len(events))
        op = np.fromiter(map(attrgetter("args.op"), events), np.int64, len(events))
    else:
        ts = _array(_col(events, "ts"), np.float64)
        op = _array(_col(_col(events, "args"), "op"), np.int64)
    if ts.ndim == 1 and op.ndim == 1 and ts.dtype.kind in "iuf" and op.dtype.kind in "iu":
        step = np.diff(ts)
        if ((step > 0) | ((step == 0) & (np.diff(op) >= 0))).all():
            return events  # written in order (the usual case)
        order = np.lexsort((op, ts))
        if (order[1:] > order[:-1]).all():
            return events  # written in order (the usual case)
        return _pick(events, order)
    return sorted(events, key=lambda e: (e["ts"], int(e["args"]["op"])))  # odd values: as Python orders them


def _interned(values: list[Any], intern: Callable[[str], int]) -> npt.NDArray[np.int32]:
    """Name ids for ``values`` (each as ``str``), interning each distinct value once."""
    first_met: defaultdict[str, int] = defaultdict(count().__next__)  # numbered as first met
    local = np.fromiter(map(first_met.__getitem__, map(str, values)), np.int32, len(values))
    return np.array([intern(k) for k in first_met], np.int32)[local] if len(local) else local


def _reorder(
    s: ScopeTable, order: npt.NDArray[np.int64], span_rows: npt.NDArray[np.int64]
) -> tuple[ScopeTable, Any]:
    new_row = np.empty(len(order), np.int64)
    new_row[order] = np.arange(len(order))
    cols = {c: getattr(s, c)[order] for c in ScopeTable.COLUMNS}
    out = ScopeTable(**cols, args={int(new_row[k]): v for k, v in s.args.items()})
    out.args = dict(sorted(out.args.items()))
    return out, new_row[span_rows]


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
