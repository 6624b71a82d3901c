"""The trace model: one plain, columnar data model shared by every stage after the resolver.

Times are integer nanoseconds on the session clock, GPU times aligned onto it by the resolver; a
missing time is ``NO_TIME``. Scopes are numpy columns (a million cost a few tens of MB and summarise
vectorised); ``Trace.scope(i)`` is a row view.

>>> import gputrace
>>> with gputrace.session(backend="cpu") as s:
...     with gputrace.trace("step", n=3):
...         pass
>>> t = s.trace
>>> t.scope(0).name, t.scope(0).args
('step', {'n': 3})
"""

from __future__ import annotations

import enum
import functools
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from gputrace.npstats import ended_before

NO_TIME = int(np.iinfo(np.int64).min)
FORMAT_VERSION = 2  # 2: every field on every slice (no lean variant)

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
U32 = npt.NDArray[np.uint32]


class Flag(enum.IntFlag):
    """Per-scope flags. A flagged value always stays as measured: flags explain, they never clamp."""

    COLD = 1 << 0  # first call of this name in the session: pays compilation/autotuning/context
    EMPTY = 1 << 1  # GPU span of zero length or with no GPU work: nothing was launched or flushed
    GPU_EXCEEDS_WALL = 1 << 2  # GPU duration longer than the CPU window that bounds it: impossible
    START_BEFORE_SUBMIT = 1 << 3  # GPU start earlier than its submission, beyond the uncertainty
    OVERLAP = 1 << 4  # partially overlaps another span on the same in-order queue
    OUTLIER = 1 << 5  # far from the other calls of its name (robust rule, see resolver)
    ERROR = 1 << 6  # the user's code raised inside the scope; args["exception"] names the type
    DEGRADED = 1 << 7  # gputrace itself failed while recording this scope; times may be partial
    UNTIMED = 1 << 8  # the backend could not time this scope on the GPU (no timestamp support)


# Each flag's name in files and reports, in bit order: its member's name in lower case but two.
FLAG_NAMES: dict[Flag, str] = {f: str(f.name).lower() for f in Flag} | {
    Flag.EMPTY: "empty_gpu_span",
    Flag.ERROR: "exception",
}
FLAG_BY_NAME = {v: k for k, v in FLAG_NAMES.items()}

# Flags that report a suspicious measurement (as opposed to a state such as "cold" or "untimed").
ANOMALY_FLAGS = (
    Flag.EMPTY
    | Flag.GPU_EXCEEDS_WALL
    | Flag.START_BEFORE_SUBMIT
    | Flag.OVERLAP
    | Flag.OUTLIER
    | Flag.DEGRADED
)


_FLAG_BITS = tuple((int(bit), name) for bit, name in FLAG_NAMES.items())
_ALL_FLAGS = sum(bit for bit, _ in _FLAG_BITS)


def flag_names(flags: int) -> list[str]:
    """The names of the flags set in ``flags``, in a stable order. Plain integers, each answer kept
    (enum arithmetic costs microseconds a call, and exporters ask once per scope)."""
    return list(_names_of(int(flags) & _ALL_FLAGS))


@functools.cache
def _names_of(key: int) -> tuple[str, ...]:
    return tuple(name for bit, name in _FLAG_BITS if key & bit)


def flags_from_names(names: list[str]) -> int:
    return sum({int(FLAG_BY_NAME[name]) for name in names})  # each bit once, as | would set it


@dataclass(frozen=True)
class ThreadInfo:
    """A CPU thread of the traced process; ``tid`` is the OS thread id shown in Perfetto."""

    tid: int
    name: str


@dataclass(frozen=True)
class QueueInfo:
    """One GPU queue: a CUDA stream or a WebGPU queue, on one device."""

    device: int
    device_name: str
    backend: str
    label: str  # e.g. "stream 0x7f…" or "queue"


@dataclass(frozen=True)
class ClockFit:
    """Maps a GPU clock onto the session clock: ``cpu = cpu_ref + slope * (gpu - gpu_ref)``.
    ``uncertainty_ns`` bounds the error between the first and last calibration sample (beyond,
    ``gputrace.resolver.uncertainty_at`` adds an extrapolation term)."""

    gpu_ref_ns: int
    cpu_ref_ns: int
    slope: float
    residual_ns: float  # largest |residual| of a sample midpoint against the fit
    uncertainty_ns: float
    samples: int
    first_cpu_ns: int
    last_cpu_ns: int
    method: str = "offset+slope"
    bound: str = "residual+window"  # how uncertainty_ns was bounded (see gputrace.clockbound)
    note: str = ""  # why the fit is weak (too few samples, or from one stretch), or ""

    @property
    def offset_ns(self) -> int:
        return self.cpu_ref_ns - self.gpu_ref_ns

    @property
    def drift_ppm(self) -> float:
        return (self.slope - 1.0) * 1e6

    def to_cpu(self, gpu_ns: I64) -> I64:
        delta = (gpu_ns - self.gpu_ref_ns).astype(np.float64) * self.slope
        return (self.cpu_ref_ns + np.rint(delta).astype(np.int64)).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        """The fit as the header writes it (the derived offset and drift too; the note if any)."""
        return {k: getattr(self, k) for k in _FIT_KEYS} | ({"note": self.note} if self.note else {})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClockFit:
        """The fit ``to_dict`` wrote (fields with a default may be missing)."""
        cast = {"int": int, "float": float, "str": str}
        given = [f for f in fields(cls) if f.name in d or f.default is MISSING]
        return cls(**{f.name: cast[str(f.type)](d[f.name]) for f in given})


