"""CUPTI activity buffers decoded in bulk: numpy over whole buffers, never a Python object per record.

A buffer holds records back to back, each 8-byte aligned, starting with its kind
(``CUpti_ActivityKind``, uint32) and as long as that kind's struct: offsets from CUPTI 13's
``cupti_activity.h`` (13.x only appends fields), sizes from libcupti. Where a record starts depends
on the kind before it; that chain is walked with no loop per record (runs of one repeating
pattern, else pruning of candidate slots and pointer doubling) and must end exactly at the
buffer's valid end: anything else is reported, never guessed. Detail: docs/cupti.md, "How CUPTI
records are read".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# CUpti_ActivityKind values (cupti_activity.h)
KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_DRIVER = 4
KIND_RUNTIME = 5
KIND_CONCURRENT_KERNEL = 10
RECORD_ALIGN = 8  # ACTIVITY_RECORD_ALIGNMENT
RUN_CHECK = 4096  # records of a run predicted and checked at a time
FIRST_CHECK = 32  # ... the first time: most runs of a buffer that interleaves kinds are short
SHORT_RUNS = 8  # runs shorter than SHORT_RECORDS tolerated before the general walk decides
# (a run costs ~20 µs of numpy calls; the general walk, ~0.1 µs a record)
SHORT_RECORDS = 128
PRUNE = 4  # rounds of dropping candidate slots that no whole chain can pass through


def _layout(fields: list[tuple[str, Any, int]], itemsize: int = 0) -> np.dtype:
    """(name, type, offset) fields in records ``itemsize`` long (0: as long as the last field reaches)."""
    names, formats, offsets = zip(*fields, strict=True)
    itemsize = itemsize or max(off + np.dtype(t).itemsize for _, t, off in fields)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize})


# The fields gputrace reads, at their offsets in the CUPTI 13 structs; itemsize: CUPTI 13.4's size.
KERNEL = _layout(
    [("kind", "<u4", 0), ("start", "<u8", 16), ("end", "<u8", 24), ("deviceId", "<u4", 40),
     ("streamId", "<u4", 48), ("gridX", "<i4", 52), ("gridY", "<i4", 56), ("gridZ", "<i4", 60),
     ("blockX", "<i4", 64), ("blockY", "<i4", 68), ("blockZ", "<i4", 72), ("correlationId", "<u4", 92),
     ("name", "<u8", 104), ("graphNodeId", "<u8", 144), ("graphId", "<u4", 156)],
    248,
)  # fmt: skip
API = _layout(
    [("kind", "<u4", 0), ("cbid", "<u4", 4), ("start", "<u8", 8), ("end", "<u8", 16),
     ("processId", "<u4", 24), ("threadId", "<u4", 28), ("correlationId", "<u4", 32),
     ("returnValue", "<u4", 36)],
    40,
)  # fmt: skip
MEMCPY = _layout(
    [("kind", "<u4", 0), ("copyKind", "u1", 4), ("bytes", "<u8", 8), ("start", "<u8", 16),
     ("end", "<u8", 24), ("deviceId", "<u4", 32), ("streamId", "<u4", 40), ("correlationId", "<u4", 44),
     ("graphNodeId", "<u8", 64), ("graphId", "<u4", 72)],
    112,
)  # fmt: skip
MEMSET = _layout(
    [("kind", "<u4", 0), ("bytes", "<u8", 8), ("start", "<u8", 16), ("end", "<u8", 24),
     ("deviceId", "<u4", 32), ("streamId", "<u4", 40), ("correlationId", "<u4", 44),
     ("graphNodeId", "<u8", 64), ("graphId", "<u4", 72)],
    104,
)  # fmt: skip
LAYOUTS = {KIND_CONCURRENT_KERNEL: KERNEL, KIND_DRIVER: API, KIND_RUNTIME: API,
           KIND_MEMCPY: MEMCPY, KIND_MEMSET: MEMSET}  # fmt: skip
CUPTI_13_SIZES = {k: d.itemsize for k, d in LAYOUTS.items()}
# CUPTI 12 has no cuptiActivityGetStructSize: the record sizes of 12.8 and 12.9 by API version,
# from their headers, where every field above sits at the same offset (docs/cupti.md).
CUPTI_12_SIZES = {
    v: {KIND_CONCURRENT_KERNEL: 208, KIND_DRIVER: 40, KIND_RUNTIME: 40, KIND_MEMCPY: 96, KIND_MEMSET: 88}
    for v in (26, 27, 28)  # CUDA 12.8, 12.9, 12.9 Update 1
}


def fields_of(dtype: np.dtype) -> list[tuple[str, np.dtype, int]]:
    """(name, type, offset) of each field of a record layout."""
    assert dtype.names is not None and dtype.fields is not None
    return [(f, dtype.fields[f][0], int(dtype.fields[f][1])) for f in dtype.names]


# the same fields packed (what decoding returns: no copy of the bytes gputrace does not read), and
# at their offsets (a record of any 13.x size holds them)
COMPACT = {k: np.dtype([(f, t) for f, t, _ in fields_of(d)]) for k, d in LAYOUTS.items()}
FIELDS = {k: _layout(fields_of(d)) for k, d in LAYOUTS.items()}


def layout_for(version: int, sizes: dict[int, int]) -> dict[int, int] | str:
    """Record sizes to decode with, or why this CUPTI cannot be decoded in bulk. ``version``: the
    CUPTI API version (``cuptiGetVersion``, e.g. 130401); ``sizes``: per kind what
    ``cuptiActivityGetStructSize`` answered (none for CUPTI 12: ``CUPTI_12_SIZES``)."""
    if version in CUPTI_12_SIZES and not sizes:
        sizes = CUPTI_12_SIZES[version]
    elif not 130000 <= version < 140000:
        return (
            f"CUPTI API version {version} has no known record layout "
            "(gputrace knows CUPTI 13.x, and 12.8 and 12.9: API versions 26–28)"
        )
    out = {}
    for kind in LAYOUTS:
        got, need = sizes.get(kind, 0), FIELDS[kind].itemsize
        if got < need or got % RECORD_ALIGN:
            return f"CUPTI {version} reports {got} B records of kind {kind}; the layout needs {need} B"
        out[kind] = got
    return out


@dataclass
class Decoded:
    """One buffer's records by kind (structured arrays of the fields above, ``COMPACT``)."""

    kernels: np.ndarray
    memcpys: np.ndarray
    memsets: np.ndarray
    calls: np.ndarray  # driver and runtime API records (``kind`` tells which)
    records: int  # records in the buffer, every kind
    problem: str = ""  # why (part of) the buffer could not be decoded; "" when all was


