"""Calibration: measure, on this machine and backend, the costs that decide where work belongs.

>>> from gputrace.calibrate import measure
>>> cal = measure("cpu", quick=True)
>>> cal.backend, cal.get("scope_cost").wall.median > 0
('cpu', True)

Each GPU backend module (``on_cuda``, ``on_wgpu``) imports its library only when called and
returns a ``DeviceRun``; ``on_cpu`` adds what every backend shares (clock, profiler cost, numpy).
"""

from __future__ import annotations

import datetime as _dt
import importlib
import os
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gputrace.calibrate.result import BreakEven, Calibration, Measurement, Stat
from gputrace.errors import GputraceError

BACKENDS = ("cuda", "wgpu", "cpu")
# the groups of measurements each backend runs, in order (for the progress line)
STEPS = {
    "cuda": ("first_use", "launch", "grid", "graph", "events", "copies", "breakeven"),
    "wgpu": ("submit", "copies", "breakeven"),
    "cpu": (),
}
SHARED_STEPS = ("clock", "scope_cost")  # then, for GPU backends, "numpy_breakeven"
# One point of the GPU's break-even grid: (multiply-adds per element, kernel, kernel with copies)
Case = tuple[int, Callable[[], None], Callable[[], None]]


def steps(backend: str) -> tuple[str, ...]:
    """The keys ``measure(backend, progress=...)`` reports, in order."""
    return STEPS[backend] + SHARED_STEPS + (("numpy_breakeven",) if STEPS[backend] else ())


@dataclass
class Plan:
    """How much to measure. ``quick`` keeps a run to seconds (tests, a first look)."""

    quick: bool
    progress: Callable[[str], None] | None = None  # measure()'s, told each group as it starts

    def __post_init__(self) -> None:
        self.sizes = [1 << e for e in range(4, (20 if self.quick else 24) + 1, 2)]  # break-even grid
        self.reps = 5 if self.quick else 21  # repetitions per data point
        self.batches = 20 if self.quick else 100  # batches for per-operation costs


@dataclass
class DeviceRun:
    """What the measurements of one calibration run gather, before it becomes a ``Calibration``."""

    device: str
    progress: Callable[[str], None] | None = None  # the plan's (DeviceRun.step reports to it)
    measurements: list[Measurement] = field(default_factory=list)
    summary: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)  # grid of the break-even curves
    resident_ns: dict[int, list[float]] = field(default_factory=dict)  # ops -> wall per size
    with_copies_ns: dict[int, list[float]] = field(default_factory=dict)
    breakeven: list[BreakEven] = field(default_factory=list)
    curves: dict[str, Any] = field(default_factory=dict)  # the break-even raw curves
    session_options: dict[str, Any] = field(default_factory=dict)  # for the scope-cost session

    def add(
        self,
        key: str,
        group: str,
        what: str,
        wall: Iterable[float] | None = None,
        device: Iterable[float] | None = None,
        *,
        summary_wall: str | None = None,
        summary_device: str | None = None,
        **details: Any,
    ) -> None:
        """Record one measurement from its samples (ns per operation, each side becomes a ``Stat``);
        ``summary_wall`` / ``summary_device`` name the headline number its wall / device median is."""
        wall_stat, device_stat = (None if side is None else Stat.of(side) for side in (wall, device))
        self.measurements.append(Measurement(key, group, what, wall_stat, device_stat, **details))
        for name, stat in ((summary_wall, wall_stat), (summary_device, device_stat)):
            if name is not None and stat is not None:
                self.summary[name] = stat.median

    def gpu_breakeven(
        self, sizes: Sequence[int], cases: Callable[[int], Iterable[Case]], time_ns: Callable[..., float]
    ) -> None:
        """The GPU side of the break-even table: for each size ``n``, every case of ``cases(n)``
        timed by ``time_ns`` (the kernel first, then with copies)."""
        resident: dict[int, list[float]] = {}
        copies: dict[int, list[float]] = {}
        for n in sizes:
            for ops, kernel, with_copies in cases(n):
                resident.setdefault(ops, []).append(time_ns(kernel))
                copies.setdefault(ops, []).append(time_ns(with_copies))
        self.sizes, self.resident_ns, self.with_copies_ns = list(sizes), resident, copies

    def step(self, key: str, fn: Callable[[], None]) -> None:
        """Run one group of measurements; if it fails, record why and carry on with the next."""
        if self.progress is not None:
            self.progress(key)
        try:
            fn()
        except Exception as exc:
            self.skipped[key] = f"{type(exc).__name__}: {exc}"


def measure(
    backend: str, *, quick: bool = False, progress: Callable[[str], None] | None = None
) -> Calibration:
    """Run every measurement for ``backend`` ("cuda", "wgpu" or "cpu") and return the results;
    ``GputraceError`` if the backend cannot run here. A group that fails is recorded in ``skipped``
    and the others still run; ``progress`` is told each group's key as it starts (``steps``)."""
    import numpy as np

    from gputrace.calibrate import on_cpu
    from gputrace.host import loadavg

    if backend not in BACKENDS:
        raise GputraceError(f"unknown calibration backend {backend!r}; choose one of {', '.join(BACKENDS)}.")
    plan = Plan(quick, progress)
    load_before = loadavg()
    if backend == "cpu":
        run = DeviceRun(device=f"CPU · {platform.processor() or platform.machine()}", progress=plan.progress)
    else:  # on_cuda, on_wgpu
        run = importlib.import_module(f"gputrace.calibrate.on_{backend}").measure(plan)
    run.step("clock", lambda: on_cpu.clock(run, plan.batches))
    run.step("scope_cost", lambda: on_cpu.scope_cost(run, backend, plan.batches, 100 if quick else 500))
    if run.resident_ns:
        run.step("numpy_breakeven", lambda: on_cpu.numpy_breakeven(run, plan.reps))
    host = {
        "name": platform.node(),
        "cpu_count": os.cpu_count(),
        "loadavg": loadavg(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "executable": sys.executable,
        "loadavg_before": load_before,
    }
    return Calibration(
        backend=backend,
        device=run.device,
        host=host,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        quick=quick,
        measurements=run.measurements,
        breakeven=run.breakeven,
        curves={**run.curves, **({"info": run.info} if run.info else {})},
        summary={k: round(v, 3) for k, v in run.summary.items()},
        skipped=run.skipped,
    )


__all__ = ["BreakEven", "Calibration", "DeviceRun", "Measurement", "Plan", "Stat", "measure", "steps"]
