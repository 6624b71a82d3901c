"""Fault injection: every backend method, wgpu hook and post-recording stage raises at its 1st,
Nth and every call, and the program still returns its own result, gets at most one warning, and
leaves a trace file that loads.

Backends: fake and cpu here; wgpu on a real adapter (lavapipe in CI); cuda (CuPy) on a GPU
machine, marked ``gpu``. Under ``gputrace run`` (a subprocess) the program's exit status is
checked too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gputrace
from gputrace import streaming
from gputrace.backends.base import Backend
from gputrace.backends.cpu import CpuBackend
from gputrace.backends.fake import FakeBackend
from gputrace.exporters import chrome
from gputrace.exporters import json as json_format
from gputrace.model import Flag
from tests.faults import Fault, inject

session_mod = importlib.import_module("gputrace.session")  # the module, not gputrace.session()
ROOT = Path(__file__).resolve().parents[1]
STEPS = 6
MODES = ("first", "nth", "every")
BACKEND_METHODS = ("begin", "end", "sync", "calibrate", "collect", "queues", "devices", "info", "close")
# Stages after recording: (module, function). ``Encoder.encode`` is the exporter proper;
# ``StreamWriter._write`` the file write (a non-OSError there is a bug, not a full disk). A session
# with a path streams (chunks at each sync and at stop: ``streaming``'s drain and resolve); with
# ``stream=False`` it drains, resolves and writes at stop (``session``'s).
STAGES: dict[str, tuple[Any, str]] = {
    "drain": (session_mod, "drain"),
    "resolve": (session_mod, "resolve"),
    "export": (chrome.Encoder, "encode"),
    "write": (json_format.StreamWriter, "_write"),
}
STREAM_STAGES: dict[str, tuple[Any, str]] = {
    "drain": (streaming, "raw_thread"),
    "resolve": (streaming, "resolve"),
    "export": (chrome.Encoder, "encode"),
    "write": (json_format.StreamWriter, "_write"),
}
# Points whose failure costs some step its GPU times: such steps must say so (flag and reason).
LOSES_GPU_TIMES = {
    "begin",
    "end",
    "writes",
    "resolve_hook",
    "submitted",
    "attach",
    "timestamp_period",
    "query_page",
}
ONCE = {"queues", "devices", "info", "close", "drain", "resolve", "attach", "timestamp_period"}


def _cases(points: list[str]) -> list[tuple[str, str]]:
    """Each point with each mode; points called once per session get no separate "nth" run."""
    return [(p, m) for p in points for m in MODES if not (m == "nth" and p in ONCE)]


def _target(point: str, backend_cls: type) -> tuple[Any, str]:
    return STAGES.get(point, (backend_cls, point))


def _stage_options(point: str) -> dict[str, Any]:
    """The write-at-stop path for its own stages; streaming (the default) elsewhere."""
    return {"stream": False} if point in STAGES else {}


def _run(
    make_backend: Callable[[], Backend | str],
    program: Callable[[], Any],
    target: tuple[Any, str],
    mode: str,
    out: Path,
    **options: Any,
) -> tuple[Any, Fault, list[str], gputrace.Trace]:
    """Run ``program`` in a session with the fault injected; return what the checks need."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with inject(*target, mode) as fault:
            with gputrace.session(out, backend=make_backend(), quiet=True, **options):
                result = program()
    msgs = [str(w.message) for w in caught if issubclass(w.category, gputrace.GputraceWarning)]
    others = [str(w.message) for w in caught if not issubclass(w.category, gputrace.GputraceWarning)]
    assert not others, others
    return result, fault, msgs, gputrace.load(out)


