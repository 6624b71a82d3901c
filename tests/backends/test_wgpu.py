"""The wgpu backend, on a real adapter: Mesa's lavapipe in CI, NVIDIA's Vulkan driver on the GPU
machine. Tests that need an adapter are marked ``wgpu`` and skipped, with the reason, without one.

On lavapipe the GPU clock is CLOCK_MONOTONIC, the session clock, so raw GPU times can be checked
exactly against the CPU windows around them; elsewhere the checks allow the stated uncertainty.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import gputrace
from gputrace.backends.base import CalibrationSample, Collected, RawSpan
from gputrace.backends.wgpu_queries import ticks_to_ns
from gputrace.errors import GputraceError
from tests.builders import wgpu_adapter

ROOT = Path(__file__).resolve().parents[2]

SHADER = """
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < arrayLength(&data)) { data[i] = data[i] * 2.0 + 1.0; }
}
"""
N = 1 << 14


# ticks → ns (no adapter needed) ------------------------------------------------------------------
@pytest.mark.parametrize("period", [1.0, 2.5, 0.5, 83.333333, 52.08333206176758, 40.0])
def test_ticks_to_ns_is_exact_for_the_period_as_a_fraction(period: float) -> None:
    ticks = np.array([0, 1, 7, 12_000_000, 10**15 + 3, 1_764_000_000_000_000 // 84], np.uint64)
    got = ticks_to_ns(ticks, period).tolist()
    frac = Fraction(period).limit_denominator(1 << 20)
    want = [int(t) * frac.numerator // frac.denominator for t in ticks.tolist()]
    assert got == want
    # the fraction is the period to float precision
    assert abs(float(frac) - period) <= period * 1e-9


def test_ticks_to_ns_keeps_epoch_sized_values_exact() -> None:
    # NVIDIA counts ns since 1970: a float multiply would round these to 256 ns steps
    ticks = np.array([1_764_000_000_123_456_789, 1_764_000_000_123_456_790], np.uint64)
    assert ticks_to_ns(ticks, 1.0).tolist() == [1_764_000_000_123_456_789, 1_764_000_000_123_456_790]
    assert ticks_to_ns(ticks // 4, 4.0).tolist() == [1_764_000_000_123_456_788] * 2


def test_ticks_to_ns_refuses_a_nonpositive_period() -> None:
    with pytest.raises(GputraceError, match="positive"):
        ticks_to_ns(np.array([1], np.uint64), 0.0)


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_auto_skips_wgpu_for_programs_that_do_not_import_it() -> None:
    code = (
        "import sys, gputrace\n"
        "from gputrace.backends import wgpu as w, probe\n"
        "print(w.probe())\n"
        "print(probe('wgpu', auto=True))\n"
        "print('wgpu' in sys.modules)\n"
    )
    lines = _run(code).splitlines()
    assert "has not imported wgpu" in lines[0]
    assert "has not imported wgpu" in lines[1]
    assert lines[2] == "False"  # asking did not import it either


def test_explicit_wgpu_only_needs_wgpu_importable() -> None:
    pytest.importorskip("wgpu")
    assert _run("from gputrace.backends import probe; print(probe('wgpu'))") == "None"


def test_bad_options_are_one_clear_error() -> None:
    pytest.importorskip("wgpu")
    from gputrace.backends.wgpu import WgpuBackend

    for opts in ({"timeout_s": 0}, {"timestamp_period": -1.0}, {"page_queries": 3}):
        with pytest.raises(GputraceError):
            WgpuBackend(time.perf_counter_ns, **opts)  # type: ignore[arg-type]


# a real adapter ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def adapter() -> Any:
    a = wgpu_adapter()
    if "timestamp-query" not in a.features:
        pytest.skip(f"adapter {a.info['device']!r} has no timestamp-query support")
    return a


@pytest.fixture(scope="module")
def raw_device(adapter: Any) -> Any:
    return adapter.request_device_sync(required_features=["timestamp-query"])


@pytest.fixture
def device(raw_device: Any) -> Any:
    from gputrace.backends.wgpu import uninstrument

    yield raw_device
    uninstrument(raw_device)


@pytest.fixture
def on_lavapipe(adapter: Any) -> bool:
    return bool(adapter.info.get("vendor") == "llvmpipe")


class Kernel:
    """A storage buffer and a doubling kernel over it."""

    def __init__(self, device: Any, n: int = N) -> None:
        import wgpu

        self.device = device
        self.n = n
        self.buf = device.create_buffer(
            size=n * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        )
        module = device.create_shader_module(code=SHADER)
        self.pipeline = device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"}
        )
        self.bind_group = device.create_bind_group(
            layout=self.pipeline.get_bind_group_layout(0),
            entries=[{"binding": 0, "resource": {"buffer": self.buf}}],
        )

    def record(self, encoder: Any, label: str = "", **kw: Any) -> None:
        cpass = encoder.begin_compute_pass(label=label, **kw)
        cpass.set_pipeline(self.pipeline)
        cpass.set_bind_group(0, self.bind_group)
        cpass.dispatch_workgroups(-(-self.n // 64))
        cpass.end()

    def finish_wait(self) -> None:
        """Block until the queue is idle (a read-back)."""
        self.device.queue.read_buffer(self.buf, 0, 16)


def _recording_backend(**opts: Any) -> Any:
    from gputrace.backends.wgpu import WgpuBackend

    class Recording(WgpuBackend):
        """Keeps what the resolver is given, to check raw GPU times."""

        def __init__(self, clock: Any, **kw: Any) -> None:
            super().__init__(clock, **kw)
            self.seen_spans: list[RawSpan] = []
            self.seen_samples: list[CalibrationSample] = []

        def calibrate(self) -> list[CalibrationSample]:
            got = super().calibrate()
            self.seen_samples.extend(got)
            return got

        def collect(self) -> Collected:
            got = super().collect()
            self.seen_spans.extend(got.spans)
            return got

    return Recording(gputrace.clock.session_clock, **opts)


@pytest.mark.wgpu
def test_every_pass_lies_between_its_submit_and_its_completion(
    device: Any, on_lavapipe: bool, tmp_path: Path
) -> None:
    k = Kernel(device)
    backend = _recording_backend(device=device)
    windows: list[tuple[int, int]] = []  # per step: (scope entered, queue known idle)
    with gputrace.session(tmp_path / "t.json", backend=backend) as s:
        for i in range(6):
            with gputrace.trace("step", i=i):
                t0 = time.perf_counter_ns()
                enc = device.create_command_encoder()
                k.record(enc, label="blur")
                k.record(enc)
                device.queue.submit([enc.finish()])
            k.finish_wait()
            windows.append((t0, time.perf_counter_ns()))
            if i == 2:
                gputrace.sync()
    t = s.trace
    assert t is not None
    steps = t.find("step")
    assert len(steps) == 6 and len(t.spans) == 12
    assert [t.names[x] for x in t.spans.label.tolist()] == ["blur", "compute pass #2"] * 6
    for row, sc in enumerate(steps):
        lo, hi = windows[row]
        unc = sc.uncertainty_ns
        assert sc.submit_ns is not None and lo <= sc.submit_ns <= hi
        mine = np.flatnonzero(t.spans.scope == sc.index)
        assert len(mine) == 2
        # the scope's GPU span is the hull of its passes
        assert sc.gpu_start_ns == t.spans.gpu_start_ns[mine].min()
        assert sc.gpu_end_ns == t.spans.gpu_end_ns[mine].max()
        for j in mine.tolist():
            start, end = int(t.spans.gpu_start_ns[j]), int(t.spans.gpu_end_ns[j])
            assert sc.submit_ns - unc <= start <= end <= hi + unc
        assert not {"gpu_exceeds_wall", "start_before_submit", "overlap", "degraded"} & set(sc.flag_names)
    fit = t.clock_fits[0]
    assert fit.samples >= 4
    raw = sorted(backend.seen_spans, key=lambda r: (r.gpu_start_ns, r.label))
    assert len(raw) == 12
    for r in raw:
        assert r.submit_ns <= r.done_by_ns and r.gpu_start_ns <= r.gpu_end_ns
    if on_lavapipe:
        # GPU clock = session clock: the raw times themselves must sit inside the CPU windows
        for n, r in enumerate(raw):
            lo, hi = windows[n // 2]
            assert r.submit_ns <= r.gpu_start_ns <= r.gpu_end_ns <= hi, (n, r, windows[n // 2])
        for smp in backend.seen_samples:
            assert smp.cpu_before_ns <= smp.gpu_ns <= smp.cpu_after_ns
        assert abs(fit.offset_ns) <= fit.uncertainty_ns
    assert t.header["backend"] == "wgpu"
    assert t.header["devices"][0]["timestamps"] is True
    loaded = gputrace.load(tmp_path / "t.json")
    assert len(loaded.spans) == 12


@pytest.mark.wgpu
def test_passes_belong_to_the_innermost_scope_and_parents_cover_them(device: Any) -> None:
    k = Kernel(device)
    with gputrace.session(backend="wgpu", backend_options={"device": device}, quiet=True) as s:
        enc = device.create_command_encoder()
        k.record(enc, label="untraced")  # no scope open: left alone
        device.queue.submit([enc.finish()])
        with gputrace.trace("frame"):
            enc = device.create_command_encoder()
            k.record(enc, label="prepare")
            with gputrace.trace("blur"):
                k.record(enc, label="h")
                k.record(enc, label="v")
            with gputrace.trace("idle"):
                pass
            device.queue.submit([enc.finish()])
    t = s.trace
    assert t is not None
    frame, blur, idle = t.find("frame")[0], t.find("blur")[0], t.find("idle")[0]
    labels = {t.names[lab]: int(sc) for lab, sc in zip(t.spans.label, t.spans.scope, strict=True)}
    assert labels == {"prepare": frame.index, "h": blur.index, "v": blur.index}
    assert frame.gpu_start_ns is not None and blur.gpu_start_ns is not None
    assert frame.gpu_end_ns is not None and blur.gpu_end_ns is not None
    assert frame.gpu_start_ns <= blur.gpu_start_ns and blur.gpu_end_ns <= frame.gpu_end_ns
    assert "empty_gpu_span" in idle.flag_names and idle.gpu_start_ns is None
    assert t.header["backend_info"]["passes_timed"] == 3


@pytest.mark.wgpu
def test_user_timestamp_writes_are_left_alone(device: Any) -> None:
    import wgpu

    k = Kernel(device)
    qs = device.create_query_set(type="timestamp", count=2)
    resolved = device.create_buffer(
        size=256, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
    )
    with gputrace.session(backend="wgpu", backend_options={"device": device}, quiet=True) as s:
        with gputrace.trace("mine"):
            enc = device.create_command_encoder()
            k.record(
                enc,
                label="own",
                timestamp_writes={
                    "query_set": qs,
                    "beginning_of_pass_write_index": 0,
                    "end_of_pass_write_index": 1,
                },
            )
            k.record(enc, label="ours")
            enc.resolve_query_set(qs, 0, 2, resolved, 0)
            device.queue.submit([enc.finish()])
    t = s.trace
    assert t is not None
    assert [t.names[x] for x in t.spans.label.tolist()] == ["ours"]
    ticks = np.frombuffer(device.queue.read_buffer(resolved, 0, 16), np.uint64)
    assert ticks[0] > 0 and ticks[1] >= ticks[0]  # the user's own query set got its values


@pytest.mark.wgpu
def test_render_passes_are_timed(device: Any) -> None:
    import wgpu

    tex = device.create_texture(
        size=(16, 16, 1), format="rgba8unorm", usage=wgpu.TextureUsage.RENDER_ATTACHMENT
    )
    with gputrace.session(backend="wgpu", backend_options={"device": device}, quiet=True) as s:
        with gputrace.trace("draw"):
            enc = device.create_command_encoder()
            rpass = enc.begin_render_pass(
                color_attachments=[
                    {
                        "view": tex.create_view(),
                        "clear_value": (0, 0, 0, 1),
                        "load_op": "clear",
                        "store_op": "store",
                    }
                ]
            )
            rpass.end()
            device.queue.submit([enc.finish()])
    t = s.trace
    assert t is not None
    assert [t.names[x] for x in t.spans.label.tolist()] == ["render pass #1"]
    assert t.scope(0).gpu_ns is not None and t.scope(0).gpu_ns >= 0


@pytest.mark.wgpu
def test_the_timestamp_period_is_applied_to_passes_and_samples(device: Any, on_lavapipe: bool) -> None:
    if not on_lavapipe:
        pytest.skip("needs the GPU clock to be the session clock (lavapipe) to know the truth")
    k = Kernel(device)
    backend = _recording_backend(device=device, timestamp_period=2.0)
    windows = []
    with gputrace.session(backend=backend):
        for _ in range(3):
            with gputrace.trace("step"):
                enc = device.create_command_encoder()
                k.record(enc)
                device.queue.submit([enc.finish()])
            k.finish_wait()
            windows.append(time.perf_counter_ns())
    assert len(backend.seen_spans) == 3
    assert backend.devices()[0]["timestamp_period_ns"] == 2.0
    for r, hi in zip(sorted(backend.seen_spans, key=lambda r: r.gpu_start_ns), windows, strict=True):
        # ticks are CLOCK_MONOTONIC ns here, so with a period of 2 every GPU time doubles
        assert r.gpu_start_ns % 2 == 0 and r.gpu_end_ns % 2 == 0
        assert r.submit_ns <= r.gpu_start_ns // 2 <= r.gpu_end_ns // 2 <= hi
    for smp in backend.seen_samples:
        assert smp.cpu_before_ns <= smp.gpu_ns // 2 <= smp.cpu_after_ns


@pytest.mark.wgpu
def test_query_pages_roll_over_and_are_reused(device: Any) -> None:
    k = Kernel(device, n=256)
    backend = _recording_backend(device=device, page_queries=4)  # two passes per page
    with gputrace.session(backend=backend) as s:
        for i in range(5):
            with gputrace.trace("step"):
                enc = device.create_command_encoder()
                for j in range(3):
                    k.record(enc, label=f"p{i}.{j}")
                device.queue.submit([enc.finish()])
            if i == 2:
                gputrace.sync()
    t = s.trace
    assert t is not None
    labels = sorted(t.names[x] for x in t.spans.label.tolist())
    assert labels == sorted(f"p{i}.{j}" for i in range(5) for j in range(3))
    for sc in t.find("step"):
        assert len(np.flatnonzero(t.spans.scope == sc.index)) == 3
        assert "degraded" not in sc.flag_names
    assert t.header["backend_info"]["query_pages"] < 8  # 8 pages were filled; some were reused


@pytest.mark.wgpu
def test_passes_go_to_the_scope_of_their_own_thread(device: Any) -> None:
    k = Kernel(device, n=256)
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            for _ in range(3):
                with gputrace.trace(name):
                    enc = device.create_command_encoder()
                    k.record(enc, label=name)
                    device.queue.submit([enc.finish()])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    with gputrace.session(backend="wgpu", backend_options={"device": device}, quiet=True) as s:
        threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert not errors
    t = s.trace
    assert t is not None
    for lab, sc in zip(t.spans.label.tolist(), t.spans.scope.tolist(), strict=True):
        assert t.names[lab] == t.scope(sc).name
    assert len(t.spans) == 6


@pytest.mark.wgpu
def test_instrumenting_keeps_the_device_a_wgpu_device(device: Any) -> None:
    import wgpu

    from gputrace.backends.wgpu import instrument, uninstrument

    base = type(device)
    assert instrument(device) is device
    assert isinstance(device, wgpu.GPUDevice) and type(device).__name__ == base.__name__
    enc = device.create_command_encoder()  # no session: an ordinary encoder
    assert type(enc).__module__ == "wgpu.backends.wgpu_native._api"
    uninstrument(device)
    assert type(device) is base or type(device).__mro__[1] is base
    with pytest.raises(GputraceError, match="wgpu-native devices"):
        instrument(object())


@pytest.mark.wgpu
def test_a_device_without_timestamps_gives_untimed_scopes(
    adapter: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    from gputrace.backends.wgpu import uninstrument

    plain = adapter.request_device_sync()
    assert "timestamp-query" not in plain.features
    k = Kernel(plain, n=256)
    with gputrace.session(backend="wgpu", backend_options={"device": plain}, quiet=True) as s:
        for _ in range(2):
            with gputrace.trace("step"):
                enc = plain.create_command_encoder()
                k.record(enc)
                plain.queue.submit([enc.finish()])
    uninstrument(plain)
    t = s.trace
    assert t is not None
    err = capfd.readouterr().err
    assert err.count("was created without the 'timestamp-query' feature") == 1  # one notice
    for sc in t.find("step"):
        assert "untimed" in sc.flag_names and "empty_gpu_span" not in sc.flag_names
        assert sc.gpu_start_ns is None and sc.cpu_ns > 0
    assert len(t.spans) == 0 and t.clock_fits == {}


@pytest.mark.wgpu
def test_no_traced_device_means_untimed_scopes_and_one_notice(
    adapter: Any, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import weakref

    from gputrace.backends import wgpu as w

    # devices that other tests instrumented may still be alive (wgpu keeps some): none here
    monkeypatch.setattr(w, "_instrumented", weakref.WeakSet())
    with gputrace.session(backend="wgpu", quiet=True) as s:
        with gputrace.trace("a"):
            pass
        gputrace.sync()
        with gputrace.trace("b"):
            pass
    t = s.trace
    assert t is not None
    assert all("untimed" in sc.flag_names for sc in t)
    assert capfd.readouterr().err.count("no wgpu device is traced") == 1


@pytest.mark.wgpu
def test_a_device_instrumented_mid_session_is_traced(device: Any) -> None:
    from gputrace.backends.wgpu import instrument

    k = Kernel(device, n=256)
    with gputrace.session(backend="wgpu", quiet=True) as s:
        instrument(device)
        with gputrace.trace("late"):
            enc = device.create_command_encoder()
            k.record(enc)
            device.queue.submit([enc.finish()])
    t = s.trace
    assert t is not None
    assert len(t.spans) == 1 and t.find("late")[0].gpu_ns is not None
    assert 0 in t.clock_fits


@pytest.mark.wgpu
def test_waiting_on_the_gpu_ends_in_a_clear_error(adapter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrace.backends import wgpu_queries
    from gputrace.backends.wgpu_queries import WorkDone

    # a device of its own: wgpu-py's poll thread polls a device while any of its read-backs is
    # pending, and an earlier test's on the shared device would run the callback
    device = adapter.request_device_sync(required_features=["timestamp-query"])
    k = Kernel(device, n=256)
    enc = device.create_command_encoder()
    k.record(enc)
    device.queue.submit([enc.finish()])
    # Without polling, wgpu-native never runs the work-done callback: the wait cannot complete,
    # however fast the GPU is, so the timeout is what ends it.
    monkeypatch.setattr(wgpu_queries, "poll", lambda device: None)
    impatient = WorkDone(device, time.perf_counter_ns, timeout_s=0.05)
    req = impatient.request()
    t0 = time.monotonic()
    with pytest.raises(GputraceError, match=r"did not finish its submitted work within 0\.05 s"):
        impatient.wait(req)
    assert time.monotonic() - t0 >= 0.05
    monkeypatch.undo()
    impatient.wait(req)  # the same request completes once wgpu-native is polled again
    patient = WorkDone(device, time.perf_counter_ns, timeout_s=60)
    patient.wait(patient.request())


@pytest.mark.wgpu
def test_the_example_runs(adapter: Any, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "wgpu_tiny_vs_large.py"), "--quick",
         "--out", str(tmp_path / "ex.json")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "tiny" in out.stdout and "large" in out.stdout
    assert gputrace.load(tmp_path / "ex.json").find("tiny")
    # its waits' ends are nameless; written with named ends (as before) it reads the same
    from tests.builders import assert_same, read_both_ways, waits, with_named_ends

    doc = orjson.loads((tmp_path / "ex.json").read_bytes())
    assert waits(doc, "e") and all(set(e) == {"ph", "id2", "pid", "ts"} for e in waits(doc, "e"))
    (tmp_path / "old.json").write_bytes(orjson.dumps(with_named_ends(doc)))
    new, old = read_both_ways(tmp_path / "ex.json"), read_both_ways(tmp_path / "old.json")
    for back in (*new[1:], *old):  # the plain reader, and both readers of the older layout
        assert_same(new[0], back)


@pytest.mark.wgpu
def test_an_encoder_left_open_at_stop_still_finishes_and_submits(device: Any) -> None:
    k = Kernel(device, n=256)
    with gputrace.session(backend="wgpu", backend_options={"device": device}, quiet=True) as s:
        with gputrace.trace("straddles"):
            enc = device.create_command_encoder()
            k.record(enc)
    device.queue.submit([enc.finish()])  # after stop: the user's program carries on untouched
    k.finish_wait()
    t = s.trace
    assert t is not None
    assert "empty_gpu_span" in t.find("straddles")[0].flag_names  # never submitted in the session


@pytest.mark.wgpu
def test_full_pages_are_read_back_at_later_submits_without_a_sync(device: Any) -> None:
    k = Kernel(device, n=256)
    backend = _recording_backend(device=device, page_queries=2)  # one pass per page
    with gputrace.session(backend=backend) as s:
        tracer = backend.tracers[0]
        for _ in range(4):
            with gputrace.trace("step"):
                enc = device.create_command_encoder()
                k.record(enc)
                device.queue.submit([enc.finish()])
        k.finish_wait()
        deadline = time.monotonic() + 10
        while not tracer.spans and time.monotonic() < deadline:
            device.queue.submit([])  # a later frame's submit reads what is ready, never waits
            time.sleep(0.001)
        assert tracer.spans, "no page was read back at a later submit"
        assert backend.seen_spans == []  # nothing collected yet: no sync has happened
    t = s.trace
    assert t is not None
    assert len(t.spans) == 4 and len(backend.seen_spans) == 4


@pytest.mark.wgpu
def test_a_pass_that_fails_to_begin_leaves_no_slot_to_resolve(device: Any) -> None:
    k = Kernel(device, n=256)
    with gputrace.session(backend="wgpu", backend_options={"device": device}, quiet=True) as s:
        with gputrace.trace("step"):
            enc = device.create_command_encoder()
            k.record(enc, label="before")
            with pytest.raises(Exception):  # noqa: B017 - whatever wgpu raises for bad arguments
                enc.begin_render_pass(color_attachments="not a list")
            k.record(enc, label="after")
            device.queue.submit([enc.finish()])
    t = s.trace
    assert t is not None
    assert sorted(t.names[x] for x in t.spans.label.tolist()) == ["after", "before"]
    assert t.header["backend_info"]["passes_timed"] == 2


@pytest.mark.wgpu
def test_auto_picks_wgpu_for_a_program_that_uses_it(adapter: Any) -> None:
    code = (
        "import sys; sys.modules['cupy'] = None  # no CUDA here, whatever the machine has\n"
        "import wgpu, gputrace\n"
        "from gputrace.backends.wgpu import instrument\n"
        "a = wgpu.gpu.request_adapter_sync(power_preference='high-performance')\n"
        "d = instrument(a.request_device_sync(required_features=['timestamp-query']))\n"
        "with gputrace.session() as s:\n"
        "    with gputrace.trace('clear'):\n"
        "        enc = d.create_command_encoder()\n"
        "        enc.begin_compute_pass().end()\n"
        "        d.queue.submit([enc.finish()])\n"
        "print(s.trace.header['backend'], len(s.trace.spans))\n"
    )
    assert _run(code).splitlines()[-1] == "wgpu 1"
