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
IP = npt.NDArray[np.intp]

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


def varint_ends(buf: U8) -> IP:
    """The last byte of every varint of ``buf`` (a byte below 0x80 ends one).

    As ``intp``: numpy gathers with an ``intp`` index as it is, while an ``int32`` one is
    converted at every use (four times slower here)."""
    return np.flatnonzero(buf < 0x80)


def read_at(buf: U8, starts: IP) -> U64:
    """The varints that start at ``starts``, each read up to its last byte (below 0x80); ``buf``
    must end with a whole varint. Bytes past the first are read only for the values that have them."""
    first = buf[starts]
    vals = first.astype(np.uint64)
    more = np.flatnonzero(first >= 0x80)
    if not len(more):
        return vals
    vals[more] &= np.uint64(0x7F)
    at = starts[more] + 1
    shift = 7
    while True:
        b = buf[at]
        vals[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        go_on = b >= 0x80
        if not go_on.any():
            return vals
        more, at, shift = more[go_on], at[go_on] + 1, shift + 7


LONG_KEY = 0xFFFF  # what ``read_keys`` gives a key of more than two bytes (no key gputrace writes)


def read_keys(buf: U8, key_ends: IP) -> npt.NDArray[np.uint16]:
    """Field keys (tags) of one or two bytes, from the last byte of each; ``LONG_KEY`` for a
    longer one. ``key_ends`` are the ends of keys that follow whole varints: the byte before a
    key's first byte ends a varint (below 0x80), so a byte of 0x80 or more just before a key's
    last byte is its first byte."""
    keys = buf[key_ends].astype(np.uint16)
    before = np.zeros_like(buf)  # each byte's predecessor, gathered with the same index
    before[1:] = buf[:-1]
    first = before[key_ends]
    two = np.flatnonzero(first >= 0x80)
    if len(two):
        e2 = key_ends[two]
        keys[two] = (first[two] & 0x7F).astype(np.uint16) | (keys[two] << 7)
        longer = before[e2 - 1] >= 0x80  # (e2 >= 1: a two-byte key ends at 1 or later)
        keys[two[longer]] = LONG_KEY
    return keys


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
