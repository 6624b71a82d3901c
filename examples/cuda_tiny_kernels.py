"""Lesson 6: tiny kernels are dominated by launch overhead.

    python3 examples/cuda_tiny_kernels.py [trace-path]

Adding 1 to a 1024-element array a thousand times, one launch each, costs Python several
microseconds per launch while the GPU needs one or two to run it: the GPU waits for the CPU.
gputrace shows it twice. First with an idle GPU: each tiny scope's GPU span then measures mostly
the wait for the launch to arrive (an event pair times everything between its two records).
Then the same thousand launches queued behind a 20 ms busy kernel, so they run back to back:
their GPU spans now show what the work itself costs. The same work as one launch over a
1000×1024 array is cheaper than either.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

try:
    import cupy
except ImportError:
    sys.exit(
        f"{Path(__file__).name} needs CuPy and a CUDA GPU, and CuPy could not be imported (pip install "
        "'gputrace[cuda13]' or 'gputrace[cuda12]'); examples/quickstart.py runs on any machine."
    )
if not cupy.cuda.is_available():
    sys.exit(
        f"{Path(__file__).name} needs a CUDA GPU, and CuPy finds none; "
        "examples/quickstart.py runs on any machine."
    )
import numpy as np

import gputrace

BUSY = cupy.RawKernel(
    r"""
extern "C" __global__ void busy_ns(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}""",
    "busy_ns",
)


def launches(small: cupy.ndarray, name: str) -> None:
    with gputrace.trace(name):
        for _ in range(1000):
            with gputrace.trace(f"tiny ({name})"):
                small += 1


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "cuda_tiny_kernels.json").resolve()
    small = cupy.zeros(1024, dtype=cupy.float32)
    big = cupy.zeros((1000, 1024), dtype=cupy.float32)
    small += 1
    big += 1  # compile outside the trace
    BUSY((1,), (1,), (np.uint64(1000),))
    cupy.cuda.Device().synchronize()
    with gputrace.session(path, backend="cuda") as s:
        launches(small, "idle GPU")
        gputrace.sync()
        BUSY((1,), (1,), (np.uint64(20_000_000),))  # the next launches queue up behind this
        launches(small, "queued")
        gputrace.sync()
        with gputrace.trace("one big launch"):
            big += 1
    t = s.trace
    assert t is not None
    print(f"{'1000 launches':<14}  {'CPU µs/launch':>13}  {'GPU µs/launch':>13}  {'GPU span ms':>11}")
    for name in ("idle GPU", "queued"):
        tiny = t.find(f"tiny ({name})")[1:]
        (loop,) = t.find(name)
        cpu = statistics.median(sc.cpu_ns for sc in tiny) / 1e3
        gpu = statistics.median(sc.gpu_ns or 0 for sc in tiny) / 1e3
        print(f"{name:<14}  {cpu:>13.2f}  {gpu:>13.2f}  {(loop.gpu_ns or 0) / 1e6:>11.2f}")
    (one,) = t.find("one big launch")
    print(f"one launch over all 1000×1024 elements: GPU {(one.gpu_ns or 0) / 1e3:.1f} µs")
    print(f"trace written to {path}")


if __name__ == "__main__":
    main()
