"""The libcupti source on a real GPU: the same buffers decoded by gputrace and by cupti-python,
and kernel counts against torch.profiler's on the same program (each in its own process, since
CUPTI is one per process). Skipped without CuPy, a CUDA device, libcupti or cupti-python."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import child_env

GPU_REASON: str | None
try:
    import cupy

    GPU_REASON = None if cupy.cuda.is_available() else "CuPy sees no CUDA device"
except Exception as exc:  # ImportError, or a CUDA runtime that fails to load
    GPU_REASON = f"CuPy is not usable ({type(exc).__name__})"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPU_REASON is not None, reason=str(GPU_REASON))]
ROOT = Path(__file__).resolve().parents[2]


def test_the_same_buffers_decode_alike_with_cupti_python() -> None:
    cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed")
    from gputrace.backends import cupti_records as cr
    from gputrace.backends.cupti_lib import LibCuptiSource

    x = cupy.zeros(256, cupy.float32)
    x += 1
    cupy.cuda.runtime.deviceSynchronize()
    src = LibCuptiSource()
    src.start()
    try:
        for _ in range(2000):
            x += 1
        cupy.zeros(1 << 16, cupy.uint8)  # a memset
        cupy.asarray(x.get())  # two copies
        src.sync()
        bufs = src.take_buffers()
    finally:
        src.stop()
    cls = {cr.KIND_CONCURRENT_KERNEL: cupti.ActivityKernel13, cr.KIND_DRIVER: cupti.ActivityAPI,
           cr.KIND_RUNTIME: cupti.ActivityAPI, cr.KIND_MEMCPY: cupti.ActivityMemcpy7,
           cr.KIND_MEMSET: cupti.ActivityMemset5}  # fmt: skip
    snake = {"deviceId": "device_id", "streamId": "stream_id", "correlationId": "correlation_id",
             "graphNodeId": "graph_node_id", "graphId": "graph_id", "processId": "process_id",
             "threadId": "thread_id", "returnValue": "return_value", "copyKind": "copy_kind",
             "gridX": "grid_x", "gridY": "grid_y", "gridZ": "grid_z", "blockX": "block_x",
             "blockY": "block_y", "blockZ": "block_z"}  # fmt: skip
    compared = {k: 0 for k in cls}
    for arr, valid in bufs:
        buf = arr[:valid]
        starts, problem = src.decoder.starts(buf)
        assert problem == ""
        base = arr.ctypes.data
        for off in starts.tolist():
            kind = int(buf[off : off + 4].view("<u4")[0])
            dtype = cr.LAYOUTS[kind]
            ours = buf[off : off + dtype.itemsize].view(dtype)[0]
            theirs = cls[kind].from_ptr(base + off)
            for f in dtype.names:
                if f == "name":
                    assert ctypes.string_at(int(ours[f])).decode() == theirs.name
                else:
                    assert int(ours[f]) == int(getattr(theirs, snake.get(f, f))), (kind, f)
            compared[kind] += 1
    assert compared[cr.KIND_CONCURRENT_KERNEL] == 2000 and compared[cr.KIND_MEMSET] >= 1
    assert compared[cr.KIND_MEMCPY] >= 2


PROGRAM = r"""
import json, sys
import cupy
from tests.builders import child_env
x = cupy.zeros(1024, cupy.float32); y = cupy.ones(1024, cupy.float32)
x += 1; x *= y; cupy.cuda.runtime.deviceSynchronize()
def work():
    global x
    for i in range(600):
        x += 1
        x *= y
        if i % 100 == 0:
            cupy.asnumpy(x[:4])
    cupy.cuda.runtime.deviceSynchronize()
if sys.argv[1] == "gputrace":
    import gputrace
    with gputrace.session(backend="cuda", quiet=True, backend_options={"timing": "cupti"}) as s:
        with gputrace.trace("work"):
            work()
    t = s.trace
    print(json.dumps({"kernels": int((t.ops.kind == 0).sum()), "timing": t.header["backend_info"]["timing"]}))
else:
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        work()
    import tempfile, os
    path = os.path.join(tempfile.mkdtemp(), "t.json")
    prof.export_chrome_trace(path)
    ev = json.load(open(path))["traceEvents"]
    print(json.dumps({"kernels": sum(1 for e in ev if e.get("cat") == "kernel")}))
"""


def test_kernel_counts_equal_torch_profilers() -> None:
    pytest.importorskip("torch", reason="torch is not installed")
    env = child_env()
    got = {}
    for who in ("gputrace", "torch"):
        out = subprocess.run([sys.executable, "-c", PROGRAM, who], capture_output=True, text=True, env=env,
                             timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        got[who] = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["gputrace"]["timing"] == "cupti", got
    assert got["gputrace"]["kernels"] == got["torch"]["kernels"] == 1200, got


def test_the_start_up_self_check_passes_and_a_failing_one_falls_back_to_events(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gputrace.backends.cupti_lib")
    from gputrace.backends import cupti

    if cupti.probe() is not None:
        pytest.skip(f"needs CUPTI: {cupti.probe()}")
    import gputrace

    x = cupy.zeros(256, cupy.float32)
    monkeypatch.setattr(cupti, "_self_checked", False)  # (once per process: an earlier test ran it)
    with gputrace.session(backend="cuda", backend_options={"timing": "cupti"}, quiet=True) as s:
        with gputrace.trace("k"):
            x += 1
    info = s.trace.header["backend_info"]
    assert info["timing"] == "cupti" and "self_check" in info["cupti_start_ms"]
    print("self-check ms:", info["cupti_start_ms"])
    monkeypatch.setattr(cupti, "self_check_problem", lambda *a, **k: "a field decoded wrong")
    monkeypatch.setattr(cupti, "_self_checked", False)
    monkeypatch.setattr(cupti, "torch_loaded", lambda: None)  # (pytest's process may hold torch)
    with gputrace.session(backend="cuda", backend_options={"timing": "auto"}) as s2:
        with gputrace.trace("k"):
            x += 1
    assert s2.trace.header["backend_info"]["timing"] == "events"
    err = capsys.readouterr().err
    assert err.count("self-check failed") == 1, err
