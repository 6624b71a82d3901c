"""Raw records: what the recorder, backends and timing sources hand the resolver. Times are in the
domain they were read in (the session clock for CPU reads, a GPU or CUPTI clock for device
timestamps); only the resolver aligns them."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from gputrace.model import QueueInfo

# Kinds of GPU operation a timing source sees (``OP_ROWS`` "kind", ``OpTable.kind``).
OP_KERNEL = 0
OP_MEMCPY = 1
OP_MEMSET = 2
OP_KINDS = ("kernel", "memcpy", "memset")


@dataclass(frozen=True)
class CalibrationSample:
    """A GPU timestamp known to have been taken between two session-clock reads."""

    cpu_before_ns: int
    gpu_ns: int  # GPU clock, nanoseconds (ticks × timestamp period)
    cpu_after_ns: int
    device: int = 0

    @property
    def half_width_ns(self) -> float:
        return (self.cpu_after_ns - self.cpu_before_ns) / 2.0


class RawSpan(NamedTuple):
    """One GPU span in the backend's clock, tied to a scope by its token (a named tuple of plain
    numbers: the garbage collector stops tracking it, however many wait)."""

    token: int
    queue: int  # index into Backend.queues()
    gpu_start_ns: int  # raw GPU clock, ns
    gpu_end_ns: int
    submit_ns: int  # session clock: when the CPU submitted this work
    done_by_ns: int  # session clock: by then the work was known complete (the collecting sync)
    label: str = ""  # a pass label; "" for a scope-level event pair


_SPAN_INTS = operator.itemgetter(slice(0, 6))  # (token … done_by_ns: ``RawSpan``'s integer fields)


@dataclass(eq=False)
class SpanBatch:
    """GPU spans as columns, no object per span: ``cols`` (n, 6) int64 in ``RawSpan``'s order
    (token … done_by_ns), ``labels`` one per span, or None where every label is "". Iterating
    gives ``RawSpan``s."""

    cols: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros((0, 6), np.int64))
    labels: list[str] | None = None

    @staticmethod
    def of(spans: Iterable[RawSpan]) -> SpanBatch:
        """The spans of a list of ``RawSpan`` (backends that make a few)."""
        spans = list(spans)
        m = len(spans)
        cols = np.fromiter(itertools.chain.from_iterable(map(_SPAN_INTS, spans)), np.int64, 6 * m)
        labels = [sp.label for sp in spans]
        return SpanBatch(cols.reshape(m, 6), labels if any(labels) else None)

    @staticmethod
    def concat(batches: Iterable[SpanBatch]) -> SpanBatch:
        parts = [b for b in batches if len(b)]
        if len(parts) <= 1:
            return parts[0] if parts else SpanBatch()
        labels = None
        if any(b.labels is not None for b in parts):
            labels = [lb for b in parts for lb in b.label_list()]
        return SpanBatch(np.concatenate([b.cols for b in parts]), labels)

    def __len__(self) -> int:
        return len(self.cols)

    def __iter__(self) -> Iterator[RawSpan]:
        return itertools.starmap(RawSpan, zip(*self.cols.T.tolist(), self.label_list(), strict=True))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, SpanBatch)
            and np.array_equal(self.cols, other.cols)
            and self.label_list() == other.label_list()
        )

    def label_list(self) -> list[str]:
        return [""] * len(self) if self.labels is None else self.labels

    def take(self, rows: npt.ArrayLike) -> SpanBatch:
        """The spans at ``rows`` (indexes), in that order."""
        idx = np.asarray(rows, np.intp)
        labels = None if self.labels is None else [self.labels[i] for i in idx.tolist()]
        return SpanBatch(self.cols[idx], labels)


# One row per GPU operation as a source saw it, every time on its clock (CUPTI: CLOCK_REALTIME ns)
# but ``done_by_ns`` (the session clock at the collect that delivered it). ``call_*``: the launch
# call (``call_tid`` −1, times 0 when not seen); ``name``, ``call_name`` ("cuLaunchKernel") index
# ``OpBatch.names``.
OP_ROWS = np.dtype([("kind", "<i4"), ("name", "<i4"), ("device", "<i4"), ("queue", "<i4"),
                    ("correlation", "<i8"), ("gpu_start_ns", "<i8"), ("gpu_end_ns", "<i8"),
                    ("call_tid", "<i8"), ("call_start_ns", "<i8"), ("call_end_ns", "<i8"),
                    ("call_name", "<i4"), ("bytes", "<i8"), ("grid", "<i8", (3,)), ("block", "<i8", (3,)),
                    ("graph_id", "<i8"), ("graph_node_id", "<i8"), ("done_by_ns", "<i8")])  # fmt: skip


@dataclass
class OpBatch:
    """GPU operations as ``OP_ROWS`` columns (no object per operation). ``tid_alt`` maps a launching
    thread to the other OS threads it may have been: CUPTI names threads by pthread id, which a
    later thread can reuse (the resolver picks the one whose scope holds the call)."""

    rows: np.ndarray
    names: list[str]
    tid_alt: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.rows)

    @staticmethod
    def concat(batches: list[OpBatch]) -> OpBatch:
        """One batch of several; names merged."""
        batches = [b for b in batches if len(b)]
        if len(batches) == 1:
            return batches[0]
        names: dict[str, int] = {}
        parts, alt = [], {}
        for b in batches:
            remap = np.array([names.setdefault(n, len(names)) for n in b.names] or [0], np.int32)
            r = b.rows.copy()
            r["name"] = remap[r["name"]]
            r["call_name"] = remap[r["call_name"]]
            parts.append(r)
            alt.update(b.tid_alt)
        rows = np.concatenate(parts) if parts else np.zeros(0, OP_ROWS)
        return OpBatch(rows, list(names), alt)

    def take(self, keep: np.ndarray) -> OpBatch:
        return OpBatch(self.rows[keep], self.names, self.tid_alt)


@dataclass(frozen=True)
class Blind:
    """A stretch of the source's clock during which it saw nothing (another tool held it)."""

    start_ns: int  # source clock
    end_ns: int
    why: str


