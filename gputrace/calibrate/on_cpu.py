"""Measurements every backend shares (session clock, profiler cost per scope, numpy's rate on the
break-even workload), the timing loops, and the CPU-vs-GPU break-even table: per intensity
(multiply-adds per element), numpy on this CPU against one kernel launch plus its wait, with data
resident and with copies in and out; the break-even is where the curves cross (log-log).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gputrace.calibrate import DeviceRun
from gputrace.calibrate.result import BreakEven, Stat
from gputrace.npstats import distinct

# The break-even workload: ``ops`` multiply-adds per float32 element, y = y * A + B, repeated.
FMA_A = 0.999
FMA_B = 0.001
INTENSITIES = (1, 10, 1000)  # multiply-adds per element, the break-even table's rows


def wall_per_op(
    op: Callable[[], Any],
    *,
    batches: int,
    per_batch: int,
    warmup: int,
    clock: Callable[[], int] = time.perf_counter_ns,
) -> list[float]:
    """CPU wall time per call of ``op`` (ns): ``batches`` samples, each ``per_batch`` calls long
    (batching keeps the clock read, ~100 ns, out of operations that cost about as much)."""
    for _ in range(warmup):
        op()
    out = []
    for _ in range(batches):
        t0 = clock()
        for _ in range(per_batch):
            op()
        out.append((clock() - t0) / per_batch)
    return out


def smallest_step(values: Sequence[float]) -> float | None:
    """The smallest positive difference between distinct values (a timer's visible resolution),
    None with fewer than two."""
    uniq = distinct(np.asarray(values, dtype=np.float64))
    if uniq.size < 2:
        return None
    return float(np.diff(uniq).min())


def crossing(
    sizes: Sequence[int], cpu_ns: Sequence[float], gpu_ns: Sequence[float]
) -> tuple[int | None, bool]:
    """(smallest element count where the GPU is faster, interpolated in log-log between the grid
    points around it; whether the GPU already wins at the grid's first point), or (None, False)."""
    wins = [g < c for c, g in zip(cpu_ns, gpu_ns, strict=True)]
    for i, win in enumerate(wins):
        if win and i == 0:
            return int(sizes[0]), True
        if win:
            d0 = math.log(cpu_ns[i - 1] / gpu_ns[i - 1])  # <= 0: CPU at least as fast
            d1 = math.log(cpu_ns[i] / gpu_ns[i])  # > 0: GPU faster
            frac = -d0 / (d1 - d0) if d1 != d0 else 1.0
            log_n = math.log(sizes[i - 1]) + frac * (math.log(sizes[i]) - math.log(sizes[i - 1]))
            return math.ceil(round(math.exp(log_n), 6)), False
    return None, False


def table(
    sizes: Sequence[int],
    cpu_pass_ns: Sequence[float],
    gpu_resident_ns: Mapping[int, Sequence[float]],
    gpu_copies_ns: Mapping[int, Sequence[float]],
) -> tuple[list[BreakEven], dict[str, Any]]:
    """Break-even rows for each intensity measured, and the curves they came from (for the JSON)."""
    rows = []
    curves: dict[str, Any] = {"elements": list(sizes), "cpu_pass_ns": [round(v, 1) for v in cpu_pass_ns]}
    for ops in sorted(gpu_resident_ns):
        cpu = [ops * v for v in cpu_pass_ns]
        res_n, res_below = crossing(sizes, cpu, gpu_resident_ns[ops])
        copies = gpu_copies_ns.get(ops)
        cp_n, cp_below = crossing(sizes, cpu, copies) if copies else (None, False)
        rows.append(BreakEven(ops, res_n, cp_n, res_below, cp_below))
        curves[f"ops{ops}"] = {
            "cpu_ns": [round(v, 1) for v in cpu],
            "gpu_resident_ns": [round(v, 1) for v in gpu_resident_ns[ops]],
            "gpu_with_copies_ns": [round(v, 1) for v in copies] if copies else None,
        }
    return rows, curves


def clock(run: DeviceRun, batches: int) -> None:
    """Cost of one session-clock read, and the smallest step it shows."""
    read = time.perf_counter_ns
    cost = wall_per_op(read, batches=batches, per_batch=1000, warmup=1000)
    steps = []
    for _ in range(batches * 50):
        a = read()
        b = read()
        while b == a:
            b = read()
        steps.append(float(b - a))
    run.add("clock_read", "clock", "session clock read (perf_counter_ns)", cost, per=1000)
    run.add(
        "clock_step",
        "clock",
        "session clock: smallest visible step",
        steps,
        note="the time between two reads that differ",
    )
    run.summary["clock_resolution_ns"] = float(min(steps))


def scope_cost(run: DeviceRun, backend: str, batches: int, per_batch: int) -> None:
    """The profiler's own cost per ``with gputrace.trace(...)`` scope: with no session active, and
    inside a session on ``backend`` (the full cost a user pays per traced region)."""
    import gputrace

    def scope() -> None:
        with gputrace.trace("calibrate.scope"):
            pass

    off = wall_per_op(scope, batches=batches, per_batch=per_batch, warmup=per_batch)
    run.add("scope_cost_off", "profiler", "trace() scope, no session active", off, per=per_batch)
    try:
        s = gputrace.session(backend=backend, quiet=True, backend_options=run.session_options)
        s.start()
    except Exception as exc:  # the backend may be missing or unusable: say why, measure the rest
        run.skipped["scope_cost"] = f"a {backend} session could not start ({exc})"
        return
    try:
        cost = wall_per_op(scope, batches=batches, per_batch=per_batch, warmup=per_batch)
    finally:
        s.stop()
    run.add(
        "scope_cost",
        "profiler",
        f"trace() scope inside a {backend} session",
        cost,
        per=per_batch,
        note="enter + exit, including the backend's begin/end",
        summary_wall="scope_cost_ns",
    )


def numpy_breakeven(run: DeviceRun, batches: int) -> None:
    """The CPU side of the break-even table: one multiply-add pass over ``n`` float32 elements
    with numpy, per size of the GPU's grid; then the table itself."""
    medians = []
    a, b = np.float32(FMA_A), np.float32(FMA_B)
    for n in run.sizes:
        y = np.ones(n, dtype=np.float32)

        def one_pass(y: Any = y) -> None:
            np.multiply(y, a, out=y)
            np.add(y, b, out=y)

        per_batch = max(1, min(1000, (1 << 18) // n))
        samples = wall_per_op(one_pass, batches=batches, per_batch=per_batch, warmup=2)
        medians.append(Stat.of(samples).median)
    what = f"numpy multiply-add pass, {run.sizes[-1]:,} elements"
    run.add("numpy_pass", "break-even", what, samples, note="the CPU side of the break-even table")
    run.breakeven, run.curves = table(run.sizes, medians, run.resident_ns, run.with_copies_ns)
    run.summary["cpu_ns_per_element_op"] = medians[-1] / run.sizes[-1]