class BufferDecoder:
    """Decodes whole activity buffers with one size per kind (see the module docstring)."""

    def __init__(self, sizes: dict[int, int] | None = None) -> None:
        self.sizes = dict(CUPTI_13_SIZES if sizes is None else sizes)
        top = max(self.sizes) + 1
        # record size in 8-byte slots per kind; 0: not a kind this decoder knows
        self._slots = np.zeros(top + 1, np.int64)
        for kind, size in self.sizes.items():
            self._slots[kind] = size // RECORD_ALIGN
        self._top = top

    def starts(self, buf: np.ndarray) -> tuple[np.ndarray, str]:
        """Byte offsets of the records in ``buf`` (uint8, the valid bytes only), and why the
        chain broke ("" when it ended exactly at the end of the buffer)."""
        n = len(buf) // RECORD_ALIGN
        if n == 0:
            return np.zeros(0, np.int64), ("" if len(buf) == 0 else f"a {len(buf)} B buffer holds no record")
        words = buf[: n * RECORD_ALIGN].view("<u4")[0::2]  # the first word of every slot
        slots, pos = self._runs(words, n)
        broke = False
        if pos < n:  # the rest of the chain, from slot ``pos`` (where the runs gave up) on
            small = pos + np.flatnonzero(
                (words[pos:] - np.uint32(1)) < np.uint32(self._top - 1)
            )  # 1 ... top-1
            cand = small[self._slots[words[small]] > 0]
            if not len(cand) or cand[0] != pos:
                if pos == 0:
                    return np.zeros(0, np.int64), f"the first record is of unknown kind {int(words[0])}"
                unknown = f"a record of unknown kind {int(words[pos])} at byte {pos * RECORD_ALIGN}"
                return slots * RECORD_ALIGN, unknown
            rest, broke = self._walk(words, n, cand)
            slots = np.concatenate([slots, rest])
        starts = slots * RECORD_ALIGN
        if not broke:
            stray = len(buf) % RECORD_ALIGN
            return starts, (f"{stray} stray bytes after the last record" if stray else "")
        last = int(starts[-1])
        tail = last + int(self.sizes.get(int(words[last // RECORD_ALIGN]), 0))
        return starts, (
            f"the record chain broke at byte {tail} of {len(buf)} (a short buffer or an unknown kind)"
            if tail >= len(buf) or int(words[tail // RECORD_ALIGN]) in self.sizes
            else f"a record of unknown kind {int(words[tail // RECORD_ALIGN])} at byte {tail}"
        )

    def _walk(self, words: np.ndarray, n: int, cand: np.ndarray) -> tuple[np.ndarray, bool]:
        """The chain from ``cand[0]`` through the ascending candidate slots ``cand``, and whether it
        broke before the end (``n``). ``PRUNE`` rounds of dropping slots whose next record starts at
        no candidate (nor the end) leave little more than the records (12k records: ~40k
        candidates); pointer doubling walks the rest. The up to ``PRUNE`` tail records a broken
        chain loses that way are walked again one by one."""
        slots = self._slots
        is_cand = np.zeros(n + 1, bool)
        is_cand[cand] = True
        kept, first = cand, int(cand[0])
        for _ in range(PRUNE):
            if not len(kept):  # every candidate pruned: the tail walk below finds the chain
                break
            after = kept + slots[words[kept]]
            ok = after == n
            inside = after < n
            ok[inside] = is_cand[after[inside]]
            if ok.all():
                # every slot left leads to another or to the end; if no two lead to the same one,
                # they are one chain, from the first: the records (the usual case)
                ends = np.zeros(n + 1, bool)
                ends[after] = True
                if kept[0] == first and np.count_nonzero(ends) == len(kept):
                    return kept, False
                break
            is_cand[kept[~ok]] = False
            kept = kept[ok]
        chain = self._double(kept, slots[words[kept]], n) if len(kept) and kept[0] == first else kept[:0]
        # the tail the pruning took (a broken chain), one record at a time from the last reached
        at = int(chain[-1]) + int(slots[words[chain[-1]]]) if len(chain) else int(first)
        tail = []
        is_cand[cand] = True
        while at < n and is_cand[at]:
            tail.append(at)
            at += int(slots[words[at]])
        if tail:
            chain = np.concatenate([chain, np.array(tail, np.int64)])
        return chain, at != n

    @staticmethod
    def _double(cand: np.ndarray, slots: np.ndarray, n: int) -> np.ndarray:
        """The chain from ``cand[0]`` by pointer doubling: each candidate links to the candidate
        its record ends at (or to the end, or nowhere)."""
        m = len(cand)
        after = cand + slots
        j = np.searchsorted(cand, after)
        jc = np.minimum(j, m - 1)
        end, bad = m, m + 1
        link = np.where(cand[jc] == after, jc, np.where(after == n, end, bad))
        link = np.concatenate([link, [end, bad]])
        on = np.zeros(m + 2, bool)
        on[0] = True
        # after step k, `on` holds every chain node fewer than 2**k links from the first, and
        # `link` jumps 2**k links; the chain is whole once a 2**k jump from the first ends it
        while link[0] < m:
            on[link[on]] = True
            link = link[link]
        out: np.ndarray = cand[on[:m]]
        return out

    def _runs(self, words: np.ndarray, n: int) -> tuple[np.ndarray, int]:
        """The chain's slots predicted as checked runs of a pattern of one or two kinds, and the
        slot where they stop: ``n`` at the end, else where the chain breaks or the runs turn short
        (the general walk goes on from there, and says why if it breaks)."""
        slots, top = self._slots, self._top
        found: list[np.ndarray] = [np.zeros(0, np.int64)]
        pos, short, check = 0, 0, FIRST_CHECK
        while pos < n:
            k0 = int(words[pos])
            s0 = int(slots[k0]) if k0 <= top else 0
            k1 = int(words[pos + s0]) if s0 and pos + s0 < n else k0
            s1 = int(slots[k1]) if k1 <= top else 0
            if not (s0 and s1):  # a kind not known here, at pos or right after it
                return np.concatenate(found), pos
            pattern = np.array([0] if k1 == k0 else [0, s0], np.int64)
            kinds = np.array([k0] if k1 == k0 else [k0, k1], words.dtype)
            period = s0 if k1 == k0 else s0 + s1
            reps = min((n - pos) // period + 1, check)
            at = (pos + period * np.arange(reps, dtype=np.int64)[:, None] + pattern).ravel()
            inside = at < n
            at = at[inside]
            bad = np.flatnonzero(words[at] != np.tile(kinds, reps)[inside])
            i = int(bad[0]) if len(bad) else len(at)
            found.append(at[:i])  # (at[0] is pos, of kind k0: i >= 1)
            check = RUN_CHECK if i == len(at) else FIRST_CHECK  # a run that held throughout goes on
            # the record after the last one checked: where the next run starts
            pos = int(at[i]) if i < len(at) else int(at[i - 1]) + int(slots[int(words[at[i - 1]])])
            if i < min(SHORT_RECORDS, len(at)) and pos < n:  # a run that ended short
                short += 1
                if short > SHORT_RUNS:
                    return np.concatenate(found), pos
        if pos > n:  # the last record runs past the end (a cut buffer): the general walk says where
            return found[0], 0
        return np.concatenate(found), pos

    def decode(self, buf: np.ndarray) -> Decoded:
        """All records of one buffer, by kind. What cannot be decoded is said in ``problem``;
        the records before the break are kept."""
        starts, problem = self.starts(buf)
        if len(starts):
            last = int(starts[-1])
            kind_last = int(buf[last : last + 4].view("<u4")[0])
            if last + self.sizes[kind_last] > len(buf):  # a record cut short: never read past the end
                starts = starts[:-1]
        whole = buf[: len(buf) // RECORD_ALIGN * RECORD_ALIGN]
        kind_at = whole.view("<u4")[0::2][starts // RECORD_ALIGN]
        by_width = {1: whole, 2: whole.view("<u2"), 4: whole.view("<u4"), 8: whole.view("<u8")}

        def take(*kinds: int) -> np.ndarray:
            """The records of ``kinds`` (which share one layout)."""
            mine = kind_at == kinds[0]
            for k in kinds[1:]:
                mine |= kind_at == k  # (``np.isin`` costs 50 times more over a few kinds)
            at = starts[mine]
            out = np.zeros(len(at), COMPACT[kinds[0]])
            if not len(at):
                return out
            step = int(at[1] - at[0]) if len(at) > 1 else 0
            if step and (np.diff(at) == step).all():  # evenly spaced (runs): a view, no gathers
                rows = np.ndarray((len(at),), FIELDS[kinds[0]], whole, int(at[0]), (step,))
                for field in out.dtype.names or ():
                    out[field] = rows[field]
                return out
            # one gather per field: every field is naturally aligned inside its 8-aligned record
            for field, ftype, off in fields_of(LAYOUTS[kinds[0]]):
                w = ftype.itemsize
                out[field] = by_width[w][(at + off) // w]
            return out

        return Decoded(
            kernels=take(KIND_CONCURRENT_KERNEL),
            memcpys=take(KIND_MEMCPY),
            memsets=take(KIND_MEMSET),
            calls=take(KIND_DRIVER, KIND_RUNTIME),
            records=len(starts),
            problem=problem,
        )


# What a source hands the backend, whatever made the records (libcupti or the test fake).
OPS = np.dtype([("kind", "<i4"), ("name", "<i4"), ("device", "<i4"), ("stream", "<i8"),
                ("correlation", "<i8"), ("start", "<i8"), ("end", "<i8"), ("bytes", "<i8"),
                ("grid", "<i8", (3,)), ("block", "<i8", (3,)), ("graph_id", "<i8"),
                ("graph_node_id", "<i8")])  # fmt: skip
CALLS = np.dtype([("correlation", "<i8"), ("tid", "<i8"), ("start", "<i8"), ("end", "<i8"),
                  ("domain", "<i4"), ("cbid", "<i4")])  # fmt: skip
DOMAIN_DRIVER, DOMAIN_RUNTIME = 0, 1  # CallTuple's domain: 0 driver, 1 runtime

# PyTorch's names for memcpy kinds (CUpti_ActivityMemcpyKind), as HTA expects them
MEMCPY_NAMES = {1: "Memcpy HtoD", 2: "Memcpy DtoH", 3: "Memcpy HtoA", 4: "Memcpy AtoH", 5: "Memcpy AtoA",
                6: "Memcpy AtoD", 7: "Memcpy DtoA", 8: "Memcpy DtoD", 9: "Memcpy HtoH",
                10: "Memcpy PtoP"}  # fmt: skip


class NameTable:
    """Operation names by index (kernel names read once per distinct name pointer)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._index: dict[str, int] = {}
        self._by_ptr: dict[int, int] = {}

    def index(self, name: str) -> int:
        got = self._index.get(name)
        if got is None:
            got = self._index[name] = len(self.names)
            self.names.append(name)
        return got

    def of_pointers(self, ptrs: np.ndarray, read: Callable[[int], str]) -> np.ndarray:
        """Name indices for C string pointers; ``read`` is called once per pointer never seen."""

        def index_of(ptr: int) -> int:
            got = self._by_ptr.get(ptr)
            if got is None:
                got = self._by_ptr[ptr] = self.index(read(ptr) if ptr else "?")
            return got

        return per_unique(ptrs, index_of, np.int32)


def per_unique(values: np.ndarray, f: Callable[[int], Any], dtype: Any) -> np.ndarray:
    """``f`` of each of ``values`` as an array of ``dtype``, called once per distinct value."""
    if len(values) and (values == values[0]).all():  # one stream, thread or call: no sort
        return np.full(len(values), f(values[0].item()), dtype)
    uniq, inv = np.unique(values, return_inverse=True)
    out: np.ndarray = np.array([f(v) for v in uniq.tolist()], dtype)[inv.reshape(-1)]
    return out


def concat(parts: list[np.ndarray]) -> np.ndarray:
    """Structured arrays of one dtype joined as raw rows (numpy joins them field by field: 20x slower)."""
    raw = np.dtype((np.void, parts[0].dtype.itemsize))
    out: np.ndarray = np.concatenate([p.view(raw) for p in parts]).view(parts[0].dtype)
    return out


def unfinished(ops: np.ndarray) -> np.ndarray:
    """Which operations have no GPU times: a forced flush hands over work still running with zero
    timestamps, never completed later (its launch call's work did arrive, with no time to show)."""
    bad: np.ndarray = (ops["start"] <= 0) | (ops["end"] < ops["start"])
    return bad


def columns(
    parts: list[Decoded], names: NameTable, read_name: Callable[[int], str]
) -> tuple[np.ndarray, np.ndarray]:
    """The decoded buffers as one operations array (``OPS``) and one API-call array (``CALLS``)."""
    from gputrace.records import OP_KERNEL, OP_MEMCPY, OP_MEMSET

    def cat(field: str, kind: int) -> np.ndarray:
        got = [getattr(p, field) for p in parts if len(getattr(p, field))]
        if len(got) == 1:
            one: np.ndarray = got[0]
            return one
        return concat(got) if got else np.zeros(0, COMPACT[kind])

    def copy_name(copy_kind: int) -> int:
        return names.index(MEMCPY_NAMES.get(copy_kind, "Memcpy"))

    k, mc = cat("kernels", KIND_CONCURRENT_KERNEL), cat("memcpys", KIND_MEMCPY)
    ms, c = cat("memsets", KIND_MEMSET), cat("calls", KIND_DRIVER)
    ops = np.zeros(len(k) + len(mc) + len(ms), OPS)
    a, b = len(k), len(k) + len(mc)
    for lo, hi, rec, kind in ((0, a, k, OP_KERNEL), (a, b, mc, OP_MEMCPY), (b, len(ops), ms, OP_MEMSET)):
        if hi == lo:
            continue
        o = ops[lo:hi]
        o["kind"] = kind
        for f_out, f_in in (("device", "deviceId"), ("stream", "streamId"), ("correlation", "correlationId"),
                            ("start", "start"), ("end", "end"), ("graph_id", "graphId"),
                            ("graph_node_id", "graphNodeId")):  # fmt: skip
            o[f_out] = rec[f_in]
        if kind == OP_KERNEL:
            o["name"] = names.of_pointers(rec["name"], read_name)
            o["grid"] = np.stack([rec["gridX"], rec["gridY"], rec["gridZ"]], axis=1)
            o["block"] = np.stack([rec["blockX"], rec["blockY"], rec["blockZ"]], axis=1)
        else:
            o["bytes"] = rec["bytes"]
            if kind == OP_MEMCPY:
                o["name"] = per_unique(rec["copyKind"], copy_name, np.int32)
            else:
                o["name"] = names.index("Memset")
    calls = np.zeros(len(c), CALLS)
    for f_out, f_in in (
        ("correlation", "correlationId"),
        ("tid", "threadId"),
        ("start", "start"),
        ("end", "end"),
    ):
        calls[f_out] = c[f_in]
    calls["domain"] = np.where(c["kind"] == KIND_RUNTIME, DOMAIN_RUNTIME, DOMAIN_DRIVER)
    calls["cbid"] = c["cbid"]
    return ops, calls
