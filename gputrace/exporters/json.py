"""Chrome/Perfetto JSON (``.json``, ``.json.gz``): writer, streaming writer and reader.

Any prefix of the file that ends at a chunk boundary can be read back: ``PREFIX`` and the start
header, one line of events per chunk, then ``CLOSE`` and the final header (docs/output.md, "Crashes:
a file cut short still loads"). Only keys Perfetto's JSON tokenizer knows come before the events:
it stops at the first top-level key it does not know. The events are rendered from each chunk's
``plan`` a column at a time (``_text.Rows``): text or a dict per event costs far more than the
numbers in it.
"""

from __future__ import annotations

import copy
import gzip
import itertools
import os
import queue
import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from gputrace.exporters import opener
from gputrace.exporters._text import Rows
from gputrace.exporters.opener import Progress, TraceFileError
from gputrace.exporters.plan import Chunk, Events, Planner, Waits, capped_header, file_header
from gputrace.gcpause import gc_paused
from gputrace.jsonsafe import dumps
from gputrace.model import Trace

PREFIX = b'{"displayTimeUnit":"ms","metadata":{"gputrace_stream":'
EVENTS_OPEN = b'},"traceEvents":[\n'
CLOSE = b'\n],"gputrace":'
# ISA-L's level 1 packs trace events as small as its level 3 at four times the speed (128 MB of
# events: 68 vs 274 ms, 99.4 vs 99.6 B per scope); zlib (where ISA-L has no wheel) at 3.
ISAL_LEVEL, ZLIB_LEVEL = 1, 3
# A chunk of this many scopes and operations or more is compressed on a second thread while it
# is rendered (``StreamWriter._compressed_beside``). A smaller one is compressed here: a thread per
# chunk waits for the interpreter's lock to start: about 1 ms a chunk (a sync after each of
# 2,000 scopes, fake backend: 2.4-2.6 ms a sync with the thread, 1.4-1.5 ms without).
THREADED_ROWS = 4096
# The header written before the events where the whole one follows them: what a cut file needs.
START_KEYS = ("format_version", "version", "backend", "start_ns", "base_ns", "pid", "rank", "host",
              "processes")  # fmt: skip


class GzipStream:
    """One gzip member written in pieces: raw deflate (ISA-L's where installed: about 10x zlib's
    speed) and the gzip header and trailer. Each ``flush`` is a full flush, so a checkpoint taken
    there is a fresh compressor with the same CRC and length (ISA-L's cannot be copied)."""

    HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, OS unknown

    def __init__(self, crc: int = 0, size: int = 0) -> None:
        try:
            from isal import isal_zlib

            self._z: Any = isal_zlib.compressobj(ISAL_LEVEL, isal_zlib.DEFLATED, -15)
            # ISA-L's CRC-32 too: zlib's took a quarter of the gzip time (25 MB: 5.7 vs 0.9 ms)
            self._crc32: Callable[[Any, int], int] = isal_zlib.crc32
        except ImportError:
            self._z = zlib.compressobj(ZLIB_LEVEL, zlib.DEFLATED, -15)
            self._crc32 = zlib.crc32
        self.crc, self.size = crc, size

    def compress(self, data: Any) -> bytes:
        self.crc = self._crc32(data, self.crc)
        self.size += memoryview(data).nbytes
        return bytes(self._z.compress(data))

    def flush(self, final: bool = False) -> bytes:
        if final:
            return bytes(self._z.flush(zlib.Z_FINISH)) + struct.pack("<II", self.crc, self.size & 0xFFFFFFFF)
        return bytes(self._z.flush(zlib.Z_FULL_FLUSH))


# -- the events ------------------------------------------------------------------------------------
def _j(value: Any) -> str:
    return dumps(value).decode()


def render(chunk: Chunk) -> Iterator[Any]:
    """A chunk's events as pieces of JSON text (bytes or uint8 arrays), each rendered as it is taken."""
    quoted: dict[int, list[str]] = {}  # a table's entries JSON-quoted, once per chunk

    def table(t: list[Any]) -> list[str]:
        got = quoted.get(id(t))
        if got is None:
            got = quoted[id(t)] = [_j(x) for x in t] or ['""']
        return got

    if chunk.meta:
        yield (",".join(map(_j, chunk.meta)) + ",").encode()
    for ev in chunk.events:
        yield from _events(ev, table)
    for w in chunk.waits:
        yield from _waits(w)
    for c in chunk.counters:
        r = Rows(len(c.ts)).lit('{"ph":"C","name":').pick([_j(x) for x in c.labels], c.label)
        r.lit(',"pid":').num(c.pid).lit(',"ts":').us(c.ts).lit(',"args":{' + _j(c.key) + ":").num(c.value)
        yield from r.lit("}}").blocks()