_FIT_KEYS = ("method", "gpu_ref_ns", "cpu_ref_ns", "offset_ns", "slope", "drift_ppm", "residual_ns",
             "uncertainty_ns", "samples", "first_cpu_ns", "last_cpu_ns", "bound")  # fmt: skip


@dataclass(frozen=True)
class Mark:
    """An instant on a CPU thread: ``gputrace.mark()`` (kind "mark") or a sync (kind "sync")."""

    name: str
    ts_ns: int
    thread: int  # index into Trace.threads
    kind: str = "mark"
    args: Mapping[str, Any] = field(default_factory=dict)


_DTYPES = {"I32": np.int32, "I64": np.int64, "U32": np.uint32}
_WIDE = ("grid", "block")  # (n, 3) columns


def _columns(cls: type, n: int, **fill: int) -> dict[str, Any]:
    """Every numpy column of table ``cls`` for ``n`` rows: 0, or the value ``fill`` gives it."""
    return {
        f.name: np.full((n, 3) if f.name in _WIDE else n, fill.get(f.name, 0), _DTYPES[str(f.type)])
        for f in fields(cls)
        if str(f.type) in _DTYPES
    }


@dataclass
class ScopeTable:
    """Columns of the scopes, one row per scope, ordered by (cpu_start_ns, thread, -cpu_end_ns)."""

    name: I32
    thread: I32
    parent: I64  # row of the enclosing scope on the same thread, or -1
    depth: I32
    cpu_start_ns: I64  # CPU enqueue window: entering the scope ...
    cpu_end_ns: I64  # ... to leaving it
    submit_ns: I64  # CPU time the scope's GPU work was submitted (NO_TIME without GPU work)
    gpu_start_ns: I64  # aligned GPU execution start on the session clock (NO_TIME if untimed)
    gpu_end_ns: I64
    queue: I32  # index into Trace.queues, or -1
    flags: U32
    uncertainty_ns: I64  # alignment uncertainty of gpu_start/gpu_end (0 without GPU times)
    args: dict[int, dict[str, Any]] = field(default_factory=dict)  # sparse: row -> user args

    COLUMNS: ClassVar[tuple[str, ...]]  # every field but ``args`` (set below the class)

    def __len__(self) -> int:
        return len(self.name)

    @classmethod
    def empty(cls, n: int = 0) -> ScopeTable:
        return cls(**_columns(cls, n, parent=-1, submit_ns=NO_TIME, gpu_start_ns=NO_TIME,
                              gpu_end_ns=NO_TIME, queue=-1))  # fmt: skip

    def has_gpu(self) -> npt.NDArray[np.bool_]:
        return np.asarray(self.gpu_start_ns != NO_TIME, dtype=np.bool_)


@dataclass
class SpanTable:
    """GPU spans below scope level: one row per timed pass (wgpu) or event pair (cuda)."""

    scope: I64
    label: I32  # index into Trace.names
    queue: I32
    submit_ns: I64
    gpu_start_ns: I64
    gpu_end_ns: I64

    def __len__(self) -> int:
        return len(self.scope)

    @classmethod
    def empty(cls, n: int = 0) -> SpanTable:
        return cls(**_columns(cls, n, submit_ns=NO_TIME))


@dataclass
class OpTable:
    """GPU operations (kernels, memcpys, memsets) where a timing source sees them (CUPTI), one row
    each in GPU start order. ``scope``: the innermost scope open on the launching thread when the
    launch call started (−1: none). ``call_*``: the launch call (``NO_TIME`` when not seen)."""

    scope: I64
    kind: I32  # 0 kernel, 1 memcpy, 2 memset (gputrace.records.OP_KINDS)
    name: I32  # index into Trace.names
    queue: I32  # index into Trace.queues
    thread: I32  # index into Trace.threads of the launching thread, or -1
    correlation: I64
    call_start_ns: I64
    call_end_ns: I64
    gpu_start_ns: I64
    gpu_end_ns: I64
    bytes: I64
    grid: I64  # shape (n, 3)
    block: I64  # shape (n, 3)
    graph_id: I64
    graph_node_id: I64
    call_name: I32  # index into Trace.names ("" when unknown)

    COLUMNS: ClassVar[tuple[str, ...]]  # every field (set below the class)

    def __len__(self) -> int:
        return len(self.scope)

    @classmethod
    def empty(cls, n: int = 0) -> OpTable:
        return cls(**_columns(cls, n, scope=-1, thread=-1, call_start_ns=NO_TIME, call_end_ns=NO_TIME))

    def take(self, rows: npt.NDArray[np.int64]) -> OpTable:
        return OpTable(*(getattr(self, c)[rows] for c in self.COLUMNS))


