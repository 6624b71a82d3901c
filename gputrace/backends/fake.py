"""A scripted GPU for tests: exact GPU timestamps in a clock domain with a chosen offset and drift.

The fake GPU is an in-order queue per stream. A scope submitted at CPU time ``t`` starts at
``max(t + delay, queue free)`` and runs for ``duration``, both taken from ``script(name, call)``;
those true times (on the session clock) are kept in ``truth`` so tests can check the resolver.
The GPU clock reads ``gpu = (cpu - offset_ns) · (1 + drift_ppm·1e-6)``. A calibration sample
brackets a GPU read between two clock reads, at a point inside the window chosen by a seeded RNG;
``windows(k)`` instead scripts the ``k``-th sample of the session: ``(lead, lag)``, the GPU read
``lead`` ns after the first clock read and the second read ``lag`` ns after it (a GPU that is late
to wake, a callback that runs late), the clock advanced by both.

>>> from gputrace.clock import FakeClock
>>> fb = FakeBackend(FakeClock(0, 100), offset_ns=5_000, script=lambda name, i: (1_000, 2_000))
>>> tok = fb.begin("k", None, 10_000); fb.end(tok); fb.truth[tok]
(10000, 11000, 13000)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from typing import Any

from gputrace.backends.base import Backend, CalibrationSample, Clock, Collected, RawSpan, SpanBatch
from gputrace.model import QueueInfo

FAKE_GPU = "Fake GPU"
# (delay after submission, duration) in ns; a None duration means the GPU cannot time the scope.
Script = Callable[[str, int], tuple[int, int | None]]


def probe() -> str | None:
    return None


class FakeBackend(Backend):
    """The scripted GPU (see the module docstring); ``truth`` holds what the resolver must find."""

    name = "fake"
    timed = True

    def __init__(
        self,
        clock: Clock,
        *,
        offset_ns: int = 0,
        drift_ppm: float = 0.0,
        script: Script = lambda name, call: (5_000, 20_000),
        seed: int = 0,
        in_order: bool = True,
        samples_per_calibration: int = 1,
        spans_cover_children: bool = False,
        windows: Callable[[int], tuple[int, int]] | None = None,
    ) -> None:
        super().__init__(clock)
        self.offset_ns = offset_ns
        self.drift_ppm = drift_ppm
        self.script = script
        self.rng = random.Random(seed)
        self.in_order = in_order
        self.samples_per_calibration = samples_per_calibration
        self.spans_cover_children = spans_cover_children
        self.windows = windows
        self._next = 0
        self._calls: dict[str, int] = {}
        self._streams: dict[Hashable, int] = {}
        self._free: dict[int, int] = {}
        self._pending: dict[int, tuple[int, str, int]] = {}  # token -> (queue, name, submit)
        self._done: list[tuple[int, int]] = []  # (token, queue) of the scopes that ended
        self.truth: dict[int, tuple[int, int, int]] = {}  # token -> (submit, start, end), cpu ns
        self.truth_samples: list[int] = []  # true cpu time of each calibration sample

    def to_gpu(self, cpu_ns: int) -> int:
        return round((cpu_ns - self.offset_ns) * (1.0 + self.drift_ppm * 1e-6))

    def begin(self, name: str, stream: Hashable | None, cpu_ns: int) -> int:
        q = self._streams.setdefault(stream, len(self._streams))
        self._next += 1
        self._pending[self._next] = (q, name, cpu_ns)
        return self._next

    def end(self, token: int) -> None:
        q, name, submit = self._pending.pop(token)
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        delay, duration = self.script(name, call)
        if duration is None:
            self.truth[token] = (submit, -1, -1)
        else:
            start = submit + delay
            if self.in_order:
                start = max(start, self._free.get(q, start))
            self._free[q] = start + duration
            self.truth[token] = (submit, start, start + duration)
        self._done.append((token, q))

    def sync(self) -> None:
        """Wait for the fake GPU: move a fake clock past the end of all submitted work."""
        self._advance(max(self._free.values(), default=0) - self.clock())

    def calibrate(self) -> list[CalibrationSample]:
        out = []
        for _ in range(self.samples_per_calibration):
            before = self.clock()
            lead: int | None = None
            if self.windows is not None:
                lead, lag = self.windows(len(self.truth_samples))
                self._advance(lead + lag)
            after = self.clock()
            true = before + self.rng.randint(0, after - before) if lead is None else min(before + lead, after)
            self.truth_samples.append(true)
            out.append(CalibrationSample(before, self.to_gpu(true), after, 0))
        return out

    def _advance(self, ns: int) -> None:
        advance = getattr(self.clock, "advance", None)
        if advance is not None and ns > 0:
            advance(ns)

    def collect(self) -> Collected:
        done_by = self.clock()
        got, spans = Collected(), []
        for token, q in self._done:
            submit, start, end = self.truth[token]
            if start < 0:
                got.untimed.add(token)
                continue
            spans.append(RawSpan(token, q, self.to_gpu(start), self.to_gpu(end), submit, done_by))
        self._done = []
        got.spans = SpanBatch.of(spans)
        return got

    def queues(self) -> list[QueueInfo]:
        labels = [0 if label is None else label for label in self._streams] or [0]
        return [QueueInfo(0, FAKE_GPU, self.name, f"stream {label}") for label in labels]

    def devices(self) -> list[dict[str, Any]]:
        return [{"index": 0, "name": FAKE_GPU, "backend": self.name}]

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "offset_ns": self.offset_ns, "drift_ppm": self.drift_ppm}
