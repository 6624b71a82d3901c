"""The wgpu backend: a timestamp pair per compute/render pass, through wgpu-py 0.32.

The user's wgpu code stays as it is: the device is handed to the session
(``backend_options={"device": device}``) or instrumented once (``instrument(device)``, which is
also how ``backend="auto"`` finds it). Each pass becomes a GPU span of the innermost scope open on
the thread that began it; a scope's GPU span is the hull of its passes and of its children's. A
device without "timestamp-query" keeps its scopes' CPU times, marked untimed, never made-up GPU
numbers. What is timed, and how: docs/webgpu.md.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import weakref
from collections.abc import Hashable
from typing import Any

from gputrace.backends import wgpu_hooks, wgpu_queries
from gputrace.backends.base import Backend, CalibrationSample, Clock, Collected
from gputrace.backends.wgpu_queries import PAGE_QUERIES
from gputrace.errors import GputraceError, notice, report_internal
from gputrace.model import QueueInfo
from gputrace.recorder import active_recorder

_instrumented: weakref.WeakSet[Any] = weakref.WeakSet()
_active: WgpuBackend | None = None
# At session start, calibration samples are taken until one window is within the backend's
# calibration target, at most this many or for this long.
START_SAMPLES_MAX = 64
START_SAMPLING_NS = 100_000_000


def probe(*, auto: bool = True) -> str | None:
    """Why the wgpu backend cannot be used here, or None.

    For ``backend="auto"`` (``auto=True``) it also needs the program to have imported wgpu and an
    adapter with "timestamp-query"; asked for by name, wgpu only has to be importable.
    """
    if auto and "wgpu" not in sys.modules:
        return "the program has not imported wgpu (auto picks wgpu only for programs using it)"
    try:
        import wgpu  # noqa: F401
        from wgpu.backends.wgpu_native import _api  # noqa: F401
    except Exception as exc:
        return f"wgpu-py is not importable ({type(exc).__name__}: {exc})"
    return _probe_adapter() if auto else None


@functools.cache  # asking for an adapter is slow
def _probe_adapter() -> str | None:
    import wgpu

    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:
        return f"no WebGPU adapter was found ({type(exc).__name__}: {exc})"
    if adapter is None:
        return "no WebGPU adapter was found"
    if "timestamp-query" not in adapter.features:
        return f"the adapter {adapter.info.get('device', '?')!r} has no timestamp-query support"
    return None


def instrument(device: Any) -> Any:
    """Trace the passes of ``device`` in every gputrace session; returns the same device.

    Outside a session (or a scope) the device behaves exactly as before, at the cost of one
    attribute read per encoder and per submit. ``uninstrument(device)`` undoes it.
    """
    try:
        from wgpu.backends.wgpu_native._api import GPUDevice
    except ImportError as exc:
        raise GputraceError(f"gputrace cannot trace wgpu devices: wgpu-py is missing ({exc}).") from None
    if not isinstance(device, GPUDevice):
        raise GputraceError(
            f"gputrace traces wgpu-native devices (wgpu.GPUDevice), not {type(device).__name__}."
        )
    wgpu_hooks.swap_in(device)
    _instrumented.add(device)
    rec = active_recorder()
    # (not a backend left over by, say, a session whose backend failed to close)
    if _active is not None and rec is not None and rec.backend is _active:
        try:
            _active.attach(device)
        except Exception as exc:
            _active._lost(device, exc)
    return device


def uninstrument(device: Any) -> None:
    """Give ``device`` back its own classes; its passes are no longer timed."""
    _instrumented.discard(device)
    if _active is not None:
        _active.detach(device)
    wgpu_hooks.swap_out(device)


class WgpuBackend(Backend):
    """Options (``backend_options``, docs/webgpu.md): ``device`` (one or a list; default: every
    instrumented device), ``timeout_s``, ``calibration_samples`` (per device at each sync and at
    stop, twice that at start), ``timestamp_period`` (ns per tick), ``page_queries``."""

    name = "wgpu"
    timed = True
    spans_cover_children = True
    calibration_target_ns = 60_000  # lavapipe idle: 40–45 µs; late wake-ups under load: ms

    def __init__(
        self,
        clock: Clock,
        *,
        device: Any = None,
        timeout_s: float = 10.0,
        calibration_samples: int = 4,
        timestamp_period: float | None = None,
        page_queries: int = PAGE_QUERIES,
    ) -> None:
        super().__init__(clock)
        global _active
        if not timeout_s > 0:
            raise GputraceError(f"timeout_s must be positive, not {timeout_s!r}.")
        if timestamp_period is not None and not timestamp_period > 0:
            raise GputraceError(f"timestamp_period must be positive, not {timestamp_period!r}.")
        if not 2 <= page_queries <= PAGE_QUERIES or page_queries % 2:
            raise GputraceError(f"page_queries must be even and in 2…4096, not {page_queries!r}.")
        self.timeout_s = float(timeout_s)
        self.calibration_samples = max(1, int(calibration_samples))
        self.period_override = timestamp_period
        self.page_queries = page_queries
        self.pass_counts: dict[int, int] = {}  # token -> passes so far (for their labels)
        self._tokens = itertools.count(1)
        self._last_token = 0
        self._collected_upto = 0
        self.untimed: set[int] = set()
        self.tracers: list[Any] = []
        self._calibrators: dict[int, Any] = {}
        self._pending_samples: list[CalibrationSample] = []
        self._sampled: set[int] = set()  # devices whose first samples were taken
        self._started = False
        self._lock = threading.Lock()
        self._noticed_none = False
        self.closed = False
        # Why some passes could not be timed (a device that failed to attach), or "".
        self.problem = ""
        given = device if isinstance(device, (list, tuple)) else [device] if device is not None else []
        for dev in given:
            try:
                instrument(dev)
            except GputraceError:
                raise  # not a wgpu device: the user's to fix
            except Exception as exc:
                self._lost(dev, exc)
        for dev in given or list(_instrumented):
            try:
                self.attach(dev)
            except Exception as exc:
                self._lost(dev, exc)
        _active = self

    def _lost(self, device: Any, exc: BaseException) -> None:
        """``device`` could not be traced: its passes run untimed, their scopes are flagged."""
        reason = f"tracing the wgpu device {_device_name(device)!r} failed ({type(exc).__name__}: {exc})"
        self.problem = self.problem or reason
        report_internal("wgpu-attach", f"{reason}; its passes are not timed, your program continues.")

    # devices -------------------------------------------------------------------------------
    def attach(self, device: Any) -> None:
        """Trace ``device`` in this session (called for devices instrumented mid-session too)."""
        with self._lock:
            if self.closed or any(t.device is device for t in self.tracers):
                return
            timed = "timestamp-query" in device.features
            period = self.period_override or wgpu_queries.timestamp_period(device.queue)
            tracer = wgpu_hooks.DeviceTracer(device, len(self.tracers), self, timed, period)
            self.tracers.append(tracer)
            wgpu_hooks.attach(device, tracer)
        if not timed:
            notice(
                f"the wgpu device {_device_name(device)!r} was created without the "
                "'timestamp-query' feature (request it: required_features=['timestamp-query']); "
                "its scopes are recorded with CPU times only, marked untimed."
            )
        elif self._started:
            self._pending_samples.extend(self._sample(tracer, self.calibration_samples))

    def detach(self, device: Any) -> None:
        if any(t.device is device for t in self.tracers):
            wgpu_hooks.attach(device, None)

    # scopes (hot path) ---------------------------------------------------------------------
    # A pass belongs to the innermost scope open on its thread's current track (the recorder
    # knows it: asyncio tasks and suspended generators included); a token only names the scope.
    def begin(self, name: str, stream: Hashable | None, cpu_ns: int) -> int:
        token = next(self._tokens)
        self._last_token = token
        return token

    def end(self, token: int) -> None:
        pass

    # sync, calibration, collection ------------------------------------------------------------
    def sync(self) -> None:
        for t in list(self.tracers):
            wd = t.work_done
            wd.wait(wd.request(), f"the work submitted to {_device_name(t.device)!r}")

    def calibrate(self) -> list[CalibrationSample]:
        n = self.calibration_samples if self._started else 2 * self.calibration_samples
        self._started = True
        out, self._pending_samples = self._pending_samples, []
        for t in list(self.tracers):
            if t.timed:
                out.extend(self._sample(t, n))
        return out

    def _sample(self, tracer: Any, n: int) -> list[CalibrationSample]:
        """The tightest half of ``n`` samples: a wide window (a thread wake-up) only adds doubt."""
        cal = self._calibrators.get(tracer.index)
        if cal is None:
            cal = self._calibrators[tracer.index] = Calibrator(tracer)
            cal.sample()  # the first pass on a device pays for set-up (tens of ms): not a sample
        taken = [cal.sample() for _ in range(n)]
        if tracer.index not in self._sampled:
            # the device's first samples: the fit's start rests on them, so under load (every
            # window wide) keep sampling, bounded, until one is as tight as an idle machine gives
            self._sampled.add(tracer.index)
            until = self.clock() + START_SAMPLING_NS
            while (
                min(s.half_width_ns for s in taken) > self.calibration_target_ns
                and len(taken) < START_SAMPLES_MAX
                and self.clock() < until
            ):
                taken.append(cal.sample())
        taken.sort(key=lambda s: s.half_width_ns)
        return sorted(taken[: max(1, (n + 1) // 2)], key=lambda s: s.cpu_before_ns)

    def collect(self) -> Collected:
        got = Collected()
        for t in list(self.tracers):
            spans, degraded = t.collect()
            got.spans.extend(spans)
            got.degraded.update(degraded)
        last = self._last_token
        since = range(self._collected_upto + 1, last + 1)
        if not any(t.timed for t in self.tracers) and self.problem:
            # the device failed to attach: its scopes lost their GPU times (degraded, not untimed)
            got.degraded.update(dict.fromkeys(since, self.problem))
        elif not any(t.timed for t in self.tracers):
            # nothing could be timed: every scope so far keeps its CPU times, marked untimed
            got.untimed.update(since)
            if not self.tracers and since and not self._noticed_none:
                self._noticed_none = True
                notice(
                    "no wgpu device is traced, so no pass was timed: pass "
                    "backend_options={'device': device} or call "
                    "gputrace.backends.wgpu.instrument(device)."
                )
        self._collected_upto = last
        got.untimed |= self.untimed
        self.untimed.clear()
        return got

    # facts -----------------------------------------------------------------------------------
    def queues(self) -> list[QueueInfo]:
        return [QueueInfo(t.index, _device_name(t.device), self.name, "queue") for t in self.tracers]

    def devices(self) -> list[dict[str, Any]]:
        out = []
        for t in self.tracers:
            info = t.device.adapter.info
            out.append(
                {
                    "index": t.index,
                    "name": _device_name(t.device),
                    "backend": self.name,
                    "vendor": info.get("vendor", ""),
                    "adapter_type": info.get("adapter_type", ""),
                    "api": info.get("backend_type", ""),
                    "driver": info.get("description", ""),
                    "timestamps": t.timed,
                    "timestamp_period_ns": t.period,
                }
            )
        return out

    def info(self) -> dict[str, Any]:
        import wgpu
        from wgpu.backends.wgpu_native import __version__ as native_version

        return {
            "name": self.name,
            "wgpu_py": wgpu.__version__,
            "wgpu_native": native_version,
            "timestamp_period_ns": [t.period for t in self.tracers],
            "passes_timed": sum(t.passes for t in self.tracers),
            "passes_outside_scopes": sum(t.outside for t in self.tracers),
            "query_pages": sum(t.pages_made for t in self.tracers),
        }

    def close(self) -> None:
        global _active
        with self._lock:
            self.closed = True
            for t in self.tracers:
                wgpu_hooks.attach(t.device, None)
                t.close()
            for cal in self._calibrators.values():
                cal.release()
            self._calibrators.clear()
        if _active is self:
            _active = None


class Calibrator:
    """Brackets a GPU timestamp between session-clock reads.

    An empty pass writes its begin timestamp; the CPU reads the clock just before submitting it
    and the work-done callback reads it again as soon as the GPU is finished. The window is
    about 100 µs on lavapipe; the resolver weighs the tightest windows most.
    """

    def __init__(self, tracer: Any) -> None:
        self.tracer = tracer
        self.page: Any = None  # a two-slot query page, made at the first sample

    def sample(self) -> CalibrationSample:
        t = self.tracer
        if self.page is None:  # the first sample, or the last page was given up on while mapping
            self.page = wgpu_queries.QueryPage(t.device, 2)
        page = self.page
        enc = wgpu_hooks.untraced(t.device).create_command_encoder(t.device, label="gputrace")
        enc.begin_compute_pass(label="gputrace calibration", timestamp_writes=page.writes(0)).end()
        enc.resolve_query_set(page.query_set, 0, 2, page.resolve_buf, 0)
        enc.copy_buffer_to_buffer(page.resolve_buf, 0, page.readback, 0, 16)
        cb = enc.finish()
        wd = t.work_done
        queue = t.device.queue
        submit = wgpu_hooks.untraced(queue).submit
        before = t.clock()
        submit(queue, [cb])
        req = wd.request()
        after = wd.wait(req, "a calibration pass")
        try:
            page.used = 2
            page.start_map()
            wgpu_queries.wait_mapped(
                page.readback, page.promise, t.timeout_s, "reading a calibration timestamp"
            )
            gpu_ns = int(wgpu_queries.ticks_to_ns(page.read_ticks(), t.period)[0])
        except BaseException:
            # a read-back given up on (timed out, failed) must never be submitted again while
            # mapped or pending (wgpu-native aborts the process): unmapped, or parked and replaced
            if not wgpu_queries.abandon(page.readback, page.promise, page):
                self.page = None
            raise
        finally:
            page.reset()
        return CalibrationSample(before, gpu_ns, after, t.index)

    def release(self) -> None:
        self.page = None
        wgpu_queries.settle_parked()


def _device_name(device: Any) -> str:
    try:
        return str(device.adapter.info.get("device", "") or "wgpu device")
    except Exception:
        return "wgpu device"
