"""A stand-in CuPy for the CUDA events timing: the runtime calls it makes, answered from a script.

``install(monkeypatch)`` puts a ``cupy`` module in ``sys.modules`` whose runtime records each event
at a GPU time the test chooses (``StandIn.gpu_ns``, moved by ``advance``), so
``cudaEventElapsedTime`` has a known answer (a float32 of ms, as CUDA's: 61 ns apart at 1 s);
``pending`` holds events the GPU has not reached (``cudaEventQuery`` says not ready), ``broken``
events whose elapsed-time read fails. With it
``gputrace.backends.cuda_events`` runs in CI: its harvests, pools and anchors, not CUDA itself.
A test double: the package never imports it.
"""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

import numpy as np
import pytest

NOT_READY = 600  # cudaErrorNotReady


class StandIn:
    """The scripted GPU: one clock (ns), events recorded at its current time."""

    def __init__(self) -> None:
        self.gpu_ns = 1_000_000
        self.at: dict[int, int] = {}  # event -> GPU ns it was recorded at
        self.pending: set[int] = set()
        self.broken: set[int] = set()
        self.capturing: set[int] = set()  # stream pointers capturing a graph
        self._ids = itertools.count(1)

    def advance(self, ns: int) -> None:
        self.gpu_ns += ns

    # the runtime calls ---------------------------------------------------------------------
    def event_create(self, flags: int = 0) -> int:
        return next(self._ids)

    def event_record(self, event: int, stream: int) -> None:
        self.at[event] = self.gpu_ns

    def event_query(self, event: int) -> int:
        return NOT_READY if event in self.pending else 0

    def elapsed_ms(self, start: int, end: int) -> float:
        if start in self.broken or end in self.broken:
            raise RuntimeError("cudaErrorInvalidResourceHandle")
        return float(np.float32((self.at[end] - self.at[start]) / 1e6))


class _Stream:
    def __init__(self, non_blocking: bool = False, ptr: int = 0) -> None:
        self.ptr, self.device_id = ptr, 0


class _Device:
    def __init__(self, index: int = 0) -> None:
        pass

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def install(monkeypatch: pytest.MonkeyPatch) -> StandIn:
    """A stand-in ``cupy`` in ``sys.modules`` (one device; the current stream is the null
    stream) for the rest of the test; returns its scripted GPU."""
    gpu = StandIn()
    rt: Any = types.ModuleType("cupy.cuda.runtime")
    rt.eventCreateWithFlags = gpu.event_create
    rt.eventRecord = gpu.event_record
    rt.eventQuery = gpu.event_query
    rt.eventElapsedTime = gpu.elapsed_ms
    rt.eventDestroy = lambda event: None
    rt.streamIsCapturing = lambda ptr: int(ptr in gpu.capturing)
    rt.getDevice = lambda: 0
    rt.setDevice = lambda index: None
    rt.getDeviceCount = lambda: 1
    rt.getDeviceProperties = lambda index: {"name": b"stand-in GPU"}
    rt.driverGetVersion = rt.runtimeGetVersion = lambda: 13000
    cuda: Any = types.ModuleType("cupy.cuda")
    cuda.runtime, cuda.Stream, cuda.Device = rt, _Stream, _Device
    cuda.is_available = lambda: True
    null = _Stream()
    cuda.get_current_stream = lambda: null
    cupy: Any = types.ModuleType("cupy")
    cupy.cuda, cupy.__version__ = cuda, "stand-in"
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.runtime", rt)):
        monkeypatch.setitem(sys.modules, name, module)
    return gpu
