"""The wgpu backend: a timestamp pair per compute/render pass, through wgpu-py 0.32.

The device is handed to the session (``backend_options={"device": device}``) or instrumented once
(``instrument(device)``, which is how ``backend="auto"`` finds it). Each pass is a GPU span of the
innermost scope open on its thread. A device without "timestamp-query" keeps its scopes' CPU times,
marked untimed, never made-up GPU numbers. What is timed, and how: docs/webgpu.md.
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
from gputrace.backends.base import Backend, CalibrationSample, Clock, Collected, SpanBatch
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
    """Why the wgpu backend cannot be used here, or None. ``auto`` also needs the program to have
    imported wgpu and an adapter with "timestamp-query"; by name, wgpu need only be importable."""
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
    """Trace the passes of ``device`` in every gputrace session; returns the same device. Outside
    a session it costs one attribute read per encoder and per submit; ``uninstrument`` undoes it."""
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
    """Give ``device`` back its own classes (its tracer with them); its passes are no longer timed."""
    _instrumented.discard(device)
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
        self._pending_samples: list[CalibrationSample] = []
        self._sampled: set[int] = set()  # devices whose first samples were taken
        self._started = False
        self._lock = threading.Lock()
        self._noticed_none = False
        self.closed = False
        self.problem = ""  # why some passes could not be timed (a device failed to attach), or ""
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

    # scopes (hot path) ---------------------------------------------------------------------
    # A pass belongs to the innermost scope open on its thread's current track (the recorder
    # knows it: asyncio tasks and suspended generators included); a token only names the scope.
    def begin(self, name: str, stream: Hashable | None, cpu_ns: int) -> int:
        self._last_token = next(self._tokens)
        return self._last_token

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
        first = tracer.index not in self._sampled
        if first:  # the first pass on a device pays for set-up (tens of ms): not a sample
            tracer.calibration_sample()
        taken = [tracer.calibration_sample() for _ in range(n)]
        # the device's first samples: the fit's start rests on them, so under load (every window
        # wide) keep sampling, bounded, until one is as tight as an idle machine gives
        until = self.clock() + START_SAMPLING_NS
        while (
            first
            and min(s.half_width_ns for s in taken) > self.calibration_target_ns
            and len(taken) < START_SAMPLES_MAX
            and self.clock() < until
        ):
            taken.append(tracer.calibration_sample())
        self._sampled.add(tracer.index)
        taken.sort(key=lambda s: s.half_width_ns)
        return sorted(taken[: max(1, (n + 1) // 2)], key=lambda s: s.cpu_before_ns)

    def collect(self) -> Collected:
        got, spans = Collected(), []
        for t in list(self.tracers):
            done, degraded = t.collect()
            spans += done
            got.degraded.update(degraded)
        got.spans = SpanBatch.of(spans)
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
        keys = dict(vendor="vendor", adapter_type="adapter_type", api="backend_type", driver="description")
        return [
            {
                "index": t.index,
                "name": _device_name(t.device),
                "backend": self.name,
                **{k: t.device.adapter.info.get(v, "") for k, v in keys.items()},
                "timestamps": t.timed,
                "timestamp_period_ns": t.period,
            }
            for t in self.tracers
        ]

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
        if _active is self:
            _active = None


def _device_name(device: Any) -> str:
    try:
        return str(device.adapter.info.get("device", "") or "wgpu device")
    except Exception:
        return "wgpu device"
