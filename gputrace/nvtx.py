"""NVTX ranges for gputrace scopes (``session(nvtx=True)``, ``gputrace run --nvtx``), so Nsight
Systems shows the trace's names on the same threads: from NVIDIA's ``nvtx`` package (domain
"gputrace"), else CuPy's ``cupy.cuda.nvtx`` (the default domain).

The plain path pays nothing: only while such a session is active are ``trace``'s ``__enter__`` and
``__exit__`` swapped for versions that push and pop (``enable``/``disable``, called by the
recorder). An NVTX call that fails is reported once and never reaches the program.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gputrace.errors import GputraceError, report_internal

DOMAIN = "gputrace"
MISSING = "NVTX ranges need NVIDIA's nvtx package (pip install nvtx) or CuPy, and neither is installed."


def _from_nvtx_package() -> tuple[Callable[[str], None], Callable[[], None]]:
    import nvtx

    domain = nvtx.get_domain(DOMAIN)
    attributes: dict[str, Any] = {DOMAIN: domain.get_event_attributes(message=DOMAIN)}  # API check

    def push(name: str) -> None:
        a = attributes.get(name)
        if a is None:
            a = attributes[name] = domain.get_event_attributes(message=name)
        domain.push_range(a)

    return push, domain.pop_range


def _from_cupy() -> tuple[Callable[[str], None], Callable[[], None]]:
    from cupy.cuda import nvtx as cupy_nvtx

    if not getattr(cupy_nvtx, "available", True):
        raise ImportError("CuPy was built without NVTX")
    return cupy_nvtx.RangePush, cupy_nvtx.RangePop


class Ranges:
    """Push/pop of NVTX ranges named after scopes, and the switch that makes scopes use them."""

    def __init__(self, push: Callable[[str], None], pop: Callable[[], None], source: str) -> None:
        self.source = source  # "nvtx" or "cupy"
        self._push_pop = push, pop
        self._saved: tuple[Any, Any] | None = None  # trace's own enter/exit while enabled

    def enable(self) -> None:
        """Make every ``trace`` scope also an NVTX range, until ``disable``."""
        from gputrace.recorder import trace

        if self._saved is not None:
            return
        enter, leave = trace.__enter__, trace.__exit__
        push, pop = self._push_pop
        local = threading.local()  # per thread: the scopes that pushed a range, innermost last

        def __enter__(self: trace) -> trace:
            try:
                push(self.name)
                local.__dict__.setdefault("pushed", []).append(self)  # (this thread's own dict)
            except Exception as exc:
                report_internal("nvtx:push", f"an NVTX range could not be pushed ({exc!r}).")
            return enter(self)  # type: ignore[no-any-return]

        def __exit__(self: trace, *exc_info: Any) -> None:
            try:
                leave(self, *exc_info)
            finally:
                pushed = getattr(local, "pushed", None)
                if pushed and pushed[-1] is self:  # scopes entered before ``enable`` pushed none
                    pushed.pop()
                    try:
                        pop()
                    except Exception as exc:
                        report_internal("nvtx:pop", f"an NVTX range could not be popped ({exc!r}).")

        self._saved = (enter, leave)
        trace.__enter__ = __enter__  # type: ignore[method-assign]
        trace.__exit__ = __exit__  # type: ignore[method-assign,assignment]

    def disable(self) -> None:
        """Back to plain scopes. A scope still open keeps its range open (NVTX shows it running
        to the end of the program): stop sessions outside scopes."""
        from gputrace.recorder import trace

        if self._saved is None:
            return
        trace.__enter__, trace.__exit__ = self._saved  # type: ignore[method-assign]
        self._saved = None


def load() -> Ranges:
    """NVTX push/pop from the nvtx package, else CuPy; ``GputraceError`` with one sentence if neither."""
    for source, make in (("nvtx", _from_nvtx_package), ("cupy", _from_cupy)):
        try:
            push, pop = make()
        except Exception:  # not installed, or unusable here: try the next
            continue
        return Ranges(push, pop, source)
    raise GputraceError(MISSING)