def _check(point: str, mode: str, fault: Fault, msgs: list[str], t: gputrace.Trace, *, gpu: bool) -> None:
    assert fault.calls > 0, f"{fault.where} was never called: the suite tests nothing there"
    assert fault.fired == (fault.calls if mode == "every" else int(mode == "first" or fault.calls >= 3))
    assert len(msgs) <= 1, msgs
    assert (len(msgs) == 1) == (fault.fired > 0), msgs
    steps = t.find("step")
    if point == "drain":
        assert len(steps) in (0, STEPS)  # lost in one piece, and said so
    else:
        assert len(steps) == STEPS
    if gpu:  # every step ran GPU work: a lost GPU time is "degraded", never "empty"
        assert not any(sc.flags & Flag.EMPTY for sc in steps)
    if fault.fired:
        assert t.header.get("problems"), "the file does not say what went wrong"
    if fault.fired and gpu and point in LOSES_GPU_TIMES and mode != "nth":
        lost = [sc for sc in steps if sc.flags & Flag.DEGRADED]
        assert lost and all(sc.args.get("degraded") for sc in lost if not sc.args.get("unclosed"))


# fake and cpu ----------------------------------------------------------------------------------------
def _cpu_program() -> int:
    total = 0
    for i in range(STEPS):
        with gputrace.trace("step", i=i):
            total += i
        if i == 2:
            gputrace.sync()
    return total


@pytest.mark.parametrize(("point", "mode"), _cases([*BACKEND_METHODS, *STAGES]))
def test_fake_backend(point: str, mode: str, tmp_path: Path) -> None:
    result, fault, msgs, t = _run(
        lambda: FakeBackend(gputrace.clock.session_clock),
        _cpu_program,
        _target(point, FakeBackend),
        mode,
        tmp_path / "t.json",
        **_stage_options(point),
    )
    assert result == sum(range(STEPS))
    _check(point, mode, fault, msgs, t, gpu=True)


CPU_METHODS = ["sync", "calibrate", "collect", "queues", "devices", "info", "close"]


@pytest.mark.parametrize(("point", "mode"), _cases([*CPU_METHODS, *STAGES]))
def test_cpu_backend(point: str, mode: str, tmp_path: Path) -> None:
    result, fault, msgs, t = _run(
        lambda: "cpu", _cpu_program, _target(point, CpuBackend), mode, tmp_path / "t.json",
        **_stage_options(point),
    )  # fmt: skip
    assert result == sum(range(STEPS))
    _check(point, mode, fault, msgs, t, gpu=False)


@pytest.mark.parametrize(("point", "mode"), _cases([*STREAM_STAGES]))
def test_streamed_session_stages(point: str, mode: str, tmp_path: Path) -> None:
    """A fault while a chunk is resolved, encoded or written: the program goes on, one warning,
    the file loads, and a lost chunk is said so (the header's problems, or an early end)."""
    result, fault, msgs, t = _run(
        lambda: FakeBackend(gputrace.clock.session_clock), _cpu_program, STREAM_STAGES[point], mode,
        tmp_path / "t.json",
    )  # fmt: skip
    assert result == sum(range(STEPS))
    assert fault.calls > 0, f"{fault.where} was never called: the suite tests nothing there"
    assert len(msgs) == (1 if fault.fired else 0), msgs
    steps = t.find("step")
    assert len(steps) <= STEPS
    if fault.fired:
        assert t.header.get("problems") or t.header.get("truncated"), "the file does not say what went wrong"
    else:
        assert len(steps) == STEPS


def test_a_backend_that_fails_to_start_falls_back_to_cpu(tmp_path: Path) -> None:
    with inject(FakeBackend, "__init__", "every"):
        out = tmp_path / "t.json"
        result, _, msgs, t = _run(lambda: "fake", _cpu_program, (Backend, "close"), "nth", out)
    assert result == sum(range(STEPS)) and len(msgs) == 1 and "failed to start" in msgs[0]
    assert t.header["backend"] == "cpu" and len(t.find("step")) == STEPS


