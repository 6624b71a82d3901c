"""The cpu backend: no GPU. Scopes are recorded with their CPU times only."""

from __future__ import annotations

from typing import Any

from gputrace.backends.base import Backend


def probe() -> str | None:
    """Why this backend cannot be used here, or None: the cpu backend always can."""
    return None


class CpuBackend(Backend):
    name = "cpu"
    timed = False

    def info(self) -> dict[str, Any]:
        return {"name": self.name}
