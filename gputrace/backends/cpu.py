"""The cpu backend: no GPU. Scopes are recorded with their CPU times only."""

from __future__ import annotations

from gputrace.backends.base import Backend


def probe() -> str | None:
    """Why this backend cannot be used here, or None: the cpu backend always can."""
    return None


class CpuBackend(Backend):
    """No GPU: the contract's defaults (no tokens, no samples, no spans)."""

    name = "cpu"
