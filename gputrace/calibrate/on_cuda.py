"""CUDA measurements, through CuPy directly (independent of gputrace's cuda backend).

Device times come from CUDA event pairs; wall times from ``time.perf_counter_ns``. To measure
the GPU's own per-kernel cost (not the CPU's enqueue rate), a batch of launches is queued behind
a kernel that spins on ``%globaltimer`` long enough for the CPU to enqueue the whole batch, so the
GPU then runs the batch back to back.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gputrace.calibrate import Case, DeviceRun, Plan
from gputrace.calibrate.on_cpu import FMA_A, FMA_B, INTENSITIES, smallest_step, wall_per_op
from gputrace.calibrate.result import Stat
from gputrace.errors import GputraceError

KERNELS = r"""
extern "C" __global__ void gt_empty() {}

extern "C" __global__ void gt_spin(long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while ((long long)(t - t0) < ns);
}

extern "C" __global__ void gt_fma(float* y, long long n, int ops, float a, float b) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = y[i];
        for (int j = 0; j < ops; ++j) v = fmaf(v, a, b);
        y[i] = v;
    }
}
"""

# Runs in a fresh interpreter: what the first use of CUDA costs a new process.
FIRST_USE_SCRIPT = r"""
import json, sys, time
clock = time.perf_counter_ns
t0 = clock()
import cupy as cp
t1 = clock()
cp.cuda.runtime.free(0)
t2 = clock()
k = cp.RawModule(code=sys.argv[1]).get_function("gt_empty")
t3 = clock()
k((1,), (1,), ())
cp.cuda.runtime.deviceSynchronize()
t4 = clock()
k((1,), (1,), ())
cp.cuda.runtime.deviceSynchronize()
t5 = clock()
print(json.dumps({"import": t1 - t0, "context": t2 - t1, "module": t3 - t2,
                  "first_launch": t4 - t3, "second_launch": t5 - t4}))
"""

FIRST_USE_ROWS = (
    ("import", "import cupy"),
    ("context", "CUDA context creation (cudaFree(0))"),
    ("module", "kernel compile (NVRTC, empty cache) + module load"),
    ("first_launch", "first launch + sync"),
    ("second_launch", "second launch + sync"),
)
GRID_BLOCKS = (1, 16, 256, 1024, 4096, 16384)
GRAPH_KERNELS = 100
LAUNCH_BATCH = 100


def probe() -> Any:
    """Import CuPy and check a GPU is there; raise a one-sentence ``GputraceError`` if not."""
    try:
        import cupy as cp
    except ImportError as exc:
        raise GputraceError(f"CUDA calibration needs CuPy, which could not be imported ({exc}).") from None
    try:
        available = cp.cuda.is_available()
    except Exception as exc:
        raise GputraceError(f"CUDA is not usable here ({type(exc).__name__}: {exc}).") from None
    if not available:
        raise GputraceError("CUDA calibration needs a CUDA GPU, and CuPy sees none here.")
    return cp


class _Cuda:
    """The CuPy objects every measurement shares: one stream, the kernels, two timing events."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        mod = cp.RawModule(code=KERNELS)
        self.empty, self.spin, self.fma = (mod.get_function(f"gt_{k}") for k in ("empty", "spin", "fma"))
        self.ev0, self.ev1 = cp.cuda.Event(), cp.cuda.Event()
        self.elapsed_seen: list[float] = []  # every event-pair reading, for the timer resolution

    def elapsed_ns(self) -> float:
        """Device ns between ev0 and ev1 (after waiting for ev1)."""
        self.ev1.synchronize()
        ns = round(self.cp.cuda.get_elapsed_time(self.ev0, self.ev1) * 1e6, 1)
        self.elapsed_seen.append(ns)
        return float(ns)

    def synced(self, op: Callable[[], None]) -> Callable[[], None]:
        """``op`` followed by a wait for the stream: timed on the wall clock, the whole round trip."""

        def op_and_wait() -> None:
            op()
            self.stream.synchronize()

        return op_and_wait

    def wall_and_device(self, op: Callable[[], None], reps: int) -> tuple[list[float], list[float]]:
        """``reps`` times each: wall ns of ``op`` + a stream sync, and device ns of ``op`` between
        two events (measured apart, so neither disturbs the other)."""
        wall = wall_per_op(self.synced(op), batches=reps, per_batch=1, warmup=0)
        device = []
        for _ in range(reps):
            self.ev0.record(self.stream)
            op()
            self.ev1.record(self.stream)
            device.append(self.elapsed_ns())
        return wall, device


