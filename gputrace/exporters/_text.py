"""JSON text of many events of one shape, built a column at a time with numpy.

Formatting events one by one (a dict or an f-string each) costs far more than their numbers, so
``Rows`` lays each event out as a row of bytes: literal text, integers and times as digit columns
(integer arithmetic and lookup tables, no float formatting), strings picked from a table, and
optional parts. A boolean mask keeps the bytes each row uses; the rows are one ``matrix[mask]``.

>>> import numpy as np
>>> r = Rows(3).lit('{"ts":').us(np.array([118508210, 900, -5])).lit(',"n":').num(np.array([7, -12, 0]))
>>> r.lit('}').tobytes()
b'{"ts":118508.21,"n":7},{"ts":0.9,"n":-12},{"ts":-0.005,"n":0},'

Times are integer ns written as µs with at most 3 decimals, trailing zeros dropped: exact, and
the shortest text for the value. The same rows serve protobuf (``pftrace``): ``var`` (varints),
``raw8`` (a fixed64 or a double), ``lengths`` (a nested message's length) and ``extend``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

Mask = npt.NDArray[np.bool_]
BLOCK = 8192  # rows built at a time: the byte matrix stays small (and in cache)
INLINE = 96  # longer picked strings are spliced into the text after the rows are built
SMALL = 128  # at most this many rows are formatted cell by cell (measured crossover)

_DIGITS2 = np.frombuffer("".join(f"{i:02d}" for i in range(100)).encode(), np.uint16)
# ".ddd" of each fraction, and which of its bytes are written (trailing zeros and a bare "."
# dropped), as one uint32 each: a 1-D take, viewed back as 4 bytes
_FRAC = np.frombuffer("".join(f".{i:03d}" for i in range(1000)).encode(), np.uint32)
_r = np.arange(1000)
_FRAC_KEEP = np.stack([_r != 0, _r != 0, _r % 100 != 0, _r % 10 != 0], axis=1).view(np.uint32).ravel()
_MINUS = np.frombuffer(b"-", np.uint8)
_POW10 = np.array([10**k for k in range(20)], np.uint64)
_SHIFT7 = np.arange(0, 70, 7, dtype=np.uint64)  # where each byte of a varint starts

# a column: (kind, payload, when) — when: the rows that have it (None: every row)
_Col = tuple[str, Any, Mask | None]


def _split_sign(v: npt.ArrayLike) -> tuple[npt.NDArray[np.uint64], Mask | None]:
    a = np.asarray(v)
    if a.dtype.kind == "u":
        return a.astype(np.uint64, copy=False), None
    a = a.astype(np.int64, copy=False)
    neg = a < 0
    if not neg.any():
        return a.astype(np.uint64), None
    mag = np.where(neg, -(a + 1), a).astype(np.uint64) + neg.astype(np.uint64)
    return mag, neg


def _digits(a: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint8], Mask | None]:
    """Decimal digits of ``a`` right-aligned in a (n, w) matrix, and which bytes are in use (None:
    all). Two digits at a time as one uint16 (a row lookup of a (100, 2) table costs several times more)."""
    n = len(a)
    top = int(a.max()) if n else 0
    if top < 10:
        return (a.astype(np.uint8) + 48).reshape(n, 1), None
    nd_top = len(str(top))
    pairs = (nd_top + 1) // 2
    w = 2 * pairs
    out = np.empty((n, pairs), np.uint16)
    q = a.astype(np.int64) if top < 1 << 63 else a
    k = q.dtype.type(100)
    for g in range(pairs - 1, 0, -1):
        q2 = q // k
        np.take(_DIGITS2, q - q2 * k, out=out[:, g])
        q = q2
    np.take(_DIGITS2, q, out=out[:, 0])
    chars = out.view(np.uint8)
    if int(a.min()) >= 10 ** (nd_top - 1):  # every row as long as the longest: no mask
        return chars[:, w - nd_top :], None
    nd = np.maximum(np.searchsorted(_POW10, a, side="right"), 1)
    keep = np.arange(w)[None, :] >= (w - nd)[:, None]
    return chars, keep


def _us_text(ns: int) -> bytes:
    q, r = divmod(abs(ns), 1000)
    text = b"-%d" % q if ns < 0 else b"%d" % q
    return text + (b".%03d" % r).rstrip(b"0") if r else text


def varint_len(values: npt.ArrayLike) -> npt.NDArray[np.intp]:
    """Bytes of each value's varint (as ``Rows.var`` writes it): one, and one more per 7-bit step
    the value reaches (a few comparisons of the whole column: a binary search per value costs more)."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    nb = np.ones(len(v), np.intp)
    top = int(v.max()) if len(v) else 0
    for k in range(1, max(top.bit_length() + 6, 7) // 7):
        nb += v >= np.uint64(1 << (7 * k))
    return nb


def _varint_bytes(v: npt.NDArray[np.uint64]) -> tuple[npt.NDArray[np.uint8], Mask]:
    """Each value's varint, left-aligned in a (n, w) matrix, and which bytes are in use: byte k
    holds bits 7k.. of the value, with the high bit set where more bytes follow."""
    top = int(v.max()) if len(v) else 0
    rest = v[:, None] >> _SHIFT7[: max(top.bit_length() + 6, 7) // 7]  # the value from byte k on
    more = rest > np.uint64(0x7F)
    chars = (rest & np.uint64(0x7F)).astype(np.uint8) | (more.view(np.uint8) << np.uint8(7))
    used = rest != 0
    used[:, 0] = True
    return chars, used


class Rows:
    """``n`` rows of text, built column by column, each followed by ``sep`` ("," for JSON; protobuf: b"")."""

    def __init__(self, n: int, sep: bytes = b",") -> None:
        self.n = n
        self.sep = sep
        self.cols: list[_Col] = []

    def _when(self, when: Mask | None) -> Mask | None:
        if when is None:
            return None
        w = np.asarray(when, bool)
        return None if w.all() else w

    def _col(self, kind: str, values: Any, when: Mask | None, blank: Any = 0) -> Rows:
        """A column of numbers; what a row leaves out is ``blank``, so it never widens the column."""
        self.cols.append((kind, values if when is None else np.where(when, values, blank), when))
        return self

    def lit(self, text: str | bytes, when: Mask | None = None) -> Rows:
        """The same text in every row (that ``when`` selects)."""
        data = text.encode() if isinstance(text, str) else text
        when = self._when(when)
        if data and (when is None or when.any()):
            if self.cols and self.cols[-1][0] == "lit" and self.cols[-1][2] is when:
                self.cols[-1] = ("lit", self.cols[-1][1] + data, when)
            else:
                self.cols.append(("lit", data, when))
        return self

    def num(self, values: npt.ArrayLike, when: Mask | None = None) -> Rows:
        """An integer per row."""
        v = np.asarray(values)
        when = self._when(when)
        if when is None and len(v) and (v == v[0]).all():
            return self.lit(str(int(v[0])))
        return self._col("int", v, when)

    def us(self, ns: npt.ArrayLike, when: Mask | None = None) -> Rows:
        """A time or duration per row: integer ns written as µs (≤ 3 decimals, exact)."""
        return self._col("us", np.asarray(ns), self._when(when))

    def pick(self, table: Sequence[str | bytes], index: npt.ArrayLike, when: Mask | None = None) -> Rows:
        """Per row, the text ``table[index]`` (written as it is: JSON-quote it first)."""
        idx = np.asarray(index, np.intp)
        enc = [t.encode() if isinstance(t, str) else t for t in table]
        when = self._when(when)
        if len(enc) == 1 or (len(idx) and when is None and (idx == idx[0]).all()):
            return self.lit(enc[int(idx[0])] if len(idx) else enc[0], when)
        self.cols.append(("pick", (enc, idx), when))
        return self

    def var(self, values: npt.ArrayLike, when: Mask | None = None) -> Rows:
        """A protobuf varint per row (negative integers as 64-bit two's complement)."""
        v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
        return self._col("var", v, self._when(when), np.uint64(0))

    def raw8(self, values: npt.ArrayLike, when: Mask | None = None) -> Rows:
        """Eight little-endian bytes per row (a protobuf fixed64 or double: int64 or float64)."""
        v = np.asarray(values)
        v = np.ascontiguousarray(v.astype(v.dtype.newbyteorder("<"), copy=False))
        self.cols.append(("raw8", v.view(np.uint8).reshape(-1, 8), self._when(when)))
        return self

    def extend(self, other: Rows) -> Rows:
        """``other``'s columns after this one's (a nested message after its length)."""
        self.cols += other.cols
        return self

    def lengths(self) -> npt.NDArray[np.int64]:
        """Bytes in each row so far (literal, varint, raw8 and picked columns)."""
        out = np.zeros(self.n, np.int64)
        for kind, payload, when in self.cols:
            if kind == "lit":
                w: Any = len(payload)
            elif kind == "var":
                w = varint_len(payload)
            elif kind == "raw8":
                w = 8
            elif kind == "pick":
                w = np.array([len(t) for t in payload[0]], np.int64)[payload[1]]
            else:
                raise ValueError(f"no byte count for a {kind} column")
            out += w if when is None else np.where(when, w, 0)
        return out

    def members(self, opener: str, items: Sequence[tuple[str, str, Any, Mask | None]]) -> Rows:
        """An optional JSON object: ``opener`` (e.g. ``,"args":{``), each item ``(key text, kind,
        value, has)`` a row has, then ``}``; left out of rows that have none. ``kind``: "int",
        "us" or "pick" (value: a (table, index) pair)."""
        has = [np.ones(self.n, bool) if h is None else np.asarray(h, bool) for _k, _t, _v, h in items]
        if not items:
            return self
        any_has = np.logical_or.reduce(has)
        before = np.zeros(self.n, bool)
        self.lit(opener, any_has)
        for (key, kind, value, _h), h in zip(items, has, strict=True):
            if not h.any():
                continue
            self.lit(",", h & before).lit(key, h)  # (one literal where every row has both)
            if kind == "pick":
                self.pick(value[0], value[1], h)
            else:
                (self.num if kind == "int" else self.us)(value, h)
            before = before | h
        return self.lit("}", any_has)

    # -- building ------------------------------------------------------------------------------
    def tobytes(self) -> bytes:
        return b"".join(self.blocks())

    def blocks(self) -> Iterator[Any]:
        """Every row, each followed by ``sep``, as a few buffers (bytes or uint8 arrays), each
        built when it is asked for (a writer compresses one while the next is built)."""
        self.lit(self.sep)
        if self.n <= SMALL and not any(kind in ("var", "raw8") for kind, _p, _w in self.cols):
            yield self._small()
            return
        for i in range(0, self.n, BLOCK):
            yield self._block(i, min(i + BLOCK, self.n))

    def _small(self) -> bytes:
        """A few rows, cell by cell (numpy's per-call cost outweighs the work)."""
        cols: list[list[bytes]] = []
        for kind, payload, when in self.cols:
            if kind == "lit":
                cells = [payload] * self.n
            elif kind == "int":
                cells = [b"%d" % v for v in payload.tolist()]
            elif kind == "us":
                cells = list(map(_us_text, payload.tolist()))
            else:
                table, idx = payload
                cells = [table[i] for i in idx.tolist()]
            if when is not None:
                cells = [c if w else b"" for c, w in zip(cells, when.tolist(), strict=True)]
            cols.append(cells)
        return b"".join([b"".join(row) for row in zip(*cols, strict=True)])

    def _block(self, lo: int, hi: int) -> Any:
        b = hi - lo
        # per column: (chars (w,) for every row or (b, w), keep (b, w) or None, when (b,) or None)
        pieces: list[tuple[Any, Mask | None, Mask | None]] = []
        splices: list[tuple[int, Any, Any, Sequence[bytes]]] = []  # (piece no., rows, indexes, table)
        for kind, payload, wb in self.cols:  # ``wb``: the whole column's (sliced when applied)
            if kind == "lit":
                pieces.append((np.frombuffer(payload, np.uint8), None, wb))
            elif kind == "var":
                pieces.append((*_varint_bytes(payload[lo:hi]), wb))
            elif kind == "raw8":
                pieces.append((payload[lo:hi], None, wb))
            elif kind in ("int", "us"):
                mag, neg = _split_sign(payload[lo:hi])
                if neg is not None:
                    pieces.append((_MINUS, neg[:, None], wb))
                if kind == "int":
                    pieces.append((*_digits(mag), wb))
                else:
                    q = mag // np.uint64(1000)
                    pieces.append((*_digits(q), wb))
                    r = (mag - q * np.uint64(1000)).astype(np.intp)
                    frac = _FRAC[r].view(np.uint8).reshape(-1, 4)
                    pieces.append((frac, _FRAC_KEEP[r].view(np.bool_).reshape(-1, 4), wb))
            else:
                table, idx = payload
                ib = idx[lo:hi]
                lens = np.array([len(t) for t in table], np.intp)
                long_ = lens > INLINE
                if long_.any():
                    spliced = long_[ib] if wb is None else long_[ib] & wb[lo:hi]
                    rows = np.flatnonzero(spliced)
                    if len(rows):
                        splices.append((len(pieces), rows, ib[rows], table))
                    lens = np.where(long_, 0, lens)
                w = int(lens.max()) if len(lens) else 0
                if not w:
                    continue
                blank = b"\0" * w
                padded = b"".join(blank if long_[k] else t.ljust(w, b"\0") for k, t in enumerate(table))
                mat = np.frombuffer(padded, np.uint8).reshape(len(table), w)
                li = lens[ib]
                keep = None if (li == w).all() else np.arange(w)[None, :] < li[:, None]
                pieces.append((np.take(mat, ib, axis=0), keep, wb))
        widths = [p[0].shape[-1] for p in pieces]
        starts = [0, *itertools.accumulate(widths)]  # where each piece starts in a row; then its end
        width = starts[-1]
        # literal text and "every byte in use" first, for whole rows at once; then the columns
        template = np.zeros(width, np.uint8)
        for (chars, _keep, _wb), o, w in zip(pieces, starts, widths, strict=False):
            if chars.ndim == 1:
                template[o : o + w] = chars
        out = np.broadcast_to(template, (b, width)).copy()
        used = np.ones((b, width), bool)
        for (chars, keep, wb), o, w in zip(pieces, starts, widths, strict=False):
            if chars.ndim == 2:
                out[:, o : o + w] = chars
            if keep is not None:
                used[:, o : o + w] = keep
            if wb is not None:
                used[:, o : o + w] &= wb[lo:hi, None]
        flat = out[used]
        if not splices:
            return flat
        # each long string's place in the text: its row's start plus the bytes before its column
        row_start = np.zeros(b + 1, np.int64)
        np.cumsum(used.sum(axis=1), out=row_start[1:])
        at, order, which = [], [], []
        for k, (p, rows, idx, _t) in enumerate(splices):
            at.append(row_start[rows] + used[rows, : starts[p]].sum(axis=1))
            order.append(np.full(len(rows), k))
            which.append(idx)
        pos, ks, idx = (np.concatenate(x) for x in (at, order, which))
        sort = np.lexsort((ks, pos))
        data = flat.tobytes()
        segs: list[bytes] = []
        cut = 0
        for p_, k_, i_ in zip(pos[sort].tolist(), ks[sort].tolist(), idx[sort].tolist(), strict=True):
            segs.append(data[cut:p_])
            segs.append(splices[k_][3][i_])
            cut = p_
        segs.append(data[cut:])
        return b"".join(segs)
