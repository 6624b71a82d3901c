"""Protocol-buffer wire format, a column at a time: varints encoded and decoded with numpy.

The Perfetto writer (``pftrace.py``) lays out thousands of packets of one shape at once: every
field of a packet is a varint (tags, values and nested lengths alike), so a run of such packets is
one flat stream of varints that numpy writes and reads without a per-packet Python loop. The few
messages that hold strings or doubles go through the small scalar helpers at the bottom.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


def varint_len(v: U64) -> I64:
    """Bytes each value takes as a varint (1…10)."""
    n = np.ones(v.shape, np.int64)
    if not v.size:
        return n
    top = int(v.max())
    k = 1
    while k < 10 and top >= (1 << (7 * k)):
        n += v >= np.uint64(1 << (7 * k))
        k += 1
    return n


def put_varints(out: U8, off: I64, v: U64, length: I64) -> None:
    """Write each ``v[i]`` as a varint of ``length[i]`` bytes at ``out[off[i]:]``."""
    off = off.astype(np.int64, copy=False)
    v = v.astype(np.uint64, copy=False)
    seven = np.uint64(7)
    mask = np.uint64(0x7F)
    while len(v):
        more = length > 1
        b = (v & mask).astype(np.uint8)
        b[more] |= 0x80
        out[off] = b
        if not more.any():
            break
        off, v, length = off[more] + 1, v[more] >> seven, length[more] - 1


def read_varints(buf: U8) -> tuple[U64, npt.NDArray[np.int32]]:
    """Every varint of ``buf`` (which must hold only whole varints, < 2 GiB): values and start offsets."""
    starts, ends = varint_bounds(buf)
    return read_at(buf, starts, ends), starts


def varint_bounds(buf: U8) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """Start and last byte of every varint of ``buf`` (whole varints only, < 2 GiB)."""
    ends = np.flatnonzero(buf < 0x80).astype(np.int32)
    starts = np.empty(len(ends), np.int32)
    if len(ends):
        starts[0] = 0
        np.add(ends[:-1], 1, out=starts[1:])
    return starts, ends


def read_at(buf: U8, starts: npt.NDArray[np.int32], ends: npt.NDArray[np.int32]) -> U64:
    """The varints that start at ``starts`` and end at ``ends`` (a subset of a buffer's)."""
    vals = buf[starts].astype(np.uint64)
    multi = np.flatnonzero(ends != starts)
    if len(multi):
        vals[multi] &= np.uint64(0x7F)
    j = 1
    while len(multi):
        at = starts[multi] + j
        vals[multi] |= (buf[at] & 0x7F).astype(np.uint64) << np.uint64(7 * j)
        multi = multi[ends[multi] > at]
        j += 1
    return vals


def read_tags(buf: U8, starts: npt.NDArray[np.int32], ends: npt.NDArray[np.int32]) -> npt.NDArray[np.int32]:
    """Field keys (tags) of one or two bytes; -1 for a longer one (not a key gputrace writes)."""
    tags = buf[starts].astype(np.int32)
    two = np.flatnonzero(ends != starts)
    if len(two):
        tags[two] = (tags[two] & 0x7F) | (buf[starts[two] + 1].astype(np.int32) << 7)
        tags[two[ends[two] - starts[two] > 1]] = -1
    return tags


# -- scalar helpers (strings, doubles, the few descriptor packets) --------------------------------


def pv(n: int) -> bytes:
    """One varint; negative numbers as 64-bit two's complement (int64 fields)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def fv(field: int, n: int) -> bytes:
    return pv(field << 3) + pv(n)


def fb(field: int, data: bytes) -> bytes:
    return pv((field << 3) | LEN) + pv(len(data)) + data


def fs(field: int, text: str) -> bytes:
    return fb(field, text.encode("utf-8", "surrogatepass"))


def fd(field: int, x: float) -> bytes:
    return pv((field << 3) | FIXED64) + struct.pack("<d", x)


class Truncated(ValueError):
    """The bytes end inside a message."""


def read_pv(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    n = shift = 0
    while True:
        if pos >= len(data):
            raise Truncated("varint")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return n, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message."""
    pos, end = 0, len(data)
    while pos < end:
        key, pos = read_pv(data, pos)
        field, wt = key >> 3, key & 7
        if wt == VARINT:
            v, pos = read_pv(data, pos)
            yield field, wt, v
        elif wt == LEN:
            n, pos = read_pv(data, pos)
            if pos + n > end:
                raise Truncated("length-delimited field")
            yield field, wt, bytes(data[pos : pos + n])
            pos += n
        elif wt == FIXED64:
            if pos + 8 > end:
                raise Truncated("fixed64")
            yield field, wt, int.from_bytes(data[pos : pos + 8], "little")
            pos += 8
        elif wt == FIXED32:
            if pos + 4 > end:
                raise Truncated("fixed32")
            yield field, wt, int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wt}")


def as_int64(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n


def as_double(bits: int) -> float:
    return float(struct.unpack("<d", bits.to_bytes(8, "little"))[0])
