"""Where a CUPTI-timed session's stop goes, on a real GPU: cProfile of the stop of one program.

    python3 benchmarks/probe_cupti_stop.py [solver|tiny] [OUT]     # on a CUDA GPU

``solver``: 300 iterations of 4 scopes and 18 small kernels with a read-back each (the shape of
bench_programs.py's solver); ``tiny``: 20,000 scopes of one tiny kernel. Prints the stop's wall
time and the functions that took most of it (cumulative, then own time).
"""

import cProfile
import pstats
import sys
import time

import cupy

import gputrace

shape = sys.argv[1] if len(sys.argv) > 1 else "solver"
out = sys.argv[2] if len(sys.argv) > 2 else "/tmp/probe_stop.json"
n = 2048
A = cupy.random.rand(n, n, dtype=cupy.float32) / n + cupy.eye(n, dtype=cupy.float32)
xv, r = cupy.zeros(n, cupy.float32), cupy.random.rand(n, dtype=cupy.float32)
p = r.copy()
x = cupy.zeros(256, cupy.float32)


def iteration(s):  # type: ignore[no-untyped-def]
    global xv, r, p
    with s("matvec"):
        q = A @ p
    with s("dots"):
        rr = r @ r
        alpha = rr / (p @ q)
    with s("update"):
        xv += alpha * p
        r -= alpha * q
    with s("check"):
        rr2 = r @ r
        p *= rr2 / rr
        p += r
        res = cupy.sqrt(rr2)
        for _ in range(5):
            res = res * 1.0
        float(res)


import contextlib  # noqa: E402

iteration(lambda name: contextlib.nullcontext())
x += 1
cupy.cuda.runtime.deviceSynchronize()
s = gputrace.session(out, backend="cuda", backend_options={"timing": "cupti"}, quiet=True)
s.__enter__()
if shape == "solver":
    for _ in range(300):
        iteration(gputrace.trace)
else:
    for _ in range(20_000):
        with gputrace.trace("tiny"):
            x += 1
cupy.cuda.runtime.deviceSynchronize()
pr = cProfile.Profile()
t0 = time.perf_counter()
pr.enable()
s.__exit__(None, None, None)
pr.disable()
print(
    f"{shape}: stop {(time.perf_counter() - t0) * 1e3:.1f} ms; ops {len(s.trace.ops)}, scopes {len(s.trace)}"
)
st = pstats.Stats(pr)
st.sort_stats("cumtime").print_stats(r"gputrace", 22)
st.sort_stats("tottime").print_stats(12)
st.print_callers(r"acquire|join|sleep")  # who waited (a lock wait is a thread's work elsewhere)
print("start ms:", s.backend_info.get("cupti_start_ms"))
