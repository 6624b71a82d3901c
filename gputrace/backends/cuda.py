"""The cuda backend (CuPy), with two timing sources behind one name (docs/cupti.md: what each sees).

- ``timing="cupti"``: libcupti through ctypes, its buffers decoded in bulk (``cupti``,
  ``cupti_lib``, ``cupti_records``): every kernel, memcpy and memset with its launch call and exact
  GPU start/end, attributed to the innermost scope open on the launching thread; graph replays too.
- ``timing="events"``: a pooled CUDA event pair per scope (``cuda_events``): one span per scope;
  the fallback, and the path that coexists with other CUPTI clients.
- ``timing="auto"`` (the default): CUPTI where it can be used (libcupti 13.x found, no
  torch.profiler recording), else events; one notice when another profiler is the reason.
"""

from __future__ import annotations

from typing import Any

from gputrace.backends import TIMINGS
from gputrace.backends.base import Backend, Clock
from gputrace.backends.cuda_events import CudaEventsBackend, probe
from gputrace.errors import GputraceError, notice

__all__ = ["CudaBackend", "probe"]

_CUPTI_OPTIONS = ("buffer_bytes", "flush_period_ms", "api_filter")
_EVENTS_OPTIONS = ("sync_timeout_s", "anchor_every_ns")
# every backend_options key the cuda backend takes, whichever timing source it picks
OPTIONS = ("timing", "samples", *_CUPTI_OPTIONS, *_EVENTS_OPTIONS)


def CudaBackend(clock: Clock, *, timing: str = "auto", **options: Any) -> Backend:
    """The cuda backend with the timing source ``timing`` picks (see the module docstring), given
    the options (``OPTIONS``) that source takes."""
    if timing not in TIMINGS:
        raise GputraceError(f"unknown timing {timing!r}; choose one of {', '.join(TIMINGS)}.")
    cannot = probe()
    if cannot is not None:
        raise GputraceError(f"the cuda backend is not usable here: {cannot}.")
    why = ""
    if timing in ("auto", "cupti"):
        from gputrace.backends import cupti

        no_cupti = cupti.probe()
        if no_cupti is None and timing == "auto":
            no_cupti = cupti.torch_loaded()
        refused = False  # libcupti is there but CUPTI could not be used (version, start-up)
        if no_cupti is None:
            try:
                opts = {k: v for k, v in options.items() if k not in _EVENTS_OPTIONS}
                return cupti.create(clock, **opts)
            except GputraceError as exc:
                no_cupti, refused = str(exc), True
        why = no_cupti
        if timing == "cupti":
            raise GputraceError(f"timing='cupti' is not usable here: {why}.")
        if refused or "holds CUPTI" in why or "torch is loaded" in why:
            notice(f"{why}; timing the cuda backend with CUDA events instead.")
    opts = {k: v for k, v in options.items() if k not in _CUPTI_OPTIONS}
    backend = CudaEventsBackend(clock, **opts)
    backend.timing_note = why if timing == "auto" else "timing='events' asked for"
    return backend