ScopeTable.COLUMNS = tuple(f.name for f in fields(ScopeTable) if f.name != "args")
OpTable.COLUMNS = tuple(f.name for f in fields(OpTable))


@dataclass(frozen=True)
class Scope:
    """One scope as a row object (a convenience view over ``ScopeTable``)."""

    index: int
    name: str
    thread: ThreadInfo
    parent: int
    depth: int
    cpu_start_ns: int
    cpu_end_ns: int
    submit_ns: int | None
    gpu_start_ns: int | None
    gpu_end_ns: int | None
    queue: QueueInfo | None
    flags: int
    uncertainty_ns: int
    args: Mapping[str, Any]

    @property
    def cpu_ns(self) -> int:
        return self.cpu_end_ns - self.cpu_start_ns

    @property
    def gpu_ns(self) -> int | None:
        if self.gpu_start_ns is None or self.gpu_end_ns is None:
            return None
        return self.gpu_end_ns - self.gpu_start_ns

    @property
    def queue_gap_ns(self) -> int | None:
        """Submission → GPU start: how long the work waited in the queue."""
        if self.gpu_start_ns is None or self.submit_ns is None:
            return None
        return self.gpu_start_ns - self.submit_ns

    @property
    def flag_names(self) -> list[str]:
        return flag_names(self.flags)


@dataclass
class Trace:
    """A resolved recording. ``header`` is the trace file's ``gputrace`` object (JSON-ready)."""

    header: dict[str, Any]
    names: list[str]
    threads: list[ThreadInfo]
    queues: list[QueueInfo]
    scopes: ScopeTable
    spans: SpanTable
    marks: list[Mark]
    clock_fits: dict[int, ClockFit]  # device index -> fit
    ops: OpTable = field(default_factory=OpTable.empty)  # per-operation records (CUPTI timing)

    def __len__(self) -> int:
        return len(self.scopes)

    @property
    def base_ns(self) -> int:
        """Session start on the session clock; exported times are relative to it."""
        return int(self.header["base_ns"])

    def scope(self, i: int) -> Scope:
        s, i = self.scopes, int(i)
        q = int(s.queue[i])
        times = [int(c[i]) for c in (s.submit_ns, s.gpu_start_ns, s.gpu_end_ns)]
        submit, g0, g1 = (None if t == NO_TIME else t for t in times)
        return Scope(
            index=i,
            name=self.names[int(s.name[i])],
            thread=self.threads[int(s.thread[i])],
            parent=int(s.parent[i]),
            depth=int(s.depth[i]),
            cpu_start_ns=int(s.cpu_start_ns[i]),
            cpu_end_ns=int(s.cpu_end_ns[i]),
            submit_ns=submit,
            gpu_start_ns=g0,
            gpu_end_ns=g1,
            queue=self.queues[q] if q >= 0 else None,
            flags=int(s.flags[i]),
            uncertainty_ns=int(s.uncertainty_ns[i]),
            args=s.args.get(i, {}),
        )

    def __iter__(self) -> Iterator[Scope]:
        return (self.scope(i) for i in range(len(self.scopes)))

    def find(self, name: str) -> list[Scope]:
        """All scopes called ``name``, in start order."""
        try:
            idx = self.names.index(name)
        except ValueError:
            return []
        return [self.scope(int(i)) for i in np.flatnonzero(self.scopes.name == idx)]

    @property
    def anomalies(self) -> list[dict[str, Any]]:
        return list(self.header.get("anomalies", {}).get("items", []))

    def busy_ns(self) -> I64:
        """Per scope, its GPU busy time (``gputrace.figures.busy_ns``): below its span where the GPU
        waited for launches between its operations."""
        from gputrace.figures import busy_ns  # the figures build on this model

        return busy_ns(self)


