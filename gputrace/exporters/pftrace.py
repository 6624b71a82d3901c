"""Perfetto's protobuf (``.pftrace``): an export, written from the JSON file's events.

The events are the ones ``chrome`` writes to the canonical JSON file (the same plan: the same
processes, tracks, lanes, flows and args), turned into ``TrackEvent`` packets:
- a process track per process; a thread track per Python thread; the GPU's stream, overflow,
  operations, queued and queue-depth tracks as named tracks of its process, with names a person
  reads that begin with the stream's ("stream 7", "stream 7 · operations", "stream 7 · queued"):
  Perfetto orders a process's tracks by name, so each stream's tracks sit together;
- each X event a begin/end pair on its track, its args as debug annotations, its flow v2
  (``bind_id``) as ``flow_ids``/``terminating_flow_ids``; each wait (``b``/``e``) a slice on a
  "<stream> · queued" track (extra lanes of it where waits overlap: a heap, so n log n); each
  counter sample (``C``) on a counter track; instants on their track;
- names, categories and argument names interned once per file.

gputrace does not read ``.pftrace`` back: the ``.json.gz`` is the file it reads, and
``gputrace convert`` turns one into the other. A session asked for ``x.pftrace`` streams
``x.json.gz`` as it runs (a killed program leaves that file, loadable) and exports ``x.pftrace``
from it at stop.
"""

from __future__ import annotations

import heapq
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gputrace.exporters.opener import TraceFileError
from gputrace.exporters.plan import GPU_PID_BASE, OP_TID_BASE, OVERLAP_TID_STEP
from gputrace.model import Trace

EXTENSIONS = (".pftrace", ".perfetto-trace")
SEQ = 1  # the one packet sequence written
BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4  # TrackEvent.Type
_DOUBLE = struct.Struct("<d")


def canonical_path(path: str | os.PathLike[str]) -> Path:
    """The ``.json.gz`` a session streams beside ``x.pftrace`` (the file gputrace reads)."""
    p = Path(path)
    stem = next((p.name[: -len(e)] for e in EXTENSIONS if p.name.lower().endswith(e)), p.name)
    return p.with_name(stem + ".json.gz")


