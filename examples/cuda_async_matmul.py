"""Lesson 1: a GPU call returns after enqueueing; the work runs later.

    python3 examples/cuda_async_matmul.py [trace-path]

Twenty 4096×4096 matmuls are enqueued in a loop. Each ``with gputrace.trace("matmul")`` returns
to Python in microseconds, while the GPU needs milliseconds per matmul, so the queue grows: the
"queued" gap (GPU start − submission) climbs by about one matmul per step. A wall clock around
the call would have measured the enqueueing only. Open the trace in https://ui.perfetto.dev to see
the CPU slices, the GPU slices, and the queued slices between them.
"""

from __future__ import annotations

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

import gputrace


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "cuda_async_matmul.json").resolve()
    a = cupy.random.rand(4096, 4096, dtype=cupy.float32)
    (a @ a).sum()  # warm cuBLAS outside the trace: this example is about the queue, not cold starts
    cupy.cuda.Device().synchronize()
    with gputrace.session(path, backend="cuda") as s:
        for step in range(20):
            with gputrace.trace("matmul", step=step):
                b = a @ a
        with gputrace.trace("result"):
            total = float(b.sum())  # float() waits for the GPU: this scope's CPU time is the wait
    t = s.trace
    assert t is not None
    print(f"sum = {total:.4g}")
    print(f"{'step':>4}  {'CPU enqueue µs':>14}  {'GPU ms':>7}  {'queued ms':>9}")
    for sc in t.find("matmul"):
        gpu_ms = sc.gpu_ns / 1e6 if sc.gpu_ns is not None else float("nan")
        gap_ms = sc.queue_gap_ns / 1e6 if sc.queue_gap_ns is not None else float("nan")
        print(f"{sc.args['step']:>4}  {sc.cpu_ns / 1e3:>14.1f}  {gpu_ms:>7.3f}  {gap_ms:>9.3f}")
    (res,) = t.find("result")
    print(f"'result' waited {res.cpu_ns / 1e6:.2f} ms on the CPU for the queue to drain")
    print(f"clock alignment uncertainty: ±{t.header['clock'][0]['uncertainty_ns'] / 1e3:.1f} µs")
    print(f"trace written to {path}")


if __name__ == "__main__":
    main()
