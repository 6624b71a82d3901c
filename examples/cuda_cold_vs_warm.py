"""Lesson 2: the first call of a kernel pays for its compilation; later calls do not.

    python3 examples/cuda_cold_vs_warm.py [trace-path]

CuPy compiles an elementwise kernel the first time it runs (NVRTC, then a disk cache under
``~/.cupy/kernel_cache``). The kernel here carries a per-run constant so the disk cache cannot
serve it and every run shows a real compilation. gputrace flags the first call of each scope name
``cold``; the table shows its CPU time next to the warm calls, and that the GPU time barely
differs: the cost is on the CPU, before the launch.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
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

import gputrace


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "cuda_cold_vs_warm.json").resolve()
    nonce = f"{os.getpid()}.{time.time_ns() % 1_000_000}f"
    scale = cupy.ElementwiseKernel(
        "float32 x", "float32 y", f"y = x * 2.0f + {nonce} * 0.0f", "gputrace_example_scale"
    )
    x = cupy.ones(1 << 20, dtype=cupy.float32)
    with gputrace.session(path, backend="cuda") as s:
        for _ in range(10):
            with gputrace.trace("scale"):
                scale(x)
            gputrace.sync()
    t = s.trace
    assert t is not None
    calls = t.find("scale")
    print(f"{'call':>4}  {'flags':<12}  {'CPU µs':>10}  {'GPU µs':>8}")
    for i, sc in enumerate(calls):
        gpu_us = sc.gpu_ns / 1e3 if sc.gpu_ns is not None else float("nan")
        print(f"{i:>4}  {','.join(sc.flag_names) or '-':<12}  {sc.cpu_ns / 1e3:>10.1f}  {gpu_us:>8.2f}")
    warm = statistics.median(sc.cpu_ns for sc in calls[1:])
    print(f"cold call: {calls[0].cpu_ns / 1e3:.0f} µs on the CPU, {calls[0].cpu_ns / warm:.0f}× a warm call")
    print(f"trace written to {path}")


if __name__ == "__main__":
    main()
