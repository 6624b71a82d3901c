"""Clocks. The session clock is ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux); tests inject
a ``FakeClock`` so every recorded time is exact.

>>> c = FakeClock(start_ns=1000, step_ns=10)
>>> c(), c(), c()
(1000, 1010, 1020)
>>> c.advance(500); c()
1530
"""

from __future__ import annotations

import threading
import time

# The session clock: CLOCK_MONOTONIC on Linux, read by a C function (no Python frame on the hot path).
session_clock = time.perf_counter_ns


class FakeClock:
    """A deterministic, thread-safe clock: each read returns the time, then adds ``step_ns``."""

    def __init__(self, start_ns: int = 1_000_000_000, step_ns: int = 1_000) -> None:
        self.now_ns = start_ns
        self.step_ns = step_ns
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            now = self.now_ns
            self.now_ns += self.step_ns
            return now

    def advance(self, ns: int) -> None:
        with self._lock:
            self.now_ns += ns


def clock_pair() -> tuple[int, int]:
    """A (session clock, realtime) pair read as close together as possible (the tightest of five
    tries), to put several processes' traces on one time line (``gputrace merge``)."""

    def bracketed() -> tuple[int, int, int]:
        a = time.perf_counter_ns()
        r = time.time_ns()
        b = time.perf_counter_ns()
        return b - a, (a + b) // 2, r

    _, mono, real = min(bracketed() for _ in range(5))
    return mono, real
