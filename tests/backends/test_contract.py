"""One contract, every backend available here: fake and cpu everywhere, wgpu on a real adapter
(lavapipe in CI, NVIDIA's Vulkan driver on the GPU machine), cuda on a CUDA GPU. Each backend runs
the same instrumented program with real work inside the scopes; the tests check structure and
invariants, never timing values. Backends that cannot run here are skipped with the reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import gputrace
from gputrace.backends import probe
from gputrace.backends.fake import FakeBackend
from gputrace.clock import FakeClock
from gputrace.model import NO_TIME, Flag
from tests import perfetto_rules

# On a real GPU these flags would mean the backend measured something impossible.
IMPOSSIBLE = Flag.GPU_EXCEEDS_WALL | Flag.START_BEFORE_SUBMIT | Flag.OVERLAP | Flag.DEGRADED | Flag.UNTIMED


@dataclass
class Harness:
    name: str
    timed: bool
    session: Callable[[Path | None], gputrace.session]
    work: Callable[[], None]  # GPU work the program does inside a scope
    real_gpu: bool


def _fake() -> Iterator[Harness]:
    def make(path: Path | None) -> gputrace.session:
        clock = FakeClock(1_000_000_000, 1_000)
        fb = FakeBackend(clock, offset_ns=123_456, drift_ppm=2.0, script=lambda n, i: (2_000, 10_000))
        return gputrace.session(path, backend=fb, clock=clock, quiet=True)

    yield Harness("fake", True, make, lambda: None, real_gpu=False)


def _cpu() -> Iterator[Harness]:
    yield Harness("cpu", False, lambda p: gputrace.session(p, backend="cpu", quiet=True), lambda: None, False)


def _wgpu() -> Iterator[Harness]:
    why = probe("wgpu")
    if why is not None:
        pytest.skip(f"wgpu backend unavailable: {why}")
    import wgpu

    from gputrace.backends.wgpu import uninstrument

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None or "timestamp-query" not in adapter.features:
        pytest.skip("no WebGPU adapter with timestamp-query here (install mesa-vulkan-drivers)")
    device = adapter.request_device_sync(required_features=["timestamp-query"])
    shader = """
    @group(0) @binding(0) var<storage, read_write> data: array<f32>;
    @compute @workgroup_size(64)
    fn main(@builtin(global_invocation_id) id: vec3<u32>) {
        if (id.x < arrayLength(&data)) { data[id.x] = data[id.x] * 2.0 + 1.0; }
    }"""
    n = 1 << 14
    buf = device.create_buffer(size=n * 4, usage=wgpu.BufferUsage.STORAGE)
    pipeline = device.create_compute_pipeline(
        layout="auto", compute={"module": device.create_shader_module(code=shader), "entry_point": "main"}
    )
    group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
    )

    def work() -> None:
        encoder = device.create_command_encoder()
        cpass = encoder.begin_compute_pass(label="double")
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, group)
        cpass.dispatch_workgroups(n // 64)
        cpass.end()
        device.queue.submit([encoder.finish()])

    def make(path: Path | None) -> gputrace.session:
        return gputrace.session(path, backend="wgpu", backend_options={"device": device}, quiet=True)

    yield Harness("wgpu", True, make, work, real_gpu=True)
    uninstrument(device)


def _cuda() -> Iterator[Harness]:
    why = probe("cuda")
    if why is not None:
        pytest.skip(f"cuda backend unavailable: {why}")
    import cupy

    x = cupy.ones(1 << 20, dtype=cupy.float32)

    def work() -> None:
        x.__imul__(2.0)

    work()
    cupy.cuda.Device().synchronize()
    yield Harness("cuda", True, lambda p: gputrace.session(p, backend="cuda", quiet=True), work, True)


MAKERS = {"fake": _fake, "cpu": _cpu, "wgpu": _wgpu, "cuda": _cuda}
MARKS = {"wgpu": [pytest.mark.wgpu], "cuda": [pytest.mark.gpu]}


@pytest.fixture(
    scope="module", params=[pytest.param(k, marks=MARKS.get(k, [])) for k in MAKERS], ids=list(MAKERS)
)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    yield from MAKERS[request.param]()


def program(h: Harness, path: Path | None = None, steps: int = 6) -> gputrace.Trace:
    """outer{inner × 2} per step, a sync every other step, one scope that raises."""
    with h.session(path) as s:
        for step in range(steps):
            with gputrace.trace("outer", step=step):
                for _ in range(2):
                    with gputrace.trace("inner"):
                        h.work()
            if step % 2:
                gputrace.sync()
        try:
            with gputrace.trace("raises"):
                h.work()
                raise KeyError("user error")
        except KeyError:
            pass
    assert s.trace is not None
    return s.trace


def test_every_scope_is_recorded_and_nested(harness: Harness) -> None:
    t = program(harness)
    assert [len(t.find(n)) for n in ("outer", "inner", "raises")] == [6, 12, 1]
    for sc in t.find("inner"):
        parent = t.scope(sc.parent)
        assert parent.name == "outer" and sc.depth == 1
        assert parent.cpu_start_ns <= sc.cpu_start_ns <= sc.cpu_end_ns <= parent.cpu_end_ns
    (r,) = t.find("raises")
    assert r.flags & Flag.ERROR and r.args == {"exception": "KeyError"}


def test_gpu_times_are_consistent(harness: Harness) -> None:
    t = program(harness)
    s = t.scopes
    timed = s.gpu_start_ns != NO_TIME
    if not harness.timed:
        assert not timed.any() and not (s.flags & int(Flag.UNTIMED)).any()
        return
    assert timed.all(), [sc.name for sc in t if sc.gpu_start_ns is None]
    assert (s.gpu_start_ns <= s.gpu_end_ns).all()
    assert (s.submit_ns != NO_TIME).all() and (s.queue >= 0).all() and (s.uncertainty_ns > 0).all()
    # every GPU span lies between the session's start and its end, within the stated uncertainty
    start, end = t.header["start_ns"], t.header["end_ns"]
    assert (s.gpu_start_ns >= start - s.uncertainty_ns).all()
    assert (s.gpu_end_ns <= end + s.uncertainty_ns).all()
    if harness.real_gpu:
        bad = [(sc.name, sc.flag_names) for sc in t if sc.flags & int(IMPOSSIBLE)]
        assert not bad, bad
        # the ancestors' GPU spans cover their children's on one queue
        for sc in t.find("inner"):
            p = t.scope(sc.parent)
            if p.queue == sc.queue:
                assert p.gpu_start_ns <= sc.gpu_start_ns + p.uncertainty_ns  # type: ignore[operator]
                assert sc.gpu_end_ns <= p.gpu_end_ns + p.uncertainty_ns  # type: ignore[operator]


def test_calibration_is_refreshed_at_each_sync(harness: Harness) -> None:
    t = program(harness)
    if not harness.timed:
        assert t.header["clock"] == []
        return
    (fit,) = t.header["clock"]
    assert fit["samples"] >= 4  # start, three syncs, stop: some may be dropped as too wide
    assert fit["uncertainty_ns"] > 0 and np.isfinite(fit["slope"])
    assert fit["first_cpu_ns"] < fit["last_cpu_ns"]


def test_written_file_obeys_perfetto_rules_and_round_trips(harness: Harness, tmp_path: Path) -> None:
    path = tmp_path / f"{harness.name}.trace.json.gz"
    t = program(harness, path)
    assert perfetto_rules.check(perfetto_rules.read(path)) == []
    back = gputrace.load(path)
    for col in t.scopes.COLUMNS:
        assert np.array_equal(getattr(t.scopes, col), getattr(back.scopes, col)), col
    assert back.names == t.names and back.queues == t.queues


def test_scopes_entered_with_no_session_cost_nothing_and_record_nothing(harness: Harness) -> None:
    with gputrace.trace("before"):
        harness.work()
    t = program(harness, steps=2)
    assert t.find("before") == []
