"""Timing every pass of a wgpu device without query bookkeeping in the user's code.

``instrument(device)`` swaps the classes of the device and its queue for subclasses (the objects
stay the same, ``isinstance`` still holds, nothing changes while no session traces them): inside a
scope, passes get ``timestamp_writes`` from pooled query pages, ``encoder.finish()`` resolves
exactly the slots that encoder wrote (resolving an unwritten slot hangs NVIDIA's queue), and
``queue.submit()`` notes the passes' ``submit_ns``. Full pages are read back at a later submit, the
rest at the next sync or at stop (docs/webgpu.md).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gputrace.backends.base import CalibrationSample, Clock, RawSpan
from gputrace.backends.wgpu_queries import (
    QueryPage,
    WorkDone,
    abandon,
    mapped_ready,
    settle_parked,
    ticks_to_ns,
    wait_mapped,
)
from gputrace.errors import report_internal
from gputrace.recorder import innermost_token

_FAILED = -1  # submit_ns of a pass whose submit raised


@dataclass(slots=True, eq=False)
class PassRecord:
    """One timed pass: its scope's token, label, page and first slot (begin; end is slot + 1)."""

    token: int
    label: str
    page: QueryPage
    slot: int
    submit_ns: int | None = None


class DeviceTracer:
    """One traced device within one session: query pages, slot hand-out, finished passes."""

    def __init__(self, device: Any, index: int, backend: Any, timed: bool, period: float) -> None:
        self.device = device
        self.index = index
        self.clock: Clock = backend.clock
        self.pass_counts: dict[int, int] = backend.pass_counts  # token -> passes so far
        self.untimed: set[int] = backend.untimed  # tokens with passes the GPU could not time
        self.timed = timed
        self.period = period
        self.timeout_s: float = backend.timeout_s
        self.page_queries: int = backend.page_queries
        self.work_done = WorkDone(device, self.clock, self.timeout_s)
        self.lock = threading.Lock()
        self.page: QueryPage | None = None
        self.free: list[QueryPage] = []
        self.pinned: list[QueryPage] = []  # closed, some slot holders not submitted yet
        self.mapping: deque[QueryPage] = deque()  # closed, all submitted, read-back mapping
        self.spans: list[RawSpan] = []
        self.degraded: dict[int, str] = {}
        self.closed = False
        self.passes = 0
        self.outside = 0  # passes begun outside every scope (never timed)
        self.pages_made = 0
        self.calibration_page: QueryPage | None = None  # two slots, made at the first sample
        if timed:
            # Pages outlive sessions (kept on the device), and the first one is made now, at
            # session start: making a query set can take milliseconds, not for the user's loop.
            self.free = [p for p in device.__dict__.pop("_gputrace_pool", []) if p.count == self.page_queries]
            self.page = self.free.pop() if self.free else self._new_page()

    # hot path: called from the traced encoder and queue ---------------------------------------
    def writes(self, encoder: Any, label: str, kind: str) -> dict[str, Any] | None:
        """``timestamp_writes`` for a pass the user is beginning, or None to leave it untimed."""
        token = innermost_token()
        if not token:
            self.outside += 1  # counted, so "nothing was timed" can say why
        if not token or self.closed:
            return None
        n = self.pass_counts[token] = self.pass_counts.get(token, 0) + 1
        if not self.timed:
            self.untimed.add(token)
            return None
        recs = encoder._gputrace_records
        if not recs:
            recs = encoder._gputrace_records = []
        with self.lock:
            page = self.page
            if page is None or page.used + 2 > page.count:
                page = self._open_page()
            slot = page.used
            page.used = slot + 2
            if not recs or recs[-1].page is not page:
                page.unsubmitted += 1
            rec = PassRecord(token, label or f"{kind} pass #{n}", page, slot)
            page.records.append(rec)
            self.passes += 1
        recs.append(rec)
        return page.writes(slot)

    def forget_last(self, encoder: Any) -> None:
        """The pass ``writes`` just gave slots was never begun: never resolve its unwritten slots."""
        recs = encoder._gputrace_records
        with self.lock:
            rec = recs.pop()
            rec.page.records.remove(rec)
            self.passes -= 1
            if not recs or recs[-1].page is not rec.page:
                self._page_submitted(rec.page)  # the encoder holds no slot of it any more

    def resolve(self, encoder: Any, recs: Sequence[PassRecord]) -> None:
        """Resolve the slots ``recs`` wrote, run by contiguous run, into their pages' read-back."""
        i = 0
        while i < len(recs):
            page, first = recs[i].page, recs[i].slot
            j = i + 1
            while j < len(recs) and recs[j].page is page and recs[j].slot == recs[j - 1].slot + 2:
                j += 1
            n = 2 * (j - i)
            encoder.resolve_query_set(page.query_set, first, n, page.resolve_buf, 0)
            encoder.copy_buffer_to_buffer(page.resolve_buf, 0, page.readback, first * 8, n * 8)
            i = j

    def submitted(self, recs: list[PassRecord], submit_ns: int, ok: bool) -> None:
        """The command buffer holding ``recs`` was submitted at ``submit_ns`` (or failed to be)."""
        if self.closed:
            return
        with self.lock:
            self._release(recs, submit_ns if ok else _FAILED)

    def settle(self, recs: list[PassRecord]) -> None:
        """``submitted`` failed for ``recs``: release their pages, so their other passes still count."""
        with contextlib.suppress(Exception), self.lock:  # the records ``submitted`` got to are done
            self._release([rec for rec in recs if rec.submit_ns is None], _FAILED)

    def _release(self, recs: list[PassRecord], submit_ns: int) -> None:
        """Give ``recs`` their submission time (a resubmitted one fails), their pages one
        submission less (under the lock)."""
        prev = None
        for rec in recs:
            rec.submit_ns = submit_ns if rec.submit_ns is None else _FAILED
            if rec.page is not prev:
                prev = rec.page
                self._page_submitted(prev)

    def _page_submitted(self, page: QueryPage) -> None:
        """One submission of ``page`` is over: a closed page with none left is read back."""
        page.unsubmitted -= 1
        if page.closed and page.unsubmitted == 0 and page in self.pinned:
            self.pinned.remove(page)
            self._start_map(page)

    def harvest_ready(self) -> None:
        """Read every page whose read-back already finished mapping; never waits."""
        while True:
            with self.lock:
                if not self.mapping or not mapped_ready(self.mapping[0].promise):
                    return
                page = self.mapping.popleft()
            self._read(page)

    def fault(self, what: str, exc: BaseException, tokens: Any = None) -> None:
        """gputrace's part of a wgpu call failed: the call goes on untraced; the scopes involved
        (default: the innermost open one) are marked degraded."""
        with contextlib.suppress(Exception):
            reason = f"{what} failed inside gputrace ({type(exc).__name__}: {exc})"
            report_internal(f"wgpu-{what}", f"{reason}; those passes are not timed, your program continues.")
            if tokens is None:
                token = innermost_token()
                tokens = [token] if token else []
            for tok in tokens:
                self.degraded.setdefault(tok, reason)

    # pages ---------------------------------------------------------------------------------
    def _open_page(self) -> QueryPage:
        """Close the current page and open a fresh one (call with the lock held)."""
        page = self.free.pop() if self.free else self._new_page()  # first: it may fail
        if self.page is not None:
            self._close(self.page)
        self.page = page
        return page

    def _new_page(self) -> QueryPage:
        self.pages_made += 1
        return QueryPage(self.device, self.page_queries)

    def _close(self, page: QueryPage) -> None:
        page.closed = True
        if page.unsubmitted == 0:
            self._start_map(page)
        else:
            self.pinned.append(page)

    def _start_map(self, page: QueryPage) -> None:
        try:
            page.start_map()
        except Exception as exc:  # its passes lose their times (called with the lock held)
            if self._give_up(page, exc):
                self.free.append(page)
            report_internal("wgpu-readback", f"reading back wgpu timestamps failed ({exc})")
            return
        self.mapping.append(page)

    def _give_up(self, page: QueryPage, exc: BaseException) -> bool:
        """``page``'s read-back failed: its passes are degraded. True if it may go back to the
        pool (reset); otherwise ``abandon`` parked it."""
        for rec in page.records:
            self.degraded.setdefault(rec.token, f"reading back its timestamps failed ({exc})")
        return abandon(page)

    def _read(self, page: QueryPage) -> None:
        """Read ``page``'s timestamps once its read-back is mapped (waiting for it, bounded)."""
        try:
            wait_mapped(page.readback, page.promise, self.timeout_s, "reading back timestamps")
            done_by = self.clock()
            ns = ticks_to_ns(page.read_ticks(), self.period)
        except BaseException as exc:
            if self._give_up(page, exc):
                with self.lock:
                    self.free.append(page)
            raise
        pairs = ns.reshape(-1, 2).tolist()  # (begin, end) per pass
        for rec in page.records:
            if rec.submit_ns is None or rec.submit_ns == _FAILED:
                self.degraded.setdefault(rec.token, "a traced pass was never submitted successfully")
                continue
            start, end = pairs[rec.slot // 2]
            if start == 0 or end == 0 or end < start:
                self.degraded.setdefault(
                    rec.token, f"the GPU returned impossible timestamps for a pass ({start}, {end})"
                )
                continue
            self.spans.append(RawSpan(rec.token, self.index, start, end, rec.submit_ns, done_by, rec.label))
        page.reset()
        with self.lock:
            self.free.append(page)

    # at sync / stop ------------------------------------------------------------------------
    def collect(self) -> tuple[list[RawSpan], dict[int, str]]:
        """Everything finished so far (call after a sync: every submitted pass is complete)."""
        with self.lock:
            if self.page is not None and self.page.used:
                self._close(self.page)
                self.page = None
            todo = list(self.mapping)
            self.mapping.clear()
        for page in todo:
            try:
                self._read(page)
            except Exception as exc:  # its scopes are marked degraded; the other pages still count
                report_internal("wgpu-readback", f"reading back wgpu timestamps failed ({exc})")
        spans, self.spans = self.spans, []
        degraded, self.degraded = self.degraded, {}
        return spans, degraded

    def calibration_sample(self) -> CalibrationSample:
        """An empty timestamped pass submitted between a clock read and the work-done callback's
        (about 100 µs apart on lavapipe; the resolver weighs the tightest windows most)."""
        if self.calibration_page is None:  # the first sample, or the last page was given up on
            self.calibration_page = QueryPage(self.device, 2)
        page = self.calibration_page
        enc = untraced(self.device).create_command_encoder(self.device, label="gputrace")
        enc.begin_compute_pass(label="gputrace calibration", timestamp_writes=page.writes(0)).end()
        enc.resolve_query_set(page.query_set, 0, 2, page.resolve_buf, 0)
        enc.copy_buffer_to_buffer(page.resolve_buf, 0, page.readback, 0, 16)
        cb = enc.finish()
        queue = self.device.queue
        submit = untraced(queue).submit
        before = self.clock()
        submit(queue, [cb])
        after = self.work_done.wait(self.work_done.request(), "a calibration pass")
        try:
            page.used = 2
            page.start_map()
            wait_mapped(page.readback, page.promise, self.timeout_s, "reading a calibration timestamp")
            gpu_ns = int(ticks_to_ns(page.read_ticks(), self.period)[0])
        except BaseException:
            # a read-back given up on must never be submitted again while mapped or pending
            # (wgpu-native aborts the process): unmapped, or parked and replaced
            if not abandon(page):
                self.calibration_page = None
            raise
        page.reset()
        return CalibrationSample(before, gpu_ns, after, self.index)

    def close(self) -> None:
        """Forget the pages. Never destroy them: a user's encoder or command buffer may still hold
        slots of one (it is resolved and submitted as usual; nobody reads it back)."""
        with self.lock:
            self.closed = True
            self.calibration_page = None
            pool = self.free
            if self.page is not None and self.page.used == 0:
                pool.append(self.page)
            if pool:
                self.device._gputrace_pool = pool  # for the next session on this device
            self.page, self.free, self.pinned = None, [], []
            left = list(self.mapping)  # read-backs still mapping (a collect that failed)
            self.mapping.clear()
        for page in left:
            abandon(page)
        settle_parked()


# The class swap ------------------------------------------------------------------------------
class _TracedDevice:
    _gputrace_tracer: DeviceTracer | None = None
    _gputrace_base: Any

    def create_command_encoder(self, *, label: str = "") -> Any:
        enc = self._gputrace_base.create_command_encoder(self, label=label)
        tracer = self._gputrace_tracer
        if tracer is not None:
            try:
                enc.__class__ = traced_class(type(enc), _TracedEncoder)
                enc._gputrace_tracer = tracer
            except Exception as exc:
                tracer.fault("tracing an encoder", exc)
        return enc


class _TracedEncoder:
    _gputrace_tracer: DeviceTracer | None = None
    _gputrace_records: Sequence[PassRecord] = ()
    _gputrace_base: Any

    def begin_compute_pass(self, **kw: Any) -> Any:
        return self._traced_pass("compute", kw)

    def begin_render_pass(self, **kw: Any) -> Any:
        return self._traced_pass("render", kw)

    def _traced_pass(self, kind: str, kw: dict[str, Any]) -> Any:
        """The user's ``begin_{kind}_pass``, given gputrace's ``timestamp_writes`` inside a scope
        (unless the user passed their own)."""
        begin = getattr(self._gputrace_base, f"begin_{kind}_pass")
        tracer = self._gputrace_tracer
        ours = None
        if kw.get("timestamp_writes") is None and tracer is not None:
            try:
                kw["timestamp_writes"] = ours = tracer.writes(self, kw.get("label", ""), kind)
            except Exception as exc:
                tracer.fault("timing a pass", exc)
        try:
            return begin(self, **kw)
        except BaseException:
            if ours is not None and tracer is not None:
                try:
                    tracer.forget_last(self)
                except Exception as exc:
                    tracer.fault("dropping a pass", exc)
            raise

    def finish(self, *, label: str = "") -> Any:
        recs = self._gputrace_records
        tracer = self._gputrace_tracer
        if recs and tracer is not None:
            try:
                tracer.resolve(self, recs)
            except Exception as exc:
                tracer.fault("resolving timestamps", exc, [r.token for r in recs])
                for r in recs:
                    r.submit_ns = _FAILED
        cb = self._gputrace_base.finish(self, label=label)
        if recs and tracer is not None:
            try:
                cb._gputrace_passes = (tracer, recs)
            except Exception as exc:
                tracer.fault("noting a command buffer", exc, [r.token for r in recs])
        return cb


class _TracedQueue:
    _gputrace_tracer: DeviceTracer | None = None
    _gputrace_base: Any

    def submit(self, command_buffers: Any) -> None:
        tracer = self._gputrace_tracer
        if tracer is None:
            self._gputrace_base.submit(self, command_buffers)
            return
        # (owner, records) of each traced command buffer; popped so a resubmit cannot count twice
        try:
            batches = [p for cb in command_buffers if (p := cb.__dict__.pop("_gputrace_passes", None))]
            submit_ns = tracer.clock()
        except Exception as exc:
            tracer.fault("noting a submit", exc, [])
            batches, submit_ns = [], 0
        ok = False
        try:
            self._gputrace_base.submit(self, command_buffers)
            ok = True
        finally:
            for owner, recs in batches:
                try:
                    owner.submitted(recs, submit_ns, ok)
                except Exception as exc:
                    owner.fault("noting a submit", exc, [r.token for r in recs])
                    owner.settle(recs)
            if tracer.mapping:
                try:
                    tracer.harvest_ready()
                except Exception as exc:  # the user's submit went through: never fail it
                    report_internal("wgpu-harvest", f"reading back wgpu timestamps failed ({exc}).")


_classes: dict[tuple[type, type], type] = {}


def traced_class(base: type, mixin: type) -> type:
    """``base`` with ``mixin``'s methods in front (cached: one class per pair), named as the base:
    wgpu-py counts live objects by class name."""
    if issubclass(base, mixin):
        return base
    if (base, mixin) not in _classes:
        names = {"_gputrace_base": base, "__qualname__": base.__qualname__}
        _classes[base, mixin] = type(base.__name__, (mixin, base), names)
    return _classes[base, mixin]


def swap_in(device: Any) -> None:
    """Give ``device`` and its queue the traced classes (idempotent)."""
    device.__class__ = traced_class(type(device), _TracedDevice)
    device.queue.__class__ = traced_class(type(device.queue), _TracedQueue)


def swap_out(device: Any) -> None:
    """Give ``device`` and its queue their own classes back."""
    for obj in (device, device.queue):
        base = getattr(type(obj), "_gputrace_base", None)
        if base is not None:
            obj.__dict__.pop("_gputrace_tracer", None)
            obj.__class__ = base


def attach(device: Any, tracer: DeviceTracer | None) -> None:
    """Route ``device``'s passes to ``tracer`` (None: leave them alone)."""
    device._gputrace_tracer = tracer
    device.queue._gputrace_tracer = tracer


def untraced(obj: Any) -> Any:
    """The class of a device or queue without gputrace's hooks: what gputrace itself calls."""
    return getattr(type(obj), "_gputrace_base", type(obj))
