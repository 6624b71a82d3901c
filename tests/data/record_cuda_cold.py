"""Record tests/data/cuda_h200_cold.json.gz: a CuPy program whose first matmul is cold, on the H200.

    python3 tests/data/record_cuda_cold.py OUT.json.gz      # on a machine with CuPy and CUPTI

What it runs (one CUPTI-timed session, gputrace's code at the time of recording):
- "setup": allocates two 1024x1024 float32 matrices (cupy.random), a sync;
- "cold matmul": the first a @ b of the process (cuBLAS handle creation and heuristics, kernel load),
  then a sync;
- 5 x "step" with children "matmul" (a @ b) and "scale" (c * 0.5 + 1, an elementwise kernel whose
  first call compiles through NVRTC or loads from CuPy's cache), a sync after each step;
- "tail": one more matmul, no sync of its own (the session's stop syncs).
The header's metadata names the program and the versions.
"""

import sys

import cupy

import gputrace

out = sys.argv[1] if len(sys.argv) > 1 else "cuda_h200_cold.json.gz"
with gputrace.session(
    out,
    backend="cuda",
    backend_options={"timing": "cupti"},
    quiet=True,
    metadata={"program": "tests/data/record_cuda_cold.py", "cupy": cupy.__version__},
):
    with gputrace.trace("setup"):
        a = cupy.random.rand(1024, 1024, dtype=cupy.float32)
        b = cupy.random.rand(1024, 1024, dtype=cupy.float32)
    gputrace.sync()
    with gputrace.trace("cold matmul"):
        c = a @ b
    gputrace.sync()
    for _ in range(5):
        with gputrace.trace("step"):
            with gputrace.trace("matmul"):
                c = a @ b
            with gputrace.trace("scale"):
                c = c * 0.5 + 1
        gputrace.sync()
    with gputrace.trace("tail"):
        c = a @ b
print("wrote", out)
