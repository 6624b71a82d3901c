"""The CPU-vs-GPU break-even table, from measured curves.

For each intensity (multiply-adds per element), over one grid of element counts: numpy on this
CPU against one kernel launch plus its wait (data resident), and with the copies in and out. The
break-even is where the curves cross, interpolated in log-log between the bracketing grid points.

>>> sizes = [100, 1000, 10000]
>>> crossing(sizes, cpu_ns=[1e3, 1e4, 1e5], gpu_ns=[1e4, 1e4, 1e4])
(1000, False)
>>> crossing(sizes, cpu_ns=[1e3, 1e4, 1e5], gpu_ns=[1e2, 1e2, 1e2])
(100, True)
>>> crossing(sizes, cpu_ns=[1e3, 1e4, 1e5], gpu_ns=[1e6, 1e6, 1e6])
(None, False)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gputrace.calibrate.result import BreakEven

INTENSITIES = (1, 10, 1000)


def crossing(
    sizes: Sequence[int], cpu_ns: Sequence[float], gpu_ns: Sequence[float]
) -> tuple[int | None, bool]:
    """(smallest element count where the GPU is faster, whether that is already the grid's first
    point); (None, False) when the CPU is faster everywhere on the grid."""
    wins = [g < c for c, g in zip(cpu_ns, gpu_ns, strict=True)]
    if not wins:
        return None, False
    if wins[0]:
        return int(sizes[0]), True
    for i in range(1, len(wins)):
        if wins[i]:
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