def _events(ev: Events, table: Any) -> Iterator[Any]:
    r = Rows(len(ev.ts))
    r.lit('{"ph":"X","cat":' if ev.dur is not None else '{"ph":"i","s":"t","cat":')
    r.pick([_j(c) for c in ev.cats], ev.cat).lit(',"name":').pick(table(ev.names), ev.name)
    r.lit(',"pid":').num(ev.pid).lit(',"tid":').num(ev.tid).lit(',"ts":').us(ev.ts)
    if ev.dur is not None:
        r.lit(',"dur":').us(ev.dur)
    if ev.flow is not None:
        way = ',"flow_out":true' if ev.flow_out else ',"flow_in":true'
        r.lit(',"bind_id":', ev.flow_has).num(ev.flow, ev.flow_has).lit(way, ev.flow_has)
    items = [
        (_j(a.key) + ":", a.kind, (table(a.value[0]), a.value[1]) if a.kind == "pick" else a.value, a.has)
        for a in ev.args
    ]
    r.members(',"args":{', items)  # (nothing where a batch has no args)
    if ev.objs is not None:
        objs, idx = ev.objs
        r.pick([""] + [',"args":' + _j(o) for o in objs[1:]], idx)
    return r.lit("}").blocks()


def _waits(w: Waits) -> Iterator[Any]:
    # Only the begin is named, and neither end has a category: how Perfetto pairs an async
    # slice's ends (docs/output.md quotes its source). Each wait's begin and end come in a row.
    n = len(w.id)
    heads = [f'{{"ph":"b","name":{_j(x)}' for x in w.labels] + ['{"ph":"e"']
    two = np.repeat(np.arange(n), 2)
    head = np.stack([w.label, np.full(n, len(heads) - 1)], axis=1).ravel()
    t = np.stack([w.start, w.end], axis=1).ravel()
    r = Rows(2 * n).pick(heads, head).lit(',"id2":{"local":').num(w.id[two])
    return r.lit('},"pid":').num(w.pid[two]).lit(',"ts":').us(t).lit("}").blocks()


# -- undoing an append that failed -----------------------------------------------------------------
# Each chunk builds on its writer's state (names and tracks announced, lanes open, the compressor's
# history), so the streamer takes a ``checkpoint`` before each append and, when one fails part-way
# (a full disk, a fault while encoding), ``rollback`` cuts the files and the state back.
_ATOMIC = (int, float, str, bytes, bool, type(None), tuple, frozenset)  # never changed in place: shared


def state_copy(x: Any) -> Any:
    """A copy of a writer's state deep enough that nothing the writer mutates is shared, and no
    deeper (a ``copy.deepcopy`` of a ``.pftrace`` writer's tables took 20-120 ms a chunk; this
    takes a few). A container met twice is copied twice: a writer reaches what it mutates one way.

    >>> state = {"named": {(1, 0)}, "rows": 3, "open": [[(0, 5)]]}
    >>> copied = state_copy(state)
    >>> state["named"].add((1, 2)); state["open"][0].append((6, 7))
    >>> copied
    {'named': {(1, 0)}, 'rows': 3, 'open': [[(0, 5)]]}
    """
    if isinstance(x, _ATOMIC) or getattr(getattr(type(x), "__dataclass_params__", None), "frozen", False):
        return x
    if isinstance(x, dict):
        out = copy.copy(x)  # keeps the type (a defaultdict keeps its factory)
        out.update({k: state_copy(v) for k, v in x.items() if not isinstance(v, _ATOMIC)})
        return out
    if isinstance(x, (list, set)):
        return type(x)(v if isinstance(v, _ATOMIC) else state_copy(v) for v in x)
    if hasattr(x, "__dict__") and not isinstance(x, type):  # (a class is shared, as deepcopy shares it)
        out = copy.copy(x)
        out.__dict__.update({k: state_copy(v) for k, v in vars(x).items()})
        return out
    return copy.deepcopy(x)  # (a numpy array, a slotted object)


Checkpoint = tuple[list[int], dict[str, Any]]  # the files' lengths and the writer's state, before an append