def read(path: str | os.PathLike[str], progress: Any = None) -> Trace:
    raise TraceFileError(
        f"{path}: a .pftrace file is an export for Perfetto, which gputrace does not read back; "
        f"use the .json.gz it was written from ({canonical_path(path).name} for a session's)."
    )


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as ``.pftrace`` (atomic: temp file + rename)."""
    from gputrace.exporters.chrome import to_events

    events, _ = to_events(trace)
    return write_events(events, path)


def write_events(events: list[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write Chrome trace events as written by gputrace (``chrome``) as a ``.pftrace`` file."""
    p = Path(path)
    tmp = p.with_name(p.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            for chunk in _Packets(events).encode():
                f.write(chunk)
        tmp.replace(p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return p


class StreamWriter:
    """A session's ``.pftrace``: the canonical ``.json.gz`` streamed beside it, exported at close."""

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        from gputrace.exporters import json as json_format

        self.path = Path(path)
        self.canonical = canonical_path(path)
        self._json = json_format.StreamWriter(self.canonical, header)

    @property
    def rows(self) -> int:
        return self._json.rows

    @property
    def closed(self) -> bool:
        return bool(self._json.closed)

    def append(self, chunk: Trace) -> None:
        self._json.append(chunk)

    def checkpoint(self) -> Any:
        """The canonical file's checkpoint: a failed append is undone there (see ``_undo``)."""
        return self._json.checkpoint()

    def rollback(self, cp: Any) -> None:
        self._json.rollback(cp)

    def close(self, header: dict[str, Any]) -> None:
        from gputrace.exporters import read_document

        if self._json.closed:
            return
        self._json.close(header)
        write_events(read_document(self.canonical)["traceEvents"], self.path)

    def abandon(self) -> None:
        self._json.abandon()


# -- protobuf --------------------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    if 0 <= n < _SMALL_N:
        return _SMALL[n]
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_N = 1 << 14  # varints of small values (tags, lengths, ids), made once
_SMALL = [bytes((n,)) if n < 0x80 else bytes(((n & 0x7F) | 0x80, n >> 7)) for n in range(_SMALL_N)]


def _key(field: int, wire: int) -> bytes:
    return _SMALL[field << 3 | wire]


def _int(field: int, n: int) -> bytes:
    return _SMALL[field << 3] + _varint(n)


def _len(field: int, payload: bytes) -> bytes:
    return _SMALL[field << 3 | 2] + _varint(len(payload)) + payload


def _str(field: int, text: str) -> bytes:
    return _len(field, text.encode("utf-8", "surrogatepass"))


def _fixed64(field: int, n: int) -> bytes:
    return _key(field, 1) + struct.pack("<Q", n & ((1 << 64) - 1))


def _packet(body: bytes) -> bytes:
    return _len(1, body + _int(10, SEQ))  # Trace.packet; trusted_packet_sequence_id


def _annotation(value: Any, name: bytes) -> bytes:
    """A DebugAnnotation: ``name`` (encoded name field, or b"") and the value."""
    if isinstance(value, bool):
        return name + _int(2, int(value))
    if isinstance(value, int) and -(1 << 63) <= value < 1 << 63:
        return name + _int(4, value)
    if isinstance(value, float):
        return name + _key(5, 1) + _DOUBLE.pack(value)
    if isinstance(value, str):
        return name + _str(6, value)
    if isinstance(value, (list, dict)) and not value:  # (an empty one has no value field of its own)
        return name + _str(9, "[]" if isinstance(value, list) else "{}")
    if isinstance(value, list):
        return name + b"".join(_len(12, _annotation(v, b"")) for v in value)
    if isinstance(value, dict):
        return name + b"".join(_len(11, _annotation(v, _str(10, str(k)))) for k, v in value.items())
    return name + _str(6, "null" if value is None else str(value))


class _Packets:
    """The packets of one file from its events (see the module's docstring)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.tracks: dict[Any, bytes] = {}  # key -> TrackDescriptor packet
        self.uuids: dict[Any, int] = {}
        self.interned: dict[tuple[int, str], int] = {}  # (InternedData field, text) -> iid
        self.new: dict[int, list[bytes]] = {}

    # -- tracks
    def _uuid(self, key: Any) -> int:
        u = self.uuids.get(key)
        if u is None:
            u = self.uuids[key] = len(self.uuids) + 1
        return u

    def _process(self, pid: int, name: str | None = None) -> int:
        u = self._uuid(("p", pid))
        if ("p", pid) not in self.tracks or name is not None:
            desc = _int(1, pid) + (_str(6, name) if name else b"")
            self.tracks[("p", pid)] = _len(60, _int(1, u) + _len(3, desc))
        return u

    def _thread(self, pid: int, tid: int, name: str | None = None) -> int:
        """A Python thread's track; on a GPU, a named track of its process (tids there are
        gputrace's numbering, not a thread's: they are left out of what a person reads)."""
        key = ("t", pid, tid)
        u = self._uuid(key)
        if key in self.tracks and name is None:
            return u
        parent = self._process(pid)
        if pid < GPU_PID_BASE:
            body = _len(4, _int(1, pid) + _int(2, tid) + (_str(5, name) if name else b""))
            self.tracks[key] = _len(60, _int(1, u) + _int(5, parent) + body)
        else:
            base = tid % OVERLAP_TID_STEP
            q = base - OP_TID_BASE if base >= OP_TID_BASE else base - 1
            self._named(
                key, parent, name or (f"queue {q}" + (" · operations" if base >= OP_TID_BASE else ""))
            )
        return u

    def _named(self, key: Any, parent: int, name: str) -> int:
        """A named child track of a (GPU) process."""
        u = self._uuid(key)
        self.tracks[key] = _len(60, _int(1, u) + _int(5, parent) + _str(2, name))
        return u

    # -- interning
    def _iid(self, field: int, text: str) -> int:
        i = self.interned.get((field, text))
        if i is None:
            i = self.interned[(field, text)] = len(self.interned) + 1
            self.new.setdefault(field, []).append(_len(field, _int(1, i) + _str(2, text)))
        return i

    # -- events
    def encode(self) -> Iterable[bytes]:
        recs = self._records()
        recs.sort(key=lambda r: r[0])  # stable: each track's own order kept at equal times
        first = _packet(_int(13, 1))  # SEQ_INCREMENTAL_STATE_CLEARED
        yield first + b"".join(_packet(t) for t in self.tracks.values())
        head: dict[tuple[int, int, Any, Any], bytes] = {}  # (type, track, name, cat) -> their fields
        arg_name: dict[str, bytes] = {}  # an annotation's interned name field
        tail = _int(13, 2) + _int(10, SEQ)  # SEQ_NEEDS_INCREMENTAL_STATE; the sequence
        out: list[bytes] = []
        for ts, track, typ, name, cat, args, flows_out, flows_in, value in recs:
            ev = head.get((typ, track, name, cat))
            if ev is None:
                ev = _int(9, typ) + _int(11, track)
                if name is not None:
                    ev += _int(10, self._iid(2, name))
                if cat:
                    ev += _int(3, self._iid(1, cat))
                head[(typ, track, name, cat)] = ev
            if args:
                parts = []
                for k, v in args.items():
                    nm = arg_name.get(k)
                    if nm is None:
                        nm = arg_name[k] = _int(1, self._iid(3, str(k)))
                    parts.append(_len(4, _annotation(v, nm)))
                ev += b"".join(parts)
            for f in flows_out:
                ev += _fixed64(47, f)
            for f in flows_in:
                ev += _fixed64(48, f)
            if value is not None:
                ev += _int(30, value) if isinstance(value, int) else _key(44, 1) + _DOUBLE.pack(float(value))
            body = _SMALL[8 << 3] + _varint(ts) + _SMALL[11 << 3 | 2] + _varint(len(ev)) + ev + tail
            if self.new:
                body += _len(12, b"".join(b"".join(v) for v in self.new.values()))
                self.new = {}
            out.append(_SMALL[1 << 3 | 2] + _varint(len(body)) + body)
            if len(out) >= 4096:
                yield b"".join(out)
                out = []
        yield b"".join(out)

    def _records(self) -> list[tuple[Any, ...]]:
        """(ts ns, track, type, name, cat, args, flows out, flows in, counter value) per packet,
        each track's in its own order (begins and ends nested)."""
        slices: dict[int, list[tuple[int, int, dict[str, Any]]]] = {}  # track -> (start, end, event)
        waits: dict[tuple[int, Any], dict[str, Any]] = {}
        wait_spans: dict[tuple[int, str], list[tuple[int, int, dict[str, Any]]]] = {}
        recs: list[tuple[Any, ...]] = []
        for e in self.events:
            ph = e.get("ph")
            pid = int(e.get("pid", 0))
            if ph == "X":
                t0 = round(e["ts"] * 1000)
                track = self._thread(pid, int(e.get("tid", 0)))
                slices.setdefault(track, []).append((t0, t0 + round(e["dur"] * 1000), e))
            elif ph == "b":
                waits[(pid, (e.get("id2") or {}).get("local", e.get("id")))] = e
            elif ph == "e":
                b = waits.pop((pid, (e.get("id2") or {}).get("local", e.get("id"))), None)
                if b is not None:
                    span = (round(b["ts"] * 1000), round(e["ts"] * 1000), b)
                    wait_spans.setdefault((pid, str(b.get("name", "queued"))), []).append(span)
            elif ph == "C":
                self._counter(e, pid, recs)
            elif ph == "i":
                track = self._thread(pid, int(e.get("tid", 0)))
                recs.append((round(e["ts"] * 1000), track, INSTANT, str(e.get("name", "")), e.get("cat"),
                             e.get("args"), (), (), None))  # fmt: skip
            elif ph == "M" and e.get("name") == "process_name":
                self._process(pid, str((e.get("args") or {}).get("name", "")))
            elif ph == "M" and e.get("name") == "thread_name":
                self._thread(pid, int(e.get("tid", 0)), str((e.get("args") or {}).get("name", "")))
        for track, spans in slices.items():
            recs += _nested(track, spans)
        for (pid, name), spans in wait_spans.items():
            # "queued · stream 7" (the JSON's name) -> "stream 7 · queued": beside its stream
            label = f"{name.removeprefix('queued · ')} · queued" if name.startswith("queued · ") else name
            for lane, group in enumerate(_lanes(spans)):
                track = self._named(
                    ("q", pid, name, lane), self._process(pid), label + (f" {lane + 1}" if lane else "")
                )
                recs += _nested(track, group, name=name)
        return recs

    def _counter(self, e: dict[str, Any], pid: int, recs: list[Any]) -> None:
        for k, v in (e.get("args") or {}).items():
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            name = f"{e.get('name', '')} {k}"
            key = ("c", pid, name)
            if key not in self.tracks:
                u = self._uuid(key)
                body = _int(1, u) + _int(5, self._process(pid)) + _str(2, name) + _len(8, b"")
                self.tracks[key] = _len(60, body)
            recs.append((round(e["ts"] * 1000), self.uuids[key], COUNTER, None, None, None, (), (), v))


def _nested(track: int, spans: list[tuple[int, int, dict[str, Any]]], name: str | None = None) -> list[Any]:
    """Begin and end records of one track's slices (nested or disjoint, as the plan lays them
    out), in the order a stack walk gives: an end before a begin at the same time."""
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[Any] = []
    stack: list[int] = []
    for t0, t1, e in spans:
        while stack and stack[-1] <= t0:
            out.append((stack.pop(), track, END, None, None, None, (), (), None))
        bind = e.get("bind_id")
        fo = (bind + 1,) if e.get("flow_out") and isinstance(bind, int) else ()
        fi = (bind + 1,) if e.get("flow_in") and isinstance(bind, int) else ()
        args = None if name is not None else e.get("args")
        out.append((t0, track, BEGIN, name or str(e.get("name", "")), e.get("cat"), args, fo, fi, None))
        stack.append(max(t1, t0))
    while stack:
        out.append((stack.pop(), track, END, None, None, None, (), (), None))
    return out


def _lanes(spans: list[tuple[int, int, dict[str, Any]]]) -> list[list[tuple[int, int, dict[str, Any]]]]:
    """Spans split into lanes of disjoint spans, the fewest lanes (a heap of lane ends)."""
    spans.sort(key=lambda s: (s[0], s[1]))
    free: list[tuple[int, int]] = []  # (end, lane)
    lanes: list[list[tuple[int, int, dict[str, Any]]]] = []
    for s in spans:
        if free and free[0][0] <= s[0]:
            _, lane = heapq.heappop(free)
        else:
            lane = len(lanes)
            lanes.append([])
        lanes[lane].append(s)
        heapq.heappush(free, (max(s[1], s[0]), lane))
    return lanes
