"""Measurements every backend shares: the session clock, the profiler's own cost per scope, and
the CPU's rate on the break-even workload (numpy, on this machine).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gputrace.calibrate import DeviceRun
from gputrace.calibrate.breakeven import table
from gputrace.calibrate.result import Measurement
from gputrace.calibrate.stats import Stat, wall_per_op

# The break-even workload: ``ops`` multiply-adds per float32 element, y = y * A + B, repeated.
FMA_A = 0.999
FMA_B = 0.001


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
    cpu_pass = []
    a, b = np.float32(FMA_A), np.float32(FMA_B)
    for n in run.sizes:
        y = np.ones(n, dtype=np.float32)

        def one_pass(y: Any = y) -> None:
            np.multiply(y, a, out=y)
            np.add(y, b, out=y)

        per_batch = max(1, min(1000, (1 << 18) // n))
        cpu_pass.append(Stat.of(wall_per_op(one_pass, batches=batches, per_batch=per_batch, warmup=2)))
    run.measurements.append(
        Measurement(
            "numpy_pass",
            "break-even",
            f"numpy multiply-add pass, {run.sizes[-1]:,} elements",
            wall=cpu_pass[-1],
            note="the CPU side of the break-even table",
        )
    )
    medians = [s.median for s in cpu_pass]
    run.breakeven, run.curves = table(run.sizes, medians, run.resident_ns, run.with_copies_ns)
    run.summary["cpu_ns_per_element_op"] = cpu_pass[-1].median / run.sizes[-1]
