"""Summary statistics and timing loops for calibration.

Every measurement is repeated many times after a warm-up that is thrown away, and reported as a
median with its spread (p5/p95 and min/max), never as a single number or a mean.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrace.npstats import distinct

_NS_FIELDS = ("median", "p5", "p95", "min", "max")  # Stat's fields after n, saved as "<name>_ns"


@dataclass(frozen=True)
class Stat:
    """The distribution of repeated samples of one quantity, in nanoseconds."""

    n: int
    median: float
    p5: float
    p95: float
    min: float
    max: float

    @classmethod
    def of(cls, samples: Iterable[float]) -> Stat:
        arr = np.asarray(list(samples), dtype=np.float64)
        if arr.size == 0:
            raise ValueError("a statistic needs at least one sample")
        p5, med, p95 = np.percentile(arr, [5.0, 50.0, 95.0])
        # kept at the precision a saved calibration has (ps), so a calibration read back prints
        # the same digits as the one measured (40.34999… printed 40.3, its saved 40.35 then 40.4)
        return cls(int(arr.size), *(round(float(v), 3) for v in (med, p5, p95, arr.min(), arr.max())))

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, **{f"{k}_ns": round(getattr(self, k), 3) for k in _NS_FIELDS}}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Stat:
        return cls(int(d["n"]), *(float(d[f"{k}_ns"]) for k in _NS_FIELDS))


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
    """The smallest positive difference between distinct values: a timer's visible resolution.

    >>> smallest_step([0.0, 64.0, 32.0, 32.0, 96.0])
    32.0
    >>> smallest_step([5.0, 5.0]) is None
    True
    """
    uniq = distinct(np.asarray(values, dtype=np.float64))
    if uniq.size < 2:
        return None
    return float(np.diff(uniq).min())
