"""A scripted activity source: CUPTI's records, made up exactly, so the CUPTI path is tested in CI.

Code under test calls ``launch`` (or ``launch_graph``) where it would launch GPU work; the source
records the launch call on the calling thread at the current time and schedules the operation on
its stream (after the stream's previous work and ``latency_ns``). Records are delivered at the
next ``drain``, as CUPTI delivers them at a flush: written as CUPTI 13's record bytes
(``gputrace.backends.cupti_records`` layouts) into one buffer per drain and decoded by the same
bulk decoder as libcupti's buffers, so the whole CUPTI path below the C library is under test.
``cut_next_buffer(n)`` drops the last ``n`` bytes of the next buffer (a short buffer).
``unfinished_at_drain`` makes a drain hand the operations still running over with zero
timestamps, as CUPTI's forced flush does (off by default: a drain then sees finished work).
``take_over()`` plays another CUPTI client
(torch.profiler) taking the callbacks: records are lost until ``release()``. ``lose_ops`` plays
the other way records go missing: API calls keep arriving, their GPU operations do not (Kineto
tearing activity tracing down under a session, full buffers).

>>> import gputrace
>>> from gputrace.clock import FakeClock
>>> from gputrace.backends.cupti import CuptiBackend
>>> clock = FakeClock(0, 1_000)
>>> src = FakeActivitySource(clock)
>>> with gputrace.session(backend=CuptiBackend(clock, source=src), clock=clock, quiet=True) as s:
...     with gputrace.trace("step"):
...         _ = src.launch("k", gpu_ns=500)
>>> [(s.trace.names[int(n)], int(e - b)) for n, b, e in zip(s.trace.ops.name, s.trace.ops.gpu_start_ns,
...                                                        s.trace.ops.gpu_end_ns)]
[('k', 500)]
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from gputrace.backends import cupti_records as cr
from gputrace.backends.base import Clock
from gputrace.errors import report_internal
from gputrace.records import OP_KERNEL, OP_MEMCPY

# (kind, name, device, stream_id, correlation, gpu_start, gpu_end, bytes,
#   grid_x, grid_y, grid_z, block_x, block_y, block_z, graph_id, graph_node_id)
OpTuple = tuple[int, str, int, int, int, int, int, int, int, int, int, int, int, int, int, int]
# (correlation, tid, start, end, domain, cbid); domain 0 driver, 1 runtime
CallTuple = tuple[int, int, int, int, int, int]

# CUPTI's clock is CLOCK_REALTIME: a long way from the session clock's zero.
REALTIME_OFFSET_NS = 1_764_000_000_000_000_000
_SYNC_CBID = 1
_LAUNCH_CBID = 2
_GRAPH_CBID = 3


class FakeActivitySource:
    """See the module docstring. ``drop_every``: drop every n-th record, counted as dropped."""

    name = "fake"

    def __init__(
        self,
        clock: Clock,
        *,
        offset_ns: int = REALTIME_OFFSET_NS,
        latency_ns: int = 3_000,
        devices: Sequence[int] = (0,),
        pthread_ids: bool = True,
        ticks_per_ns: float = 1.0,
    ) -> None:
        self.clock = clock
        # CUPTI counts ns unless another tool registered its own timestamp source (Kineto: TSC)
        self.rate = ticks_per_ns
        self.offset_ns = offset_ns
        self.latency_ns = latency_ns
        # CUPTI's default thread ids are pthread_self() (threading.get_ident()); a tool may
        # switch the process to OS ids (threading.get_native_id())
        self.pthread_ids = pthread_ids
        self._devices = {d: f"Fake GPU {d}" for d in devices}
        self._lock = threading.Lock()
        self._ops: list[OpTuple] = []
        self._calls: list[CallTuple] = []
        self._stream_free: dict[tuple[int, int], int] = {}
        self._corr = 0
        self.taken = False
        self.lose_ops = False  # calls still arrive, their operations do not
        self.other: str | None = None  # what other_client_active() answers
        self.started = 0
        self.lost = 0
        self.names = cr.NameTable()
        self.decoder = cr.BufferDecoder()
        self._name_bufs: dict[str, Any] = {}  # C strings the kernel records point at
        self._cut = 0
        self.problem = ""
        self.unfinished_at_drain = False  # see the module docstring

    def timestamp(self) -> int:
        return round(self.clock() * self.rate) + self.offset_ns

    def _tid(self) -> int:
        """This thread as CUPTI names it: 32 bits of pthread_self(), or its OS id."""
        return threading.get_ident() & 0xFFFFFFFF if self.pthread_ids else threading.get_native_id()

    def _next_corr(self) -> int:
        with self._lock:
            self._corr += 1
            return self._corr

    def _record(self, ops: list[OpTuple], call: CallTuple) -> None:
        with self._lock:
            if self.taken:
                self.lost += len(ops) + 1
                return
            if self.lose_ops:
                self.lost += len(ops)
                ops = []
            self._ops.extend(ops)
            self._calls.append(call)

    def launch(
        self,
        name: str,
        *,
        gpu_ns: int = 1_000,
        stream: int = 7,
        device: int = 0,
        kind: int = OP_KERNEL,
        nbytes: int = 0,
        grid: tuple[int, int, int] = (1, 1, 1),
        block: tuple[int, int, int] = (256, 1, 1),
    ) -> int:
        """Record one launch call on this thread and its operation; returns the correlation id."""
        corr = self._next_corr()
        c0 = self.timestamp()
        c1 = self.timestamp()
        ticks = round(gpu_ns * self.rate)
        g0 = self._place(device, stream, c0, ticks)
        if kind != OP_KERNEL:
            grid, block = (0, 0, 0), (0, 0, 0)
        op: OpTuple = (kind, name, device, stream, corr, g0, g0 + ticks, nbytes, *grid, *block, 0, 0)
        self._record([op], (corr, self._tid(), c0, c1, 0, _LAUNCH_CBID))
        return corr

    def launch_graph(self, graph_id: int, kernels: Sequence[tuple[str, int]], *, stream: int = 7,
                     device: int = 0) -> int:  # fmt: skip
        """One graph launch call replaying ``kernels`` [(name, gpu_ns)], in order, on ``stream``."""
        corr = self._next_corr()
        c0 = self.timestamp()
        c1 = self.timestamp()
        ops: list[OpTuple] = []
        for node, (name, gpu_ns) in enumerate(kernels, start=1):
            ns = round(gpu_ns * self.rate)
            g0 = self._place(device, stream, c0, ns)
            ops.append(
                (OP_KERNEL, name, device, stream, corr, g0, g0 + ns, 0, 1, 1, 1, 32, 1, 1, graph_id, node)
            )
        self._record(ops, (corr, self._tid(), c0, c1, 0, _GRAPH_CBID))
        return corr

    def _place(self, device: int, stream: int, call_ns: int, gpu_ns: int) -> int:
        with self._lock:
            free = self._stream_free.get((device, stream), 0)
            g0 = max(free, call_ns + round(self.latency_ns * self.rate))
            self._stream_free[(device, stream)] = g0 + gpu_ns
        return g0

    def take_over(self, why: str | None = None) -> None:
        """Another client takes CUPTI: records are lost until ``release``; ``why`` is what
        ``other_client_active`` answers meanwhile (None: the tool is not detectable)."""
        self.taken = True
        self.other = why

    def release(self) -> None:
        self.other = None

    # the source contract ------------------------------------------------------------------------
    def start(self) -> None:
        self.started += 1
        self.taken = False

    def reclaim(self) -> None:
        self.start()

    def sync(self) -> tuple[int, int, int]:
        t0 = self.timestamp()
        corr = self._next_corr()
        self._record([], (corr, self._tid(), self.timestamp(), self.timestamp(), 0, _SYNC_CBID))
        t1 = self.timestamp()
        return threading.get_native_id(), t0, t1

    def cut_next_buffer(self, nbytes: int) -> None:
        """The next drained buffer loses its last ``nbytes`` bytes (a short buffer)."""
        self._cut = int(nbytes)

    def waiting_bytes(self) -> int:
        """What the records waiting would take in CUPTI's buffers."""
        return len(self._ops) * cr.KERNEL.itemsize + len(self._calls) * cr.API.itemsize

    def drain(self) -> tuple[np.ndarray, np.ndarray]:
        now = self.timestamp()
        with self._lock:
            ops, self._ops = self._ops, []
            calls, self._calls = self._calls, []
        if self.unfinished_at_drain:  # as a forced flush hands over work still running
            ops = [o if o[6] <= now else (*o[:5], 0, 0, *o[7:]) for o in ops]  # type: ignore[misc]
        buf = self.encode(ops, calls)
        if self._cut:
            buf, self._cut = buf[: max(len(buf) - self._cut, 0)], 0
        got = self.decoder.decode(buf)
        if got.problem:
            self.problem = self.problem or got.problem
            report_internal("cupti:decode", f"a CUPTI buffer could not be read whole: {got.problem}.")
        return cr.columns([got], self.names, lambda p: ctypes.string_at(p).decode())

    def _name_ptr(self, name: str) -> int:
        b = self._name_bufs.get(name)
        if b is None:
            b = self._name_bufs[name] = ctypes.create_string_buffer(name.encode())
        return ctypes.addressof(b)

    def encode(self, ops: list[OpTuple], calls: list[CallTuple]) -> np.ndarray:
        """The records as CUPTI writes them into an activity buffer: each launch call followed by
        the operations it launched (in correlation order). Built in bulk: the fake plays CUPTI's
        C side, whose cost is no part of what benchmarks over it measure."""
        groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (records, correlation, order key)
        if calls:
            c = np.array(calls, np.int64).reshape(-1, 6)
            r = np.zeros(len(c), cr.API)
            r["kind"] = np.where(c[:, 4] == 1, cr.KIND_RUNTIME, cr.KIND_DRIVER)
            r["cbid"], r["start"], r["end"], r["threadId"], r["correlationId"] = (
                c[:, 5],
                c[:, 2],
                c[:, 3],
                c[:, 1],
                c[:, 0],
            )
            groups.append((r, c[:, 0], np.zeros(len(c), np.int64)))
        if ops:
            kinds = np.array([o[0] for o in ops], np.int64)
            num = np.array([o[2:] for o in ops], np.int64).reshape(-1, 14)  # device ... graph_node_id
            for kind, dtype, ck in ((OP_KERNEL, cr.KERNEL, cr.KIND_CONCURRENT_KERNEL),
                                    (OP_MEMCPY, cr.MEMCPY, cr.KIND_MEMCPY),
                                    (2, cr.MEMSET, cr.KIND_MEMSET)):  # fmt: skip
                sel = np.flatnonzero(kinds == kind)
                if not len(sel):
                    continue
                v = num[sel]
                r = np.zeros(len(sel), dtype)
                r["kind"] = ck
                r["start"], r["end"], r["deviceId"], r["streamId"], r["correlationId"] = (
                    v[:, 3],
                    v[:, 4],
                    v[:, 0],
                    v[:, 1],
                    v[:, 2],
                )
                r["graphId"], r["graphNodeId"] = v[:, 12], v[:, 13]
                if kind == OP_KERNEL:
                    r["name"] = [self._name_ptr(ops[i][1]) for i in sel.tolist()]
                    for j, f in enumerate(("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ")):
                        r[f] = v[:, 6 + j]
                else:
                    r["bytes"] = v[:, 5]
                    if kind == OP_MEMCPY:
                        by_name = {n: k for k, n in cr.MEMCPY_NAMES.items()}
                        r["copyKind"] = [by_name.get(ops[i][1], 0) for i in sel.tolist()]
                groups.append((r, v[:, 2], np.ones(len(sel), np.int64)))
        if not groups:
            return np.zeros(0, np.uint8)
        corr = np.concatenate([g[1] for g in groups])
        key = np.concatenate([g[2] for g in groups])
        size = np.concatenate([np.full(len(g[0]), g[0].dtype.itemsize, np.int64) for g in groups])
        order = np.lexsort((key, corr))
        at = np.empty(len(order), np.int64)
        at[order] = np.concatenate([[0], np.cumsum(size[order])[:-1]])
        out = np.zeros(int(size.sum()), np.uint8)
        lo = 0
        for r, _, _ in groups:
            n, w = len(r), r.dtype.itemsize
            out[(at[lo : lo + n, None] + np.arange(w)).reshape(-1)] = r.view(np.uint8).reshape(-1)
            lo += n
        return out

    def call_name(self, domain: int, cbid: int) -> str:
        return {
            _SYNC_CBID: "cuCtxSynchronize",
            _LAUNCH_CBID: "cuLaunchKernel",
            _GRAPH_CBID: "cuGraphLaunch",
        }.get(cbid, f"driver api {cbid}")

    def dropped(self) -> int:
        return 0

    def other_client_active(self) -> str | None:
        return self.other

    def devices(self) -> dict[int, str]:
        return dict(self._devices)

    def stop(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"timing_source": self.name}
