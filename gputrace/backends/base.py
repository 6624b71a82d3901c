"""The backend contract: what the recorder and the session ask of a GPU backend.

A backend gives the recorder a token per scope (``begin``/``end``, on the hot path), and after a
sync hands the resolver raw material: GPU spans in its own clock domain (``collect``) and
calibration samples that bracket a GPU timestamp between two session-clock reads (``calibrate``).
It never aligns clocks itself: GPU ticks stay raw (converted to ns by the timestamp period) until
the resolver.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from gputrace.model import QueueInfo

Clock = Callable[[], int]


@dataclass(frozen=True)
class CalibrationSample:
    """A GPU timestamp known to have been taken between two session-clock reads."""

    cpu_before_ns: int
    gpu_ns: int  # GPU clock, nanoseconds (ticks × timestamp period)
    cpu_after_ns: int
    device: int = 0

    @property
    def half_width_ns(self) -> float:
        return (self.cpu_after_ns - self.cpu_before_ns) / 2.0

    @property
    def cpu_mid_ns(self) -> float:
        return (self.cpu_before_ns + self.cpu_after_ns) / 2.0


@dataclass(frozen=True)
class RawSpan:
    """One GPU execution span in the backend's clock domain, tied to a scope by its token."""

    token: int
    queue: int  # index into Backend.queues()
    gpu_start_ns: int  # raw GPU clock, ns
    gpu_end_ns: int
    submit_ns: int  # session clock: when the CPU submitted this work
    done_by_ns: int  # session clock: by then the work was known complete (the collecting sync)
    label: str = ""  # a pass label; "" for a scope-level event pair


@dataclass
class Collected:
    """What one ``collect()`` returns."""

    spans: list[RawSpan] = field(default_factory=list)
    untimed: set[int] = field(default_factory=set)  # tokens the GPU could not time
    degraded: dict[int, str] = field(default_factory=dict)  # token -> what went wrong


class Backend:
    """Base class. ``timed`` backends are asked for tokens on every scope; others never are."""

    name = "base"
    timed = False
    # A scope's GPU span covers its children's spans too (wgpu passes belong to the innermost
    # scope); False where each scope has its own event pair (cuda).
    spans_cover_children = False

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def begin(self, name: str, stream: Hashable | None, cpu_ns: int) -> int:
        """Start a GPU span for a scope entered at ``cpu_ns``; returns a token (> 0)."""
        return 0

    def end(self, token: int) -> None:
        """End the GPU span of ``token``."""

    def sync(self) -> None:
        """Wait for all submitted GPU work (with a timeout that ends in a clear error)."""

    def calibrate(self) -> list[CalibrationSample]:
        """Take calibration samples; called at session start, at each sync and at stop."""
        return []

    def collect(self) -> Collected:
        """Raw spans of everything completed since the last collect (called after ``sync``)."""
        return Collected()

    def queues(self) -> list[QueueInfo]:
        return []

    def devices(self) -> list[dict[str, Any]]:
        return []

    def info(self) -> dict[str, Any]:
        """Backend facts for the trace header (versions, timestamp period, …)."""
        return {}

    def close(self) -> None:
        """Release pooled resources."""