def measure(plan: Plan) -> DeviceRun:
    cp = probe()
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    run = DeviceRun(device=f"GPU 0 · {name} · cuda", progress=plan.progress)
    run.info = {
        "cupy": cp.__version__,
        "runtime_version": cp.cuda.runtime.runtimeGetVersion(),
        "driver_version": cp.cuda.runtime.driverGetVersion(),
        "multiprocessors": props.get("multiProcessorCount"),
    }
    run.step("first_use", lambda: _first_use(run, plan))
    c = _Cuda(cp)
    with c.stream:
        run.step("launch", lambda: _launch(run, plan, c))
        run.step("grid", lambda: _grid(run, plan, c))
        run.step("graph", lambda: _graph(run, plan, c))
        run.step("events", lambda: _events(run, plan, c))
        run.step("copies", lambda: _copies(run, plan, c))
        run.step("breakeven", lambda: _breakeven(run, plan, c))
    step = smallest_step(c.elapsed_seen)
    if step is not None:
        run.summary["timer_resolution_ns"] = float(round(step))  # float32 ms: 31.9 means 32
    return run


def _first_use(run: DeviceRun, plan: Plan) -> None:
    samples: dict[str, list[float]] = {k: [] for k, _ in FIRST_USE_ROWS}
    for _ in range(1 if plan.quick else 3):
        with tempfile.TemporaryDirectory(prefix="gputrace-cupy-cache-") as cache:
            done = subprocess.run(
                [sys.executable, "-c", FIRST_USE_SCRIPT, KERNELS],
                env=dict(os.environ, CUPY_CACHE_DIR=cache),
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"the fresh process failed: {tail}")
        got = json.loads(done.stdout.strip().splitlines()[-1])
        for k in samples:
            samples[k].append(float(got[k]))
    for key, what in FIRST_USE_ROWS:
        run.add(f"first_{key}", "first use (fresh process)", what, samples[key])
    parts = zip(samples["context"], samples["module"], samples["first_launch"], strict=True)
    run.summary["first_launch_ns"] = Stat.of([sum(p) for p in parts]).median


def _queued(
    c: _Cuda, launch: Callable[[], None], per: int, batches: int, stream: Any = None, spin_ns: float = 0.0
) -> tuple[list[float], list[float]]:
    """(CPU ns per launch, GPU ns per launch) of ``batches`` batches of ``per`` launches on
    ``stream`` (the current one; default ``c.stream``), each batch queued behind a spin kernel long
    enough that the GPU then runs it back to back (``spin_ns``; 0: measured from one batch)."""
    stream = c.stream if stream is None else stream
    clock = time.perf_counter_ns
    if not spin_ns:
        t0 = clock()
        for _ in range(per):
            launch()
        spin_ns = 3.0 * (clock() - t0) + 200_000.0  # the CPU enqueues a batch before the GPU reaches it
        stream.synchronize()
    cpu, gpu = [], []
    for _ in range(batches):
        c.spin((1,), (1,), (np.int64(int(spin_ns)),))
        c.ev0.record(stream)
        t0 = clock()
        for _ in range(per):
            launch()
        t1 = clock()
        c.ev1.record(stream)
        cpu.append((t1 - t0) / per)
        gpu.append(c.elapsed_ns() / per)
    return cpu, gpu


def _launch(run: DeviceRun, plan: Plan, c: _Cuda) -> None:
    empty = functools.partial(c.empty, (1,), (1,), ())
    for _ in range(200 if plan.quick else 2000):  # warm-up: module load, driver queues, clocks
        empty()
    c.stream.synchronize()
    cpu, gpu = _queued(c, empty, LAUNCH_BATCH, plan.batches)
    per_total = plan.batches * LAUNCH_BATCH
    run.add(
        "launch",
        "launch",
        f"empty kernel launch, queued ({per_total:,} launches)",
        cpu,
        gpu,
        per=LAUNCH_BATCH,
        note="wall: CPU enqueue per launch; device: GPU time per launch back to back",
        summary_wall="launch_cpu_ns",
        summary_device="launch_gpu_ns",
    )

    sync_wall, single_dev = c.wall_and_device(empty, plan.batches * 5)
    run.add(
        "launch_sync",
        "launch",
        "one empty launch + wait (idle GPU)",
        sync_wall,
        single_dev,
        note="wall: launch to synchronize() returning; device: event pair around it",
        summary_wall="launch_sync_ns",
    )