def test_backend_queues_failing_with_spans_on_several_queues(tmp_path: Path) -> None:
    def program() -> int:
        for i in range(STEPS):
            with gputrace.trace("step", stream=i % 3):
                pass
        return 1

    result, _, msgs, t = _run(
        lambda: FakeBackend(gputrace.clock.session_clock), program, (FakeBackend, "queues"), "every",
        tmp_path / "t.json",
    )  # fmt: skip
    assert result == 1 and len(msgs) == 1 and len(t.find("step")) == STEPS
    assert len(t.queues) == 3  # stand-ins for the queues the backend could not name


# gputrace run: the program's exit status survives a fault in every stage -----------------------------
PROGRAM = """
import sys
sys.path.insert(0, {root!r})
import importlib
import gputrace
from gputrace import streaming
from gputrace.exporters import chrome
from gputrace.exporters import json as json_format
from gputrace.backends.cpu import CpuBackend
from tests.faults import inject
target = {{"drain": (streaming, "raw_thread"), "resolve": (streaming, "resolve"),
          "export": (chrome.Encoder, "encode"), "write": (json_format.StreamWriter, "_write"),
          "sync": (CpuBackend, "sync"), "info": (CpuBackend, "info")}}[sys.argv[1]]
held = inject(*target, "every")  # kept: a dropped context manager would undo it
held.__enter__()
for i in range(6):
    with gputrace.trace("step", i=i):
        pass
print("result", 42)
sys.exit(3)
"""


@pytest.mark.parametrize("point", ["drain", "resolve", "export", "write", "sync", "info"])
def test_gputrace_run_keeps_the_exit_status_and_writes_a_trace(point: str, tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM.format(root=str(ROOT)))
    out = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "gputrace", "run", "-o", str(out), "--backend", "cpu", str(script), point],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "result 42\n"
    assert "Traceback" not in done.stderr
    assert done.stderr.count("GputraceWarning") == 1, done.stderr
    t = gputrace.load(out)
    steps = len(t.find("step"))
    if point in ("sync", "info"):
        assert steps == 6
    else:  # a stage of the streamed file failing every time: its chunks are lost, and said so
        assert steps <= 6 and (steps == 6 or t.header.get("problems") or t.header.get("truncated"))


# wgpu on a real adapter ------------------------------------------------------------------------------
SHADER = """
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < arrayLength(&data)) { data[i] = data[i] * 2.0 + 1.0; }
}
"""


@pytest.fixture(scope="module")
def wgpu_device() -> Any:
    try:
        import wgpu
    except ImportError as exc:
        pytest.skip(f"wgpu-py is not installed ({exc})")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:
        pytest.skip(f"no WebGPU adapter here ({exc}); install mesa-vulkan-drivers for lavapipe")
    if adapter is None or "timestamp-query" not in adapter.features:
        pytest.skip("no WebGPU adapter with timestamp-query here; install mesa-vulkan-drivers")
    return adapter.request_device_sync(required_features=["timestamp-query"])