class StreamWriter:
    """Append chunks to a trace file as a session runs; ``close`` writes the final header. Each
    ``append`` is one ``writev`` (after a full flush for gzip): the chunk survives a kill."""

    STATE: tuple[str, ...] = ("_enc", "_z")  # what an append changes besides the files (``_fds``)

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        *,
        gzip: bool | None = None,
        start_header: dict[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        gz = self.path.name.endswith(".gz") if gzip is None else gzip
        self._z = GzipStream() if gz else None
        self._head = GzipStream.HEADER if gz else b""  # written before the first compressed bytes
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._fds = [self._fd]
        self._enc = Planner(header)
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
        """Scopes written so far (what ``gputrace run`` reports: the session reads it by name)."""
        return self._enc.rows

    def append(self, chunk: Trace) -> None:
        parts = render(self._enc.chunk(chunk))  # (planned at once, rendered piece by piece)
        first = next(parts, None)
        if first is not None:
            threaded = len(chunk) + len(chunk.ops) >= THREADED_ROWS
            self._write(itertools.chain([first], parts, [b"\n"]), threaded=threaded)

    def checkpoint(self) -> Checkpoint:
        """What ``rollback`` needs: the length of each file and a copy of the attributes ``STATE``."""
        state = {
            k: GzipStream(v.crc, v.size) if isinstance(v := getattr(self, k), GzipStream) else state_copy(v)
            for k in self.STATE
        }
        return [os.lseek(fd, 0, os.SEEK_CUR) for fd in self._fds], state

    def rollback(self, cp: Checkpoint) -> None:
        """The files and the writer's state as they were at ``cp``. Raises OSError if a file
        cannot be cut (then the writer must not append again)."""
        for fd, offset in zip(self._fds, cp[0], strict=True):
            os.ftruncate(fd, offset)
            os.lseek(fd, offset, os.SEEK_SET)
        for name, v in cp[1].items():
            setattr(self, name, v)

    def _write(self, data: bytes | Iterable[Any], final: bool = False, threaded: bool = False) -> None:
        """Bytes, or a chunk in pieces, compressed piece by piece and written by one ``writev`` (no copy)."""
        parts = [data] if isinstance(data, bytes) else data
        if self._z is None:
            write_all(self._fd, list(parts))
            return
        z = self._z
        out = self._compressed_beside(z, parts) if threaded else None
        if out is None:
            out = [*map(z.compress, parts)]
        write_all(self._fd, [self._head, *out, z.flush(final)])
        self._head = b""

    def _compressed_beside(self, z: GzipStream, parts: Iterable[Any]) -> list[bytes] | None:
        """``parts`` compressed in order on a daemon thread, each while the next is rendered (tiny20k's
        stop on the H200 spent 29 of 193 ms compressing after rendering); None, with nothing taken
        from ``parts``, where none can start (the interpreter is ending). Returns once every piece
        is done, also when rendering one fails (the caller then rolls the compressor back)."""
        done: list[bytes] = []
        failed: list[BaseException] = []
        todo: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def work() -> None:
            try:
                while (p := todo.get()) is not None:
                    done.append(z.compress(p))
            except BaseException as exc:  # raised by the chunk's append, below
                failed.append(exc)

        worker = threading.Thread(target=work, name="gputrace-gzip", daemon=True)
        try:
            worker.start()
        except RuntimeError:
            return None
        sent = 0
        try:
            for p in parts:
                todo.put(p)
                sent += 1
        finally:
            todo.put(None)
            worker.join()
        if failed:
            raise failed[0]
        if len(done) != sent:  # the thread ended early: the chunk is not all there
            raise RuntimeError(f"compressing a trace chunk stopped after {len(done)} of {sent} pieces")
        return done

    def close(self, header: dict[str, Any]) -> None:
        if self.closed:
            return
        self.closed = True
        enc = self._enc
        header = capped_header(header)
        header.setdefault("threads", [asdict(t) for t in enc.threads.values()])
        header.setdefault("queues", [asdict(q) for q in enc.queues])
        header["base_ns"] = enc.base
        if enc.ops_not_drawn:
            header["ops_not_drawn"] = enc.ops_not_drawn
        last = {"ph": "M", "name": "process_sort_index", "pid": enc.pid, "tid": 0, "args": {"sort_index": 0}}
        tail = dumps(last) + CLOSE + dumps(header)
        if enc.op_rows:  # per-operation events written: the file names its rank for HTA
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


def write_all(fd: int, parts: list[Any]) -> None:
    """Bytes-like ``parts`` written to ``fd`` with as few ``writev`` calls as they need."""
    bufs = [m for m in (memoryview(p).cast("B") for p in parts) if m.nbytes]
    if not hasattr(os, "writev"):
        bufs = [memoryview(b"".join(bufs))]
    i = 0
    while i < len(bufs):
        n = os.writev(fd, bufs[i : i + 512]) if len(bufs) - i > 1 else os.write(fd, bufs[i])
        while i < len(bufs) and n >= len(bufs[i]):
            n -= len(bufs[i])
            i += 1
        if n:  # (part of bufs[i] written)
            bufs[i] = bufs[i][n:]


@contextmanager
def replacing(path: str | os.PathLike[str]) -> Iterator[Path]:
    """The name to write ``path`` under (``<name>.partial``), renamed onto it when the block ends,
    removed when it fails: a crash never leaves a truncated trace under the real name."""
    p = Path(path)
    tmp = p.with_name(p.name + ".partial")
    try:
        yield tmp
        tmp.replace(p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write the whole ``trace`` (gzip when the name ends in ``.gz``); atomic (``replacing``)."""
    p = Path(path)
    header = file_header(trace)
    with replacing(p) as tmp:
        # the whole header follows the events; the one before them is what a cut file needs
        start = {k: header[k] for k in START_KEYS if k in header}
        w = StreamWriter(tmp, header, gzip=p.name.endswith(".gz"), start_header=start)
        try:
            w.append(trace)
            w.close(header)
        except BaseException:
            w.abandon()
            raise
    return p


# -- reading ---------------------------------------------------------------------------------------
def repair(raw: bytes) -> bytes | None:
    """A streamed file cut short, closed after its last complete chunk, with its start header
    (marked ``"truncated": true``) as the final one; None if it is not such a file."""
    if not raw.startswith(PREFIX) or (start := raw.find(EVENTS_OPEN)) < 0:
        return None
    try:
        header = orjson.loads(raw[len(PREFIX) : start])
    except orjson.JSONDecodeError:
        return None
    header["truncated"] = True
    tail = CLOSE + dumps(header) + b"}\n"
    body_start = start + len(EVENTS_OPEN)
    end = raw.rfind(b",\n", body_start - 1)
    return raw[: max(end, body_start)] + tail


def servable(path: str | os.PathLike[str]) -> bytes:
    """The file's bytes for a viewer (read through the opener): as they are, or, for a streamed
    file cut short (a killed program, or one still running), closed after its last chunk."""
    data = opener.read_file(path)
    raw, cut = opener.inflate(data, Path(path))
    if not cut and (not raw.startswith(PREFIX) or raw.rfind(CLOSE, max(0, len(raw) - (1 << 20))) >= 0):
        return data  # not streamed by gputrace, or closed: the final header follows the events
    fixed = repair(raw)
    if fixed is None:
        return data
    return gzip.compress(fixed, compresslevel=1) if data[:2] == b"\x1f\x8b" else fixed


def read_document(path: str | os.PathLike[str], progress: Progress | None = None) -> tuple[Any, bool]:
    """The parsed JSON of a gputrace or Chrome trace file, and whether it was cut short (then
    closed after its last complete chunk); a real ``.pftrace`` is refused, naming the file to read."""
    raw, cut = opener.read_trace(path)
    if not raw or raw.isspace():  # (no copy of the file, as strip() would make)
        raise TraceFileError(f"{path}: the file is empty.")
    if progress is not None:
        progress("read")
    try:
        with gc_paused():  # a dict per event, none in a cycle (see gc_paused)
            doc, repaired = orjson.loads(raw), False
    except orjson.JSONDecodeError as exc:
        fixed = repair(raw)
        try:
            if fixed is None:
                raise
            with gc_paused():
                doc, repaired = orjson.loads(fixed), True
        except orjson.JSONDecodeError:
            json_file = opener.canonical(path)
            if json_file != Path(path) and bytes(raw[:64]).lstrip()[:1] not in (b"{", b"["):
                raise TraceFileError(
                    f"{path}: a .pftrace file is an export for Perfetto, which gputrace does not read "
                    f"back; use the .json.gz it was written from ({json_file.name} for a session's)."
                ) from None
            if cut:
                raise TraceFileError(f"{path}: the gzip data is truncated or corrupt.") from None
            detail = str(exc.args[0] if exc.args else exc)
            what = "truncated JSON" if "unexpected end" in detail.lower() else "not valid JSON"
            raise TraceFileError(f"{path}: {what} ({detail}).") from None
    if cut and not (isinstance(doc, dict) and "gputrace_stream" in (doc.get("metadata") or {})):
        # only a streamed gputrace file is meant to be readable when cut short
        raise TraceFileError(f"{path}: the gzip data is truncated or corrupt.")
    if progress is not None:
        progress("parsed")
    return doc, cut or repaired
