"""The backend contract: what the recorder and the session ask of a GPU backend.

A backend gives the recorder a token per scope (``begin``/``end``, on the hot path), and after a
sync hands the resolver GPU spans in its own clock domain (``collect``) and calibration samples
(``calibrate``). It never aligns clocks: GPU ticks stay raw (in ns by the period) until the resolver.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from gputrace.model import QueueInfo
from gputrace.records import CalibrationSample, Collected, RawSpan, SpanBatch

__all__ = ["Backend", "CalibrationSample", "Clock", "Collected", "RawSpan", "SpanBatch"]

Clock = Callable[[], int]


class Backend:
    """Base class. ``timed`` backends are asked for tokens on every scope; others never are."""

    name = "base"
    timed = False
    # A scope's GPU span covers its children's spans too (wgpu passes belong to the innermost
    # scope); False where each scope has its own event pair (cuda).
    spans_cover_children = False
    # True where a timing source sees every operation by itself (CUPTI): scopes need no token, and
    # their GPU work arrives at a sync (the streamed file writes them then, not on its timer).
    ops_timing = False
    # The half-width (ns) a calibration window reaches on an idle machine; where the tightest is
    # wider (a thread woken late under load), more are taken at start and stop. 0: no target.
    calibration_target_ns = 0

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        # the session's recorder (set by the session): its thread buffers name each thread
        self.recorder: Any = None

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
        return {"name": self.name}

    def close(self) -> None:
        """Release pooled resources."""
