"""A tiny kernel and a large one through WebGPU: GPU-clock time next to wall-clock time.

Lesson 1 and 6 of gputrace: the wall clock around "submit, then wait" measures the round trip
(submission, queue wake-up, completion callback, read-back), not the kernel. For a tiny kernel
that round trip is almost all of it: a 256-element kernel ran 4.3 µs on an Apple M4's GPU clock
and 190 µs on the wall clock, 45×. For a large kernel the two agree. gputrace records both for
every scope, so the table below comes straight from one trace::

    python examples/wgpu_tiny_vs_large.py            # writes wgpu_tiny_vs_large.json
    python examples/wgpu_tiny_vs_large.py --quick    # fewer, smaller runs (CI)

Open the trace in https://ui.perfetto.dev: each "tiny"/"large" CPU slice has an arrow to its GPU
slice, and the "queued" track shows the wait between submission and the kernel's start.
"""

from __future__ import annotations

import argparse
import statistics

import wgpu

import gputrace

SHADER = """
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
override ROUNDS: u32 = 1u;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x + id.y * 65535u * 64u;
    if (i >= arrayLength(&data)) { return; }
    var x = data[i];
    for (var r = 0u; r < ROUNDS; r = r + 1u) { x = fract(x * 1.0001 + 0.37); }
    data[i] = x;
}
"""


class Job:
    """One kernel over ``n`` floats, ``rounds`` arithmetic rounds per element."""

    def __init__(self, device: wgpu.GPUDevice, n: int, rounds: int) -> None:
        self.device = device
        self.n = n
        self.buf = device.create_buffer(
            size=n * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
        )
        module = device.create_shader_module(code=SHADER)
        self.pipeline = device.create_compute_pipeline(
            layout="auto",
            compute={"module": module, "entry_point": "main", "constants": {"ROUNDS": rounds}},
        )
        self.bind_group = device.create_bind_group(
            layout=self.pipeline.get_bind_group_layout(0),
            entries=[{"binding": 0, "resource": {"buffer": self.buf}}],
        )
        groups = -(-n // 64)
        self.grid = (min(groups, 65535), -(-groups // 65535))

    def run_and_wait(self) -> None:
        """Plain wgpu code: encode, submit, then wait for the result (a small read-back)."""
        encoder = self.device.create_command_encoder()
        cpass = encoder.begin_compute_pass()
        cpass.set_pipeline(self.pipeline)
        cpass.set_bind_group(0, self.bind_group)
        cpass.dispatch_workgroups(*self.grid)
        cpass.end()
        self.device.queue.submit([encoder.finish()])
        self.device.queue.read_buffer(self.buf, 0, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, smaller runs")
    parser.add_argument("--out", default="wgpu_tiny_vs_large.json", help="trace file to write")
    opts = parser.parse_args()
    reps = 10 if opts.quick else 50
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        raise SystemExit("no WebGPU adapter found (on Linux: apt install mesa-vulkan-drivers)")
    # "large" means milliseconds: far fewer elements on a CPU adapter (lavapipe) than on a GPU
    on_cpu = adapter.info["adapter_type"] == "CPU"
    large_n, large_rounds = (1 << 18, 64) if on_cpu or opts.quick else (1 << 24, 256)
    if on_cpu and not opts.quick:
        large_n = 1 << 20
    device = adapter.request_device_sync(required_features=["timestamp-query"])
    jobs = {"tiny": Job(device, 256, 1), "large": Job(device, large_n, large_rounds)}

    with gputrace.session(opts.out, backend="wgpu", backend_options={"device": device}) as s:
        for name, job in jobs.items():
            for _ in range(reps):
                with gputrace.trace(name, n=job.n):
                    job.run_and_wait()

    trace = s.trace
    assert trace is not None
    print(f"adapter: {adapter.info['device']} ({adapter.info['backend_type']})")
    print(f"{'kernel':8} {'elements':>10} {'GPU clock µs':>13} {'wall µs':>10} {'wall/GPU':>9}")
    for name, job in jobs.items():
        warm = [sc for sc in trace.find(name) if "cold" not in sc.flag_names and sc.gpu_ns]
        gpu_us = statistics.median(sc.gpu_ns for sc in warm if sc.gpu_ns) / 1e3
        wall_us = statistics.median(sc.cpu_ns for sc in warm) / 1e3
        print(f"{name:8} {job.n:>10} {gpu_us:>13.1f} {wall_us:>10.1f} {wall_us / gpu_us:>8.1f}×")
    cold = trace.find("tiny")[0]
    print(
        f"first tiny call (cold): {cold.cpu_ns / 1e3:.0f} µs wall; "
        f"alignment uncertainty ±{trace.clock_fits[0].uncertainty_ns / 1e3:.0f} µs"
    )
    print(f"trace: {opts.out}")


if __name__ == "__main__":
    main()
