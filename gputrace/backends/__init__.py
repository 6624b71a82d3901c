"""Backends, imported lazily by name so ``import gputrace`` never imports cupy or wgpu.

Each module has ``probe() -> str | None`` (why it cannot be used here, or None) and one Backend
class. ``auto`` tries cuda, then wgpu, then falls back to cpu with one notice saying why.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from gputrace.backends.base import Backend, Clock
from gputrace.errors import GputraceError, notice

# name -> (module, class)
BACKENDS: dict[str, tuple[str, str]] = {
    "cuda": ("gputrace.backends.cuda", "CudaBackend"),
    "wgpu": ("gputrace.backends.wgpu", "WgpuBackend"),
    "cpu": ("gputrace.backends.cpu", "CpuBackend"),
    "fake": ("gputrace.backends.fake", "FakeBackend"),
}
AUTO_ORDER = ("cuda", "wgpu")
# the cuda backend's timing sources (``session(timing=)``, ``backend_options={"timing": ...}``)
TIMINGS = ("auto", "cupti", "events")


def probe(name: str, *, auto: bool = False) -> str | None:
    """Why backend ``name`` can't be used on this machine, or None if it can. ``auto``: asked for
    ``backend="auto"``, which a module's ``probe`` taking ``auto`` may answer more strictly (wgpu)."""
    return _probe(name, auto)[0]


def _probe(name: str, auto: bool) -> tuple[str | None, bool]:
    """``probe``'s answer, and whether probing itself raised (a fault, not the user's to fix)."""
    modname, _ = BACKENDS[name]
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:
        return f"its module could not be imported ({exc})", False
    try:
        if "auto" in inspect.signature(mod.probe).parameters:
            reason: str | None = mod.probe(auto=auto)
        else:
            reason = mod.probe()
    except Exception as exc:  # a broken driver must not break the user's program
        return f"probing it failed ({type(exc).__name__}: {exc})", True
    return reason, False


def option_names(name: str) -> tuple[str, ...]:
    """The ``backend_options`` keys backend ``name`` takes: its module's ``OPTIONS``, or else the
    keyword-only parameters of its class."""
    modname, clsname = BACKENDS[name]
    mod = importlib.import_module(modname)
    params = inspect.signature(getattr(mod, clsname)).parameters.values()
    own = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return tuple(getattr(mod, "OPTIONS", own))


def check_options(name: str, options: dict[str, Any], valid: tuple[str, ...] | None = None) -> None:
    """A ``GputraceError`` naming the valid keys when ``options`` holds one that backend ``name``
    (or ``valid``, for "auto") does not take: a typo must not quietly record CPU times only."""
    valid = option_names(name) if valid is None else valid
    unknown = sorted(set(options) - set(valid))
    if unknown:
        what = ", ".join(repr(k) for k in unknown)
        takes = f"its options are {', '.join(sorted(valid))}" if valid else "it takes none"
        which = "backend auto (cuda or wgpu)" if name == "auto" else f"the {name} backend"
        raise GputraceError(f"unknown backend option {what} for {which}; {takes}.")


def with_timing(backend: str | Backend, options: dict[str, Any], timing: str) -> dict[str, Any]:
    """``options`` with ``timing`` in them, for a backend that has timing sources (cuda)."""
    if timing not in TIMINGS:
        raise GputraceError(f"unknown timing {timing!r}; choose one of {', '.join(TIMINGS)}.")
    if timing == "auto":
        return options
    if options.get("timing", timing) != timing:
        raise GputraceError(
            f"timing={timing!r} and backend_options={{'timing': {options['timing']!r}}} disagree; give one."
        )
    name = backend if isinstance(backend, str) else getattr(backend, "name", "given")
    if name not in ("auto", "cuda"):
        raise GputraceError(
            f"timing={timing!r} chooses how the cuda backend times GPU work; the {name} backend "
            "has no such choice (leave timing as 'auto')."
        )
    if not isinstance(backend, str):
        raise GputraceError(
            f"timing={timing!r} applies to a backend gputrace creates, not to one given ready-made."
        )
    return {**options, "timing": timing}


def create(name: str, clock: Clock, *, quiet: bool = False, **options: Any) -> Backend:
    """Create backend ``name`` ("auto", "cuda", "wgpu", "cpu" or "fake") with ``options`` it takes
    (for "auto", ones cuda or wgpu takes, each candidate given its own)."""
    if name == "auto":
        takes = {cand: option_names(cand) for cand in AUTO_ORDER}
        check_options(name, options, tuple(sorted({k for ks in takes.values() for k in ks})))
        reasons = []
        for cand in AUTO_ORDER:
            why = probe(cand, auto=True)
            if why is None:
                mine = {k: v for k, v in options.items() if k in takes[cand]}
                try:
                    backend = _instantiate(cand, clock, **mine)
                except GputraceError as exc:
                    why = str(exc)
                else:
                    if not quiet:
                        notice(f"backend auto chose {cand}.")
                    return backend
            reasons.append(f"{cand}: {why}")
        if not quiet:
            notice(f"no GPU backend is usable ({'; '.join(reasons)}); recording CPU times only.")
        return _instantiate("cpu", clock)
    if name not in BACKENDS:
        raise GputraceError(f"unknown backend {name!r}; choose one of auto, {', '.join(BACKENDS)}.")
    check_options(name, options)
    why, faulted = _probe(name, False)
    if faulted:  # the session starts with the cpu backend instead, and says why once
        raise RuntimeError(f"backend {name!r}: {why}")
    if why is not None:
        raise GputraceError(f"backend {name!r} is not usable here: {why}.")
    return _instantiate(name, clock, **options)


def _instantiate(name: str, clock: Clock, **options: Any) -> Backend:
    modname, clsname = BACKENDS[name]
    backend: Backend = getattr(importlib.import_module(modname), clsname)(clock, **options)
    return backend