@dataclass
class Collected:
    """What one ``collect()`` returns."""

    spans: SpanBatch = field(default_factory=SpanBatch)
    untimed: set[int] = field(default_factory=set)  # tokens the GPU could not time
    degraded: dict[int, str] = field(default_factory=dict)  # token -> what went wrong
    blind: list[Blind] = field(default_factory=list)
    ops_timing: bool = False  # a timing source that observes every scope made this collect
    batches: list[OpBatch] = field(default_factory=list)  # operations as columns (bulk sources)


@dataclass
class RawThread:
    """One thread's drained buffer, handed to the resolver."""

    tid: int
    name: str
    names: list[str]
    times: npt.NDArray[np.int64]  # shape (n, 4): cpu_start_ns, cpu_end_ns, token, flags
    args: dict[int, dict[str, Any]]  # row in ``names``/``times`` -> args
    marks: list[tuple[str, int, str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class RawRecording:
    """Everything a session hands the resolver."""

    header: dict[str, Any]
    threads: list[RawThread]
    queues: list[QueueInfo] = field(default_factory=list)
    spans: SpanBatch = field(default_factory=SpanBatch)
    samples: list[CalibrationSample] = field(default_factory=list)
    untimed: set[int] = field(default_factory=set)
    degraded: dict[int, str] = field(default_factory=dict)
    spans_cover_children: bool = False
    empty_span_ns: int = 0  # a GPU span this short or shorter holds no work (backend's floor)
    # the source's own error in its GPU times (CUPTI's GPU-to-CPU normalisation), added to theirs
    source_error_ns: int = 0
    blind: list[Blind] = field(default_factory=list)
    # a source observed every scope (CUPTI): timed without a token, empty when nothing launched
    ops_timing: bool = False
    # why GPU times may be missing: a timed scope without a span is then degraded, not empty
    problem: str = ""
    batches: list[OpBatch] = field(default_factory=list)  # operations as columns (bulk sources)

    def add(self, got: Collected) -> None:
        """Take what one ``collect()`` returned: spans, untimed and degraded tokens, operations."""
        self.spans = SpanBatch.concat([self.spans, got.spans])
        self.untimed |= got.untimed
        self.degraded.update(got.degraded)
        self.batches.extend(b for b in got.batches if len(b))
        self.blind.extend(got.blind)
        self.ops_timing |= got.ops_timing