class FileTrace(Trace):
    """A trace read from its file when first used, not when made: a streamed session's ``stop()``
    then never waits for a read-back it may not need (20 µs a scope), nor holds a long run's."""

    def __init__(self, *args: Any, read: Callable[[], Trace] | None = None, **fields: Any) -> None:
        if read is None:  # (``dataclasses.replace`` of a read one)
            super().__init__(*args, **fields)
        else:
            self.__dict__["_read"] = read

    @property
    def unread(self) -> bool:
        """Whether the file has not been read yet."""
        return "_read" in self.__dict__

    def __getattr__(self, name: str) -> Any:  # only for what is not there yet: the fields
        read = None if name.startswith("__") else self.__dict__.pop("_read", None)
        if read is None:
            raise AttributeError(name)
        self.__dict__.update(vars(read()))
        return getattr(self, name)


_SIBLING_ROUNDS = 8


def nest(s: ScopeTable) -> None:
    """Parent and depth per scope: the parent is the latest earlier scope of its thread still
    running when it starts (``_nest_walk``). Most scopes are settled vectorised: every earlier
    scope of the thread has ended (no parent), or the one just before is still running (the
    parent), or a few rounds of siblings; only the rest needs the walk."""
    n = len(s)
    if not n:
        s.parent, s.depth = np.zeros(0, np.int64), np.zeros(0, np.int32)
        return
    thr = s.thread
    order = None if bool(np.all(thr == thr[0])) else np.argsort(thr, kind="stable")
    st, en = (a if order is None else a[order] for a in (s.cpu_start_ns, s.cpu_end_ns))
    ts = thr if order is None else thr[order]
    firsts = np.flatnonzero(np.diff(ts, prepend=ts[0] - 1) != 0).tolist()  # each thread's first row
    before = ended_before(en, firsts, NO_TIME)  # the latest end among the thread's earlier scopes
    same_prev = ts[1:] == ts[:-1]
    if bool(np.any(same_prev & (st[1:] < st[:-1]))):  # not in start order: walk
        _nest_walk(s)
        return
    child = np.zeros(n, bool)
    child[1:] = same_prev & (en[:-1] > st[1:])
    par = np.where(child, np.arange(n, dtype=np.int64) - 1, -1)
    known = child | (before <= st)
    # A scope after an ended sibling: the parent of the scope before it, if still running (one
    # round per sibling; long runs of siblings, or deeper cases, take the walk).
    for _ in range(_SIBLING_ROUNDS):
        left = np.flatnonzero(~known)
        if not len(left):
            break
        prev = left - 1
        up = par[prev]
        ok = known[prev] & (up >= 0)
        ok[ok] = en[up[ok]] > st[left[ok]]
        if not ok.any():
            break
        par[left[ok]] = up[ok]
        known[left[ok]] = True
    if not bool(np.all(known)):
        _nest_walk(s)
        return
    parent = par
    if order is not None:  # back from the order by thread
        parent = np.full(n, -1, np.int64)
        parent[order[par >= 0]] = order[par[par >= 0]]
    s.parent = parent
    s.depth = ancestors(parent).astype(np.int32)


def ancestors(parent: I64) -> I64:
    """How many ancestors each row has (its depth), by pointer doubling over ``parent``."""
    anc = parent.copy()
    dist: I64 = (anc >= 0).astype(np.int64)
    live = np.flatnonzero(anc >= 0)
    while len(live):
        up = anc[live]
        dist[live] += dist[up]
        anc[live] = anc[up]
        live = live[anc[live] >= 0]
    return dist


def _nest_walk(s: ScopeTable) -> None:
    starts, ends, thr = s.cpu_start_ns.tolist(), s.cpu_end_ns.tolist(), s.thread.tolist()
    parent, depth = [-1] * len(starts), [0] * len(starts)
    stacks: dict[int, list[int]] = defaultdict(list)
    for i, (st, t) in enumerate(zip(starts, thr, strict=True)):
        stack = stacks[t]
        while stack and ends[stack[-1]] <= st:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            depth[i] = len(stack)
        stack.append(i)
    s.parent = np.array(parent, np.int64)
    s.depth = np.array(depth, np.int32)


def canonical_names(
    names: list[str], scopes: ScopeTable, spans: SpanTable, ops: OpTable | None = None
) -> list[str]:
    """Renumber names by first appearance (scope rows, span rows, then operation rows) so equal
    traces compare equal whichever way they were built. Rewrites the name columns in place."""
    ops = OpTable.empty() if ops is None else ops
    columns = ((scopes, "name"), (spans, "label"), (ops, "name"), (ops, "call_name"))
    ids = np.concatenate([getattr(table, c) for table, c in columns]).astype(np.int64)
    if not len(ids):
        return []
    uniq, first = np.unique(ids, return_index=True)
    order = uniq[np.argsort(first, kind="stable")]
    remap = np.full(len(names), -1, np.int64)
    remap[order] = np.arange(len(order))
    for table, c in columns:
        setattr(table, c, remap[getattr(table, c)].astype(np.int32))
    return [names[i] for i in order.tolist()]