def _wgpu_program(device: Any) -> Callable[[], Any]:
    import numpy as np
    import wgpu

    n = 256
    buf = device.create_buffer(size=n * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    module = device.create_shader_module(code=SHADER)
    pipeline = device.create_compute_pipeline(
        layout="auto", compute={"module": module, "entry_point": "main"}
    )
    group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
    )

    def program() -> list[float]:
        for i in range(STEPS):
            with gputrace.trace("step", i=i):
                enc = device.create_command_encoder()
                cpass = enc.begin_compute_pass()
                cpass.set_pipeline(pipeline)
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(n // 64)
                cpass.end()
                device.queue.submit([enc.finish()])
            if i == 2:
                gputrace.sync()
        data = np.frombuffer(device.queue.read_buffer(buf), np.float32)
        return sorted(set(data.tolist()))

    return program


def _wgpu_points() -> dict[str, tuple[str, str]]:
    """Point name -> (module, attribute) of every wgpu backend method and hook."""
    pts = {m: ("gputrace.backends.wgpu:WgpuBackend", m) for m in BACKEND_METHODS}
    pts.update(
        {
            "attach": ("gputrace.backends.wgpu:WgpuBackend", "attach"),
            "timestamp_period": ("gputrace.backends.wgpu_queries", "timestamp_period"),
            "writes": ("gputrace.backends.wgpu_hooks:DeviceTracer", "writes"),
            "resolve_hook": ("gputrace.backends.wgpu_hooks:DeviceTracer", "resolve"),
            "submitted": ("gputrace.backends.wgpu_hooks:DeviceTracer", "submitted"),
            "tracer_collect": ("gputrace.backends.wgpu_hooks:DeviceTracer", "collect"),
            "query_page": ("gputrace.backends.wgpu_hooks", "QueryPage"),
            "calibration_sample": ("gputrace.backends.wgpu:Calibrator", "sample"),
            "work_done_wait": ("gputrace.backends.wgpu_queries:WorkDone", "wait"),
        }
    )
    return pts


def _resolve_target(spec: tuple[str, str]) -> tuple[Any, str]:
    modname, _, cls = spec[0].partition(":")
    obj: Any = importlib.import_module(modname)
    if cls:
        obj = getattr(obj, cls)
    return obj, spec[1]


@pytest.mark.wgpu
@pytest.mark.parametrize(("point", "mode"), _cases([*_wgpu_points(), *STAGES]))
def test_wgpu_backend(point: str, mode: str, wgpu_device: Any, tmp_path: Path) -> None:
    from gputrace.backends.wgpu import uninstrument

    program = _wgpu_program(wgpu_device)
    wgpu_device.__dict__.pop("_gputrace_pool", None)  # no pooled query pages: make new ones
    expected = program()  # untraced: what the program computes on its own
    target = STAGES[point] if point in STAGES else _resolve_target(_wgpu_points()[point])
    try:
        result, fault, msgs, t = _run(
            lambda: "wgpu",
            program,
            target,
            mode,
            tmp_path / "t.json",
            backend_options={"device": wgpu_device, "page_queries": 4, "calibration_samples": 1},
            **_stage_options(point),
        )
    finally:
        uninstrument(wgpu_device)
    assert result == [(expected[0] + 1) * 2**STEPS - 1]
    _check(point, mode, fault, msgs, t, gpu=True)


# cuda (CuPy) on a GPU machine ---------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("timing", ["events", "cupti"])
@pytest.mark.parametrize(("point", "mode"), _cases([*BACKEND_METHODS, *STAGES]))
def test_cuda_backend(point: str, mode: str, timing: str, tmp_path: Path) -> None:
    cupy = pytest.importorskip("cupy", reason="the cuda backend needs CuPy")
    from gputrace.backends import probe

    why = probe("cuda")
    if why is not None:
        pytest.skip(f"cuda backend unavailable: {why}")
    cls: type
    if timing == "cupti":
        from gputrace.backends import cupti

        if cupti.probe() is not None:
            pytest.skip(f"CUPTI timing unavailable: {cupti.probe()}")
        if point in ("begin", "end"):
            pytest.skip("CUPTI timing asks for no token per scope: begin/end are never called")
        from gputrace.backends.cupti import CuptiBackend as cls
    else:
        from gputrace.backends.cuda_events import CudaEventsBackend as cls

    x = cupy.zeros(256, cupy.float32)

    def program() -> float:
        for i in range(STEPS):
            with gputrace.trace("step", i=i):
                x[...] += 1
            if i == 2:
                gputrace.sync()
        return float(x.sum())

    result, fault, msgs, t = _run(
        lambda: "cuda", program, _target(point, cls), mode, tmp_path / "t.json",
        backend_options={"timing": timing}, **_stage_options(point),
    )  # fmt: skip
    assert result == 256.0 * STEPS
    _check(point, mode, fault, msgs, t, gpu=True)