def _grid(run: DeviceRun, plan: Plan, c: _Cuda) -> None:
    per = 50
    for blocks in GRID_BLOCKS:
        launch = functools.partial(c.empty, (blocks,), (256,), ())
        for _ in range(20):
            launch()
        cpu, gpu = _queued(c, launch, per, max(5, plan.batches // 4))
        run.add(
            f"grid_{blocks}",
            "grid size",
            f"empty kernel, {blocks:,} blocks × 256 threads, queued",
            cpu,
            gpu,
            per=per,
        )


def _graph(run: DeviceRun, plan: Plan, c: _Cuda) -> None:
    gstream = c.cp.cuda.Stream(non_blocking=True)
    with gstream:
        gstream.begin_capture()
        for _ in range(GRAPH_KERNELS):
            c.empty((1,), (1,), ())
        graph = gstream.end_capture()
    for _ in range(20):
        graph.launch(gstream)
    gstream.synchronize()
    with gstream:  # (graph.launch() launches on the current stream)
        cpu, gpu = _queued(c, graph.launch, 1, plan.batches, gstream, spin_ns=200_000)
    run.add(
        "graph_launch",
        "CUDA graph",
        f"graph of {GRAPH_KERNELS} empty kernels: replay",
        cpu,
        note="wall: CPU cost of one graph launch",
        summary_wall="graph_launch_ns",  # the launch-free estimate's one launch
    )
    run.add(
        "graph_kernel",
        "CUDA graph",
        "graph replay, per kernel",
        [v / GRAPH_KERNELS for v in cpu],
        [v / GRAPH_KERNELS for v in gpu],
        per=GRAPH_KERNELS,
        note="compare with the queued launch row",
        summary_device="graph_kernel_gpu_ns",
    )


def _events(run: DeviceRun, plan: Plan, c: _Cuda) -> None:
    pair = []
    for _ in range(plan.batches * 5):
        c.ev0.record(c.stream)
        c.ev1.record(c.stream)
        pair.append(c.elapsed_ns())
    rec = wall_per_op(lambda: c.ev0.record(c.stream), batches=plan.batches, per_batch=100, warmup=100)
    c.stream.synchronize()
    run.add(
        "event_pair",
        "timing",
        "event pair with nothing between",
        rec,
        pair,
        note="wall: one Event.record(); device: the pair's floor",
    )


def _copies(run: DeviceRun, plan: Plan, c: _Cuda) -> None:
    import cupyx

    cp = c.cp
    rt = cp.cuda.runtime
    large = (64 if plan.quick else 256) << 20
    for nbytes in (1024, large):
        dev = cp.empty(nbytes, dtype=cp.uint8)
        pinned = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
        pinned[:] = 1
        hosts = {"pageable": np.ones(nbytes, dtype=np.uint8), "pinned": pinned}
        reps = (plan.batches * 5) if nbytes <= 1 << 20 else (5 if plan.quick else 20)
        size = "1 KB" if nbytes == 1024 else f"{nbytes >> 20} MB"
        for memory, host in hosts.items():
            hptr = host.ctypes.data
            for direction, kind, dst, src in (
                ("H2D", rt.memcpyHostToDevice, dev.data.ptr, hptr),
                ("D2H", rt.memcpyDeviceToHost, hptr, dev.data.ptr),
            ):
                copy = functools.partial(rt.memcpyAsync, dst, src, nbytes, kind, c.stream.ptr)
                copy()
                c.stream.synchronize()
                wall, device = c.wall_and_device(copy, reps)
                key = f"{direction.lower()}_{'1k' if nbytes == 1024 else 'large'}_{memory}"
                headline = nbytes == 1024 and memory == "pageable"
                run.add(
                    key,
                    "copies",
                    f"{direction} {size}, {memory} host memory",
                    wall,
                    device,
                    bytes=nbytes,
                    note="wall: copy + synchronize",
                    summary_wall=f"{direction.lower()}_1k_ns" if headline else None,
                )
        del dev, hosts, pinned


def _breakeven(run: DeviceRun, plan: Plan, c: _Cuda) -> None:
    cp = c.cp
    rt = cp.cuda.runtime
    a, b = np.float32(FMA_A), np.float32(FMA_B)

    def cases(n: int) -> Iterator[Case]:
        y = cp.ones(n, dtype=cp.float32)
        host = np.ones(n, dtype=np.float32)
        grid = ((n + 255) // 256,)
        dev, hptr, nbytes = y.data.ptr, host.ctypes.data, 4 * n
        for ops in INTENSITIES:
            kernel = functools.partial(c.fma, grid, (256,), (y, np.int64(n), np.int32(ops), a, b))

            def with_copies(kernel: Callable[[], None] = kernel) -> None:
                rt.memcpyAsync(dev, hptr, nbytes, rt.memcpyHostToDevice, c.stream.ptr)
                kernel()
                rt.memcpyAsync(hptr, dev, nbytes, rt.memcpyDeviceToHost, c.stream.ptr)

            yield ops, kernel, with_copies

    def median_wall(fn: Callable[[], None]) -> float:
        return Stat.of(wall_per_op(c.synced(fn), batches=plan.reps, per_batch=1, warmup=2)).median

    run.gpu_breakeven(plan.sizes, cases, median_wall)
