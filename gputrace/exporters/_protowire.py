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
IP = npt.NDArray[np.intp]  # offsets: numpy gathers by intp as it is, an int32 index is converted

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


def read_at(buf: U8, at: IP) -> tuple[U64, IP]:
    """The varints that start at ``at``, and where each one ends (the offset after it). ``buf``
    must end with a whole varint (its last byte below 0x80), so none reads past it. Bytes past the
    first are read only for the values that have them."""
    first = buf[at]
    vals = first.astype(np.uint64)
    after = at + 1
    more = np.flatnonzero(first >= 0x80)
    if not len(more):
        return vals, after
    vals[more] &= np.uint64(0x7F)
    pos = after[more]
    shift = 7
    while True:
        b = buf[pos]
        vals[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        pos += 1
        go_on = b >= 0x80
        if not go_on.any():
            after[more] = pos
            return vals, after
        after[more] = pos
        more, pos, shift = more[go_on], pos[go_on], shift + 7


def one_byte_keys(buf: U8, key: int, piece: int = 1 << 18) -> IP | None:
    """Offsets of the fields whose key is the one byte ``key`` (< 0x80) in ``buf``, a run of
    fields that are all varints (key, value, key, value...), or None where ``buf`` does not
    hold whole pairs of varints.

    The varints' parity tells keys from values: their last bytes are found a piece of ``buf`` at
    a time (the count before a piece gives the parity of its first one), so the offsets stay in
    the cache and no array of every varint's end is made. A key's first byte follows a byte that
    ends a varint (or nothing), so a ``key`` byte after a byte of 0x80 or more ends a longer key."""
    n = len(buf)
    if n and buf[-1] >= 0x80:
        return None
    ends = buf < 0x80
    hit = buf == key
    hit[1:] &= ends[:-1]
    found: list[IP] = []
    parity = 0  # varints ended before the piece, modulo 2: 0 when the next one to end is a key
    start = 0
    while start < n:
        stop = min(start + piece, n)
        at = np.flatnonzero(ends[start:stop])
        at += start
        key_ends = at[parity::2]
        found.append(key_ends[hit[key_ends]])
        parity = (parity + len(at)) % 2
        start = stop
    if parity:
        return None
    return np.concatenate(found) if found else np.zeros(0, np.intp)


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
