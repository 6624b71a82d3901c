"""CPU cost of a traced wgpu pass, next to the same pass with timestamp_writes written by hand.

Three loops over the same tiny compute pass (one encoder, one pass, one submit per iteration),
run in alternating rounds so that machine noise hits them alike:

- bare:    no timestamps at all;
- by hand: ``timestamp_writes`` from a query set the user manages, resolved per encoder and
  copied into a read-back buffer read once at the end (the careful, non-stalling way);
- traced:  the bare code inside ``with gputrace.trace("step"):`` on a traced device.

Then one traced run checks the alignment: on lavapipe the GPU clock is CLOCK_MONOTONIC, so the
raw GPU timestamps are the truth and the aligned times' error can be measured directly.

    python benchmarks/bench_wgpu.py [--passes 400] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, ClassVar

import numpy as np
import wgpu

import gputrace
from gputrace.backends.wgpu import WgpuBackend

SHADER = """
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) { data[id.x] = data[id.x] + 1.0; }
"""


class Setup:
    def __init__(self, device: Any) -> None:
        self.device = device
        self.buf = device.create_buffer(size=256, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        module = device.create_shader_module(code=SHADER)
        self.pipeline = device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"}
        )
        self.bind_group = device.create_bind_group(
            layout=self.pipeline.get_bind_group_layout(0),
            entries=[{"binding": 0, "resource": {"buffer": self.buf}}],
        )
        self.query_set = device.create_query_set(type="timestamp", count=4096)
        self.resolve_buf = device.create_buffer(
            size=4096 * 8, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC
        )
        self.readback = device.create_buffer(
            size=4096 * 8, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        )

    def one_pass(self, timestamp_writes: Any = None) -> Any:
        encoder = self.device.create_command_encoder()
        cpass = encoder.begin_compute_pass(timestamp_writes=timestamp_writes)
        cpass.set_pipeline(self.pipeline)
        cpass.set_bind_group(0, self.bind_group)
        cpass.dispatch_workgroups(1)
        cpass.end()
        return encoder

    def wait_idle(self) -> None:
        self.device.queue.read_buffer(self.buf, 0, 16)


Cost = tuple[float, float]  # (wall ns, this thread's CPU ns) per pass


def _start() -> tuple[int, int]:
    return time.perf_counter_ns(), time.thread_time_ns()


def _per_pass(t0: tuple[int, int], n: int) -> Cost:
    return (time.perf_counter_ns() - t0[0]) / n, (time.thread_time_ns() - t0[1]) / n


def bare(s: Setup, n: int) -> Cost:
    t0 = _start()
    for _ in range(n):
        s.device.queue.submit([s.one_pass().finish()])
    return _per_pass(t0, n)


def by_hand(s: Setup, n: int) -> Cost:
    t0 = _start()
    for i in range(n):
        slot = (2 * i) % 4096
        enc = s.one_pass(
            {
                "query_set": s.query_set,
                "beginning_of_pass_write_index": slot,
                "end_of_pass_write_index": slot + 1,
            }
        )
        enc.resolve_query_set(s.query_set, slot, 2, s.resolve_buf, 0)
        enc.copy_buffer_to_buffer(s.resolve_buf, 0, s.readback, slot * 8, 16)
        s.device.queue.submit([enc.finish()])
    per_pass = _per_pass(t0, n)
    s.wait_idle()
    s.readback.map_sync(wgpu.MapMode.READ)  # read once at the end, as a careful user would
    s.readback.read_mapped()
    s.readback.unmap()
    return per_pass


def traced(s: Setup, n: int) -> Cost:
    with gputrace.session(backend="wgpu", backend_options={"device": s.device}, quiet=True):
        t0 = _start()
        for _ in range(n):
            with gputrace.trace("step"):
                s.device.queue.submit([s.one_pass().finish()])
        per_pass = _per_pass(t0, n)
    return per_pass


def alignment(s: Setup, n: int) -> str:
    """Aligned pass times against the raw GPU times (the truth where the GPU clock is ours)."""

    class Keep(WgpuBackend):
        raw: ClassVar[list[Any]] = []

        def collect(self) -> Any:
            got = super().collect()
            self.raw.extend(got.spans)
            return got

    backend = Keep(gputrace.clock.session_clock, device=s.device)
    with gputrace.session(backend=backend) as sess:
        for i in range(n):
            with gputrace.trace("step"):
                s.device.queue.submit([s.one_pass().finish()])
            if i % 50 == 49:
                gputrace.sync()
    trace = sess.trace
    assert trace is not None
    fit = trace.clock_fits[0]
    raw_start = np.sort(np.array([r.gpu_start_ns for r in backend.raw], np.int64))
    aligned = np.sort(trace.spans.gpu_start_ns)
    err = np.abs(aligned - raw_start) / 1e3
    on_lavapipe = s.device.adapter.info.get("vendor") == "llvmpipe"
    truth = "GPU clock is CLOCK_MONOTONIC: truth known" if on_lavapipe else "truth unknown here"
    line = (
        f"fit: offset {fit.offset_ns / 1e3:+.1f} µs, stated uncertainty ±{fit.uncertainty_ns / 1e3:.1f}"
        f" µs, {fit.samples} samples ({fit.method}); "
    )
    if on_lavapipe:
        line += (
            f"alignment error over {len(err)} passes: median {np.median(err):.1f} µs, "
            f"max {err.max():.1f} µs ({'within' if err.max() * 1e3 <= fit.uncertainty_ns else 'OUTSIDE'}"
            f" the stated uncertainty; {truth})"
        )
    else:
        gpu_epoch_gap = (np.median(raw_start) - (time.time_ns() - time.perf_counter_ns())
                         - np.median(aligned)) / 1e6  # fmt: skip
        line += f"GPU clock minus CLOCK_REALTIME ≈ {gpu_epoch_gap:+.2f} ms ({truth})"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passes", type=int, default=400, help="passes per loop")
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds")
    opts = parser.parse_args()
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync(required_features=["timestamp-query"])
    s = Setup(device)
    loops = {"bare": bare, "by hand": by_hand, "traced": traced}
    for fn in loops.values():  # warm up
        fn(s, 50)
        s.wait_idle()
    times: dict[str, list[Cost]] = {k: [] for k in loops}
    for _ in range(opts.rounds):
        for name, fn in loops.items():
            times[name].append(fn(s, opts.passes))
            s.wait_idle()
    wall = {k: statistics.median(c[0] for c in v) / 1e3 for k, v in times.items()}
    cpu = {k: statistics.median(c[1] for c in v) / 1e3 for k, v in times.items()}
    print(f"adapter: {adapter.info['device']} · {opts.passes} passes × {opts.rounds} rounds")
    print("µs per pass, medians over rounds; thread CPU = this Python thread only (not the driver's)")
    print(f"{'loop':10} {'wall':>8} {'vs by hand':>11} {'thread CPU':>11} {'vs by hand':>11}")
    for name in loops:
        print(
            f"{name:10} {wall[name]:>8.1f} {wall[name] / wall['by hand']:>10.2f}× "
            f"{cpu[name]:>11.1f} {cpu[name] / cpu['by hand']:>10.2f}×"
        )
    print(
        f"gputrace per traced pass: {cpu['traced'] - cpu['by hand']:+.1f} µs thread CPU, "
        f"{wall['traced'] - wall['by hand']:+.1f} µs wall, vs timestamp_writes by hand"
    )
    print(alignment(s, 200))


if __name__ == "__main__":
    main()
