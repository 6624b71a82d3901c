"""WebGPU measurements through wgpu-py directly (independent of gputrace's wgpu backend).

Device times: timestamp queries at the beginning and end of a compute pass (ticks × the queue's
period). Completion is awaited by mapping a small buffer copied in a later submission
(``on_submitted_work_done_sync`` is broken in wgpu-py 0.32); that wait has its own row.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gputrace.backends.wgpu_queries import timestamp_period
from gputrace.calibrate import Case, DeviceRun, Plan
from gputrace.calibrate.on_cpu import FMA_A, FMA_B, INTENSITIES, smallest_step, wall_per_op
from gputrace.calibrate.result import Stat
from gputrace.errors import GputraceError

EMPTY_WGSL = "@compute @workgroup_size(1) fn main() {}"
FMA_WGSL = """
struct Params { n: u32, ops: u32, a: f32, b: f32 }
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = nwg.x * 64u;
    for (var i = gid.x; i < p.n; i += stride) {
        var v = y[i];
        for (var j = 0u; j < p.ops; j++) { v = fma(v, p.a, p.b); }
        y[i] = v;
    }
}
"""
MAX_WORKGROUPS = 65535
CPU_ADAPTER_MAX_LOG2 = 18  # lavapipe and other software adapters: keep the grid affordable


def probe() -> tuple[Any, Any]:
    """Import wgpu and get an adapter; raise a one-sentence ``GputraceError`` if there is none."""
    try:
        import wgpu
    except ImportError as exc:
        raise GputraceError(f"wgpu calibration needs wgpu-py, which could not be imported ({exc}).") from None
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:
        raise GputraceError(f"no wgpu adapter is usable here ({type(exc).__name__}: {exc}).") from None
    if adapter is None:
        raise GputraceError("no wgpu adapter is usable here.")
    return wgpu, adapter


class _Wgpu:
    def __init__(self, wgpu: Any, device: Any, timestamps: bool) -> None:
        self.wgpu, self.device, self.queue, self.timestamps = wgpu, device, device.queue, timestamps
        usage = wgpu.BufferUsage
        self.flag_src = device.create_buffer(size=4, usage=usage.STORAGE | usage.COPY_SRC)
        self.flag_map = device.create_buffer(size=4, usage=usage.MAP_READ | usage.COPY_DST)
        self.empty = device.create_compute_pipeline(
            layout="auto",
            compute={"module": device.create_shader_module(code=EMPTY_WGSL), "entry_point": "main"},
        )
        try:
            self.period = timestamp_period(device.queue)
        except Exception:  # not wgpu-native: its timestamps are taken as ns
            self.period = 1.0
        self.durations_seen: list[float] = []
        if timestamps:
            self.qs = device.create_query_set(type=wgpu.QueryType.timestamp, count=2)
            self.resolve = device.create_buffer(size=16, usage=usage.QUERY_RESOLVE | usage.COPY_SRC)
            self.ts_map = device.create_buffer(size=16, usage=usage.MAP_READ | usage.COPY_DST)

    def wait(self) -> None:
        """Return once everything submitted so far has run."""
        enc = self.device.create_command_encoder()
        enc.copy_buffer_to_buffer(self.flag_src, 0, self.flag_map, 0, 4)
        self.queue.submit([enc.finish()])
        self.flag_map.map_sync(self.wgpu.MapMode.READ)
        self.flag_map.unmap()

    def dispatch(self, pipeline: Any, groups: int, bind_group: Any = None, timed: bool = False) -> Any:
        """Encode one compute pass with one dispatch (0 groups: an empty pass); return the encoder."""
        enc = self.device.create_command_encoder()
        writes = None
        if timed:
            writes = {"query_set": self.qs, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
        cpass = enc.begin_compute_pass(timestamp_writes=writes)
        if groups:
            cpass.set_pipeline(pipeline)
            if bind_group is not None:
                cpass.set_bind_group(0, bind_group)
            cpass.dispatch_workgroups(groups)
        cpass.end()
        if timed:
            enc.resolve_query_set(self.qs, 0, 2, self.resolve, 0)
            enc.copy_buffer_to_buffer(self.resolve, 0, self.ts_map, 0, 16)
        return enc

    def read_pass_ns(self) -> float:
        """GPU duration of the last timed pass (waits for it)."""
        self.ts_map.map_sync(self.wgpu.MapMode.READ)
        ticks = np.frombuffer(self.ts_map.read_mapped(), dtype=np.uint64).copy()
        self.ts_map.unmap()
        ns = float(int(ticks[1]) - int(ticks[0])) * self.period
        self.durations_seen.append(ns)
        return ns


def measure(plan: Plan) -> DeviceRun:
    wgpu, adapter = probe()
    timestamps = "timestamp-query" in adapter.features
    device = adapter.request_device_sync(required_features=["timestamp-query"] if timestamps else [])
    info = dict(adapter.info)
    run = DeviceRun(f"{info.get('device', '?')} · wgpu ({info.get('backend_type', '?')})", plan.progress)
    w = _Wgpu(wgpu, device, timestamps)
    run.info = {
        "wgpu": wgpu.__version__,
        "adapter_type": info.get("adapter_type"),
        "timestamp_period": w.period,
        "timestamps": timestamps,
    }
    run.summary["timestamp_period"] = w.period
    run.session_options = {"device": device}  # gputrace's wgpu backend times this device
    if not timestamps:
        run.skipped["device_times"] = "the adapter has no timestamp-query feature"
    run.step("submit", lambda: _submit(run, plan, w))
    run.step("copies", lambda: _copies(run, plan, w))
    cpu_adapter = str(info.get("adapter_type", "")).upper() == "CPU"
    run.step("breakeven", lambda: _breakeven(run, plan, w, cpu_adapter))
    step = smallest_step(w.durations_seen)
    if step is not None:
        run.summary["timer_resolution_ns"] = step
    return run


def _submit(run: DeviceRun, plan: Plan, w: _Wgpu) -> None:
    clock = time.perf_counter_ns
    n = plan.batches * 5
    submit: list[float] = []
    launch: list[float] = []
    for encoded, out in ((True, submit), (False, launch)):  # launch: the encoding timed too
        for i in range(n + 10):  # the first 10: warm-up
            cb = w.device.create_command_encoder().finish() if encoded else None
            t0 = clock()
            w.queue.submit([cb or w.dispatch(w.empty, 1).finish()])
            out.append(float(clock() - t0))
            if i % 50 == 49:
                w.wait()
        w.wait()

    def launch_and_wait() -> None:
        w.queue.submit([w.dispatch(w.empty, 1).finish()])
        w.wait()

    launch_wait = wall_per_op(launch_and_wait, batches=n // 2, per_batch=1, warmup=0)
    waits = wall_per_op(w.wait, batches=n // 2, per_batch=1, warmup=0)
    run.add("submit", "submit", "queue.submit, empty command buffer", submit[10:])
    run.add(
        "launch_cpu",
        "submit",
        "one-workgroup dispatch: encode + submit",
        launch[10:],
        note="the CPU cost of getting work going",
        summary_wall="launch_cpu_ns",
    )
    run.add(
        "launch_sync",
        "submit",
        "one-workgroup dispatch + wait",
        launch_wait,
        note="includes one completion wait",
        summary_wall="launch_sync_ns",
    )
    run.add(
        "wait",
        "submit",
        "completion wait (submit a 4 B copy + map it)",
        waits,
        note="the way gputrace waits here",
    )
    if not w.timestamps:
        return
    for groups, key, what in (
        (0, "pass_empty", "empty timestamped pass: resolve + map round trip"),
        (1, "launch", "timestamped one-workgroup dispatch: round trip"),
    ):
        wall, dev = [], []
        for _ in range(n // 2 + 5):  # the first 5: warm-up
            t0 = clock()
            w.queue.submit([w.dispatch(w.empty, groups, timed=True).finish()])
            dev.append(w.read_pass_ns())
            wall.append(float(clock() - t0))
        run.add(
            key,
            "timestamps",
            what,
            wall[5:],
            dev[5:],
            note="device: end - begin timestamp of the pass",
            summary_device="launch_gpu_ns" if groups else None,
        )


def _copies(run: DeviceRun, plan: Plan, w: _Wgpu) -> None:
    usage = w.wgpu.BufferUsage
    clock = time.perf_counter_ns
    large = (4 if plan.quick else 16) << 20
    for nbytes in (1024, large):
        buf = w.device.create_buffer(size=nbytes, usage=usage.STORAGE | usage.COPY_DST | usage.COPY_SRC)
        mapbuf = w.device.create_buffer(size=nbytes, usage=usage.MAP_READ | usage.COPY_DST)
        data = np.ones(nbytes, dtype=np.uint8)
        reps = plan.batches * 2 if nbytes == 1024 else (3 if plan.quick else 10)
        up, down = [], []
        for _ in range(reps + 2):  # the first 2: warm-up
            t0 = clock()
            w.queue.write_buffer(buf, 0, data)
            w.wait()
            t1 = clock()
            enc = w.device.create_command_encoder()
            enc.copy_buffer_to_buffer(buf, 0, mapbuf, 0, nbytes)
            w.queue.submit([enc.finish()])
            mapbuf.map_sync(w.wgpu.MapMode.READ)
            _ = bytes(mapbuf.read_mapped())
            mapbuf.unmap()
            up.append(float(t1 - t0))
            down.append(float(clock() - t1))
        size = "1 KB" if nbytes == 1024 else f"{nbytes >> 20} MB"
        tag = "1k" if nbytes == 1024 else "large"
        for direction, what, samples in (
            ("h2d", f"upload {size} (write_buffer + wait)", up[2:]),
            ("d2h", f"readback {size} (copy + map + read)", down[2:]),
        ):
            headline = f"{direction}_1k_ns" if nbytes == 1024 else None
            run.add(f"{direction}_{tag}", "copies", what, samples, bytes=nbytes, summary_wall=headline)
        buf.destroy()
        mapbuf.destroy()


def _breakeven(run: DeviceRun, plan: Plan, w: _Wgpu, cpu_adapter: bool) -> None:
    wgpu, device = w.wgpu, w.device
    usage = wgpu.BufferUsage
    clock = time.perf_counter_ns
    top = CPU_ADAPTER_MAX_LOG2 - (4 if plan.quick else 0)
    pipeline = device.create_compute_pipeline(
        layout="auto",
        compute={"module": device.create_shader_module(code=FMA_WGSL), "entry_point": "main"},
    )
    params = device.create_buffer(size=16, usage=usage.UNIFORM | usage.COPY_DST)

    def cases(n: int) -> Iterator[Case]:
        y = device.create_buffer(size=4 * n, usage=usage.STORAGE | usage.COPY_DST | usage.COPY_SRC)
        ymap = device.create_buffer(size=4 * n, usage=usage.MAP_READ | usage.COPY_DST)
        host = np.ones(n, dtype=np.float32)
        bind = device.create_bind_group(
            layout=pipeline.get_bind_group_layout(0),
            entries=[
                {"binding": 0, "resource": {"buffer": y, "offset": 0, "size": 4 * n}},
                {"binding": 1, "resource": {"buffer": params, "offset": 0, "size": 16}},
            ],
        )
        groups = min((n + 63) // 64, MAX_WORKGROUPS)

        def kernel() -> None:
            w.queue.submit([w.dispatch(pipeline, groups, bind).finish()])
            w.wait()

        def with_copies() -> None:
            w.queue.write_buffer(y, 0, host)
            enc = w.dispatch(pipeline, groups, bind)
            enc.copy_buffer_to_buffer(y, 0, ymap, 0, 4 * n)
            w.queue.submit([enc.finish()])
            ymap.map_sync(wgpu.MapMode.READ)
            host[:] = np.frombuffer(ymap.read_mapped(), dtype=np.float32)
            ymap.unmap()

        for ops in INTENSITIES:  # the kernel reads its intensity from params
            w.queue.write_buffer(params, 0, struct.pack("<IIff", n, ops, FMA_A, FMA_B))
            yield ops, kernel, with_copies
        y.destroy()
        ymap.destroy()

    def median_wall(fn: Callable[[], None]) -> float:
        t0 = clock()
        fn()  # warm-up, and a guess of the cost to bound the repetitions
        first = clock() - t0
        reps = max(3, min(plan.reps, int(0.3e9 / max(first, 1))))
        return Stat.of(wall_per_op(fn, batches=reps, per_batch=1, warmup=0)).median

    run.gpu_breakeven([n for n in plan.sizes if not cpu_adapter or n <= 1 << top], cases, median_wall)
