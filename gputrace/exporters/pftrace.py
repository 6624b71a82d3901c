"""Perfetto's protobuf (``.pftrace``): an export, rendered from the same ``plan`` as the JSON file.

The plan's batches become ``TrackEvent`` packets a column at a time (``_text.Rows``: varints of
whole columns, names interned once per file), never a Python object per event. GPU tracks are
named tracks of their process, named after their stream, so that Perfetto (which orders a
process's tracks by name) keeps each stream's tracks together; waits take lanes of a
"<stream> · queued" track (docs/output.md, "The .pftrace export"). gputrace does not read it back.
"""

from __future__ import annotations

import functools
import heapq
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from gputrace.exporters import json as json_format
from gputrace.exporters._text import Rows, varint_len
from gputrace.exporters.opener import canonical
from gputrace.exporters.plan import (
    GPU_PID_BASE,
    OP_TID_BASE,
    OVERLAP_TID_STEP,
    Arg,
    Chunk,
    Ints,
    Planner,
    file_header,
)
from gputrace.model import Trace

SEQ = 1  # the one packet sequence written
BEGIN, END, INSTANT, COUNTER = 1, 2, 3, 4  # TrackEvent.Type


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as ``.pftrace`` (atomic: ``json.replacing``)."""
    chunk = Planner(file_header(trace)).chunk(trace)
    with json_format.replacing(path) as tmp, open(tmp, "wb") as f:
        f.writelines(_Packets().encode(chunk))
    return Path(path)


class StreamWriter(json_format.StreamWriter):
    """A session's ``.pftrace``: the canonical ``.json.gz`` streamed beside it, and each chunk's
    packets appended to ``x.pftrace.partial`` (renamed at close); a checkpoint covers both. Each
    chunk is in time order (Perfetto sorts what it imports; a chunk's slices end in it)."""

    STATE = (*json_format.StreamWriter.STATE, "_packets")

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.target = Path(path)
        self.partial = self.target.with_name(self.target.name + ".partial")
        self._packets = _Packets()
        self._pf = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            super().__init__(canonical(path), header)
        except BaseException:
            os.close(self._pf)
            self.partial.unlink(missing_ok=True)
            raise
        self._fds.append(self._pf)

    def append(self, chunk: Trace) -> None:
        plan = self._enc.chunk(chunk)
        packets = list(self._packets.encode(plan))  # (both rendered before either file is written)
        self._write([*json_format.render(plan), b"\n"])
        json_format.write_all(self._pf, packets)

    def close(self, header: dict[str, Any]) -> None:
        if self.closed:
            return
        try:
            super().close(header)
        finally:
            os.close(self._pf)
        self.partial.replace(self.target)

    def abandon(self) -> None:
        if not self.closed:
            super().abandon()
            os.close(self._pf)
            self.partial.unlink(missing_ok=True)  # the .json.gz is what a cut session leaves


# -- protobuf --------------------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    if 0 <= n < _SMALL_N:
        return _SMALL[n]
    n &= (1 << 64) - 1  # a negative one as 64-bit two's complement
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


def _packet(body: bytes) -> bytes:
    return _len(1, body + _int(10, SEQ))  # Trace.packet; trusted_packet_sequence_id


def _annotation(value: Any, name: bytes) -> bytes:
    """A DebugAnnotation: ``name`` (encoded name field, or b"") and the value."""
    if isinstance(value, bool):
        return name + _int(2, int(value))
    if isinstance(value, int) and -(1 << 63) <= value < 1 << 63:
        return name + _int(4, value)
    if isinstance(value, float):
        return name + _key(5, 1) + struct.pack("<d", value)
    if isinstance(value, str):
        return name + _str(6, value)
    if isinstance(value, (list, dict)) and not value:  # (an empty one has no value field of its own)
        return name + _str(9, "[]" if isinstance(value, list) else "{}")
    if isinstance(value, list):
        return name + b"".join(_len(12, _annotation(v, b"")) for v in value)
    if isinstance(value, dict):
        return name + b"".join(_len(11, _annotation(v, _str(10, str(k)))) for k, v in value.items())
    return name + _str(6, "null" if value is None else str(value))


TAIL = _int(13, 2) + _int(10, SEQ)  # SEQ_NEEDS_INCREMENTAL_STATE; the sequence
FLOW_KEY = {True: _key(47, 1), False: _key(48, 1)}  # flow_ids, terminating_flow_ids (fixed64)
Slices = tuple[Ints, Ints, Ints, int]  # a batch of slices: track, start, end, first packet


class _Packets:
    """The packets of one file from its plan (see the module's docstring)."""

    def __init__(self) -> None:
        self.tracks: dict[Any, bytes] = {}  # key -> TrackDescriptor packet
        self.uuids: dict[Any, int] = {}
        self.interned: dict[tuple[int, str], int] = {}  # (InternedData field, text) -> iid
        self.new: list[bytes] = []  # interned entries not yet written
        self.described = 0  # tracks whose descriptor is written
        self.cleared = False  # the sequence's state cleared (by the first chunk's packets)
        self.lanes: dict[tuple[int, str], list[list[int]]] = {}  # waits' lanes: [their ends, tracks]
        self.names: dict[tuple[int, int], str] = {}  # (pid, tid) -> name; tid 0: the process's
        self.rows: list[tuple[Any, Ints]] = []  # (packets as bytes or uint8 arrays, bytes each)

    # -- tracks and names
    def _uuid(self, key: Any) -> int:
        return self.uuids.setdefault(key, len(self.uuids) + 1)

    def _process(self, pid: int) -> int:
        u = self._uuid(("p", pid))
        if ("p", pid) not in self.tracks:
            name = self.names.get((pid, 0))
            desc = _int(1, pid) + (_str(6, name) if name else b"")
            self.tracks[("p", pid)] = _len(60, _int(1, u) + _len(3, desc))
        return u

    def _thread(self, pid: int, tid: int) -> int:
        """A Python thread's track; on a GPU, a named track of its process (tids there are
        gputrace's numbering, not a thread's: they are left out of what a person reads)."""
        key = ("t", pid, tid)
        if key in self.tracks:
            return self.uuids[key]
        parent, u, name = self._process(pid), self._uuid(key), self.names.get((pid, tid))
        if pid < GPU_PID_BASE:
            body = _len(4, _int(1, pid) + _int(2, tid) + (_str(5, name) if name else b""))
            self.tracks[key] = _len(60, _int(1, u) + _int(5, parent) + body)
        else:
            base = tid % OVERLAP_TID_STEP
            q = base - OP_TID_BASE if base >= OP_TID_BASE else base - 1
            name = name or f"queue {q}" + (" · operations" if base >= OP_TID_BASE else "")
            self._named(key, parent, name)
        return u

    def _named(self, key: Any, parent: int, name: str, counter: bool = False) -> int:
        """A named child track of a (GPU) process."""
        u = self._uuid(key)
        body = _int(1, u) + _int(5, parent) + _str(2, name) + (_len(8, b"") if counter else b"")
        self.tracks[key] = _len(60, body)
        return u

    def _counter(self, names: list[str], pid: int, k: int) -> int:
        return self._named(("c", pid, names[k]), self._process(pid), names[k], True)

    @staticmethod
    def _per_pair(pid: Ints | int, x: Ints, make: Callable[[int, int], int]) -> Ints:
        """``make(pid, x)`` (a track's uuid, an interned id) once per distinct pair, as a column."""
        keys, inv = np.unique(np.asarray(pid, np.int64) << 32 | np.asarray(x, np.int64), return_inverse=True)
        made = [make(k >> 32, k & 0xFFFFFFFF) for k in keys.tolist()]
        out: Ints = np.array(made or [0], np.int64)[inv.reshape(-1)]
        return out

    def _iid(self, field: int, text: str) -> int:
        i = self.interned.get((field, text))
        if i is None:
            i = self.interned[(field, text)] = len(self.interned) + 1
            self.new.append(_len(field, _int(1, i) + _str(2, text)))
        return i

    def _iids(self, field: int, table: list[Any], idx: Ints) -> Ints:
        """The interned id of ``table[idx]`` per row (each distinct entry interned once)."""
        return self._per_pair(field, idx, lambda f, i: self._iid(f, str(table[i])))

    def _add(self, ts: Ints, te: Rows) -> int:
        """Packets of the TrackEvents ``te`` at ``ts``; returns the number of the first."""
        n = len(ts)
        te_len = te.lengths()
        body = Rows(n, b"").lit(b"\x40").var(ts).lit(b"\x5a").var(te_len).extend(te).lit(TAIL)
        # sizes summed here: ``lengths`` of the outer rows would count the inner ones again
        body_len = 2 + varint_len(ts) + varint_len(te_len) + te_len + len(TAIL)
        packet = Rows(n, b"").lit(b"\x0a").var(body_len).extend(body)
        first = sum(len(lens) for _b, lens in self.rows)
        self.rows.append((list(packet.blocks()), 1 + varint_len(body_len) + body_len))
        return first

    def _head(self, typ: int, n: int, uuid: Ints, name: Ints | None, cat: Ints | None) -> Rows:
        te = Rows(n, b"").lit(_int(9, typ)).lit(b"\x58").var(uuid)
        if name is not None:
            te.lit(b"\x50").var(name)
        if cat is not None:
            te.lit(b"\x18").var(cat)
        return te

    def _args(self, te: Rows, args: list[Arg], n: int) -> None:
        for a in args:
            has = np.ones(n, bool) if a.has is None else np.asarray(a.has, bool)
            if not has.any():
                continue
            sub = Rows(n, b"").lit(_int(1, self._iid(3, a.key)), has)
            if a.kind == "int":
                sub.lit(b"\x20", has).var(a.value, has)
            elif a.kind == "us":  # as JSON reads it back: whole µs an integer, else a double
                v = np.asarray(a.value, np.int64)
                whole = v % 1000 == 0
                sub.lit(b"\x20", has & whole).var(v // 1000, has & whole)
                sub.lit(b"\x29", has & ~whole).raw8(v / 1000.0, has & ~whole)
            else:
                table, idx = a.value
                used, inv = np.unique(np.where(has, idx, idx[has][0]), return_inverse=True)
                sub.pick([_annotation(table[i], b"") for i in used.tolist()], inv.reshape(-1), has)
            te.lit(b"\x22", has).var(sub.lengths(), has).extend(sub)

    # -- the file
    def encode(self, chunk: Chunk) -> Iterable[Any]:
        for m in chunk.meta:  # (a process's name event has tid 0)
            if m["name"] in ("process_name", "thread_name"):
                self.names[(int(m["pid"]), int(m["tid"]))] = str(m["args"]["name"])
        slices: list[Slices] = []
        points: list[tuple[Ints, int]] = []  # instants and counter samples: (ts, first packet)
        for ev in chunk.events:
            n = len(ev.ts)
            track = self._per_pair(ev.pid, ev.tid, self._thread)
            typ = BEGIN if ev.dur is not None else INSTANT
            te = self._head(typ, n, track, self._iids(2, ev.names, ev.name), self._iids(1, ev.cats, ev.cat))
            self._args(te, ev.args, n)
            if ev.objs is not None:
                objs, idx = ev.objs
                enc = [b""] + [
                    b"".join(_len(4, _annotation(v, _int(1, self._iid(3, str(k))))) for k, v in o.items())
                    for o in objs[1:]
                ]
                te.pick(enc, idx)
            if ev.flow is not None:
                te.lit(FLOW_KEY[ev.flow_out], ev.flow_has).raw8(ev.flow + 1, ev.flow_has)
            first = self._add(ev.ts, te)
            if ev.dur is None:
                points.append((ev.ts, first))
            else:
                slices.append((track, ev.ts, np.maximum(ev.ts + ev.dur, ev.ts), first))
        for w in chunk.waits:
            track = np.zeros(len(w.id), np.int64)
            group = w.pid << 32 | w.label
            for g in np.unique(group).tolist():
                at = np.flatnonzero(group == g)
                pid, name = g >> 32, w.labels[g & 0xFFFFFFFF]
                # "queued · stream 7" (the JSON's name) -> "stream 7 · queued": beside its stream
                label = f"{name.removeprefix('queued · ')} · queued" if name.startswith("queued · ") else name
                ends, uu = self.lanes.setdefault((pid, name), [[], []])
                lanes = _lanes(w.start[at], w.end[at], ends)  # (new lanes only are named, below)
                parent = self._process(pid)
                uu += [self._named(("q", pid, name, k), parent, label + (f" {k + 1}" if k else ""))
                       for k in range(len(uu), int(lanes.max()) + 1)]  # fmt: skip
                track[at] = np.array(uu, np.int64)[lanes]
            te = self._head(BEGIN, len(w.id), track, self._iids(2, w.labels, w.label), None)
            slices.append((track, w.start, np.maximum(w.end, w.start), self._add(w.start, te)))
        for c in chunk.counters:
            counter = functools.partial(self._counter, [f"{lb} {c.key}" for lb in c.labels])
            te = self._head(COUNTER, len(c.ts), self._per_pair(c.pid, c.label, counter), None, None)
            points.append((c.ts, self._add(c.ts, te.lit(_key(30, 0)).var(c.value))))
        # the first chunk clears the sequence's state; later ones add to it
        head = (b"" if self.cleared else _int(13, 1)) + _len(12, b"".join(self.new))
        tracks = list(self.tracks.values())[self.described :]
        self.new, self.described, self.cleared = [], len(self.tracks), True
        yield _packet(head) + b"".join(map(_packet, tracks))
        yield from self._ordered(slices, points)
        self.rows = []  # (nothing of this chunk is kept for the next)

    def _ordered(self, slices: list[Slices], points: list[tuple[Ints, int]]) -> Iterable[Any]:
        """Every packet, in time order; at one time, as a stack walk of each track gives them: the
        ends (inner first), the empty slices (begin, end), the begins (outer first), then instants
        and counter samples. A track's slices nest (the plan's lanes): each end closes its slice."""

        def cat(parts: list[Ints]) -> Ints:
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)

        track, st, en = (cat([x[k] for x in slices]) for k in range(3))  # type: ignore[misc]
        begin = cat([f + np.arange(len(t)) for _tr, t, _e, f in slices])
        i, zero = np.arange(len(st)), en == st
        ends = self._add(en, self._head(END, len(st), track, None, None))
        pts = cat([x[0] for x in points])
        ts = np.r_[st, en, pts]
        group = np.r_[np.where(zero, 1, 2), np.where(zero, 1, 0), np.full(len(pts), 3)]
        k1 = np.r_[np.where(zero, i, -en), np.where(zero, i, -st), np.zeros(len(pts), np.int64)]
        k2 = np.r_[i, np.where(zero, len(st) + i, -i), np.arange(len(pts))]
        rid = np.r_[begin, ends + i, cat([f + np.arange(len(t)) for t, f in points])]
        rid = rid[np.lexsort((k2, k1, group, ts))]
        bufs = [np.frombuffer(p, np.uint8) for got, _lens in self.rows for p in got]
        flat = np.concatenate(bufs or [np.zeros(0, np.uint8)])
        lens = cat([lens for _b, lens in self.rows])
        off = np.cumsum(lens) - lens
        for lo in range(0, len(rid), 1 << 13):  # (the index of a slab stays in cache)
            r = rid[lo : lo + (1 << 13)]
            ln, at = lens[r], off[r]
            # the bytes' positions in ``flat``: a running sum of steps of one, with a jump where
            # each packet starts (fewer passes over the index than a repeat plus an arange)
            out = np.cumsum(ln) - ln
            step = np.ones(int(out[-1] + ln[-1]), np.int64)
            step[out[1:]] = at[1:] - at[:-1] - ln[:-1] + 1
            step[0] = at[0]
            yield flat[np.cumsum(step)]


def _lanes(st: Ints, en: Ints, ends: list[int]) -> Ints:
    """Lanes of disjoint spans, the fewest, after those of earlier chunks (``ends``: each lane's
    last end, updated here): round robin where that is enough (waits of an in-order queue end in
    the order they start), else a heap of lane ends."""
    order = np.lexsort((en, st))
    s, e = st[order], np.maximum(en, st)[order]
    n = len(s)
    depth = max(int((np.arange(n) - np.searchsorted(np.sort(e), s, side="right") + 1).max()), 1) if n else 1
    depth = max(depth, len(ends))
    out = np.zeros(n, np.int64)
    first_ok = all(int(s[k]) >= ends[k] for k in range(min(n, len(ends))))
    if first_ok and (n <= depth or (e[:-depth] <= s[depth:]).all()):
        out[order] = np.arange(n) % depth
        ends += [0] * (depth - len(ends))
        for k in range(min(n, depth)):
            ends[k] = int(e[k + (n - 1 - k) // depth * depth])  # the lane's last span
        return out
    free = [(end, lane) for lane, end in enumerate(ends)]  # (end, lane)
    heapq.heapify(free)
    for j, (a, z) in enumerate(zip(s.tolist(), e.tolist(), strict=True)):
        if free and free[0][0] <= a:
            _, lane = heapq.heappop(free)
        else:
            lane = len(ends)
            ends.append(0)
        out[order[j]] = lane
        ends[lane] = z
        heapq.heappush(free, (z, lane))
    return out
