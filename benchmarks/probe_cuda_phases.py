"""Where a CUDA session's time goes, phase by phase, on a real GPU (cProfile of start and stop).

    python3 benchmarks/probe_cuda_phases.py [cupti|events] [n]
    PROBE_MATMUL=1 python3 benchmarks/probe_cuda_phases.py bare,events 60   # the GPU-bound loop

Runs the 20k tiny-kernel loop of ``bench_cuda.py --only programs`` once under a gputrace session,
prints start / loop / stop in ms, then the cProfile of session start (cumulative) and of stop
(internal time). Also times raw CUPTI with each activity-kind set, to show what CUPTI itself costs.
"""

from __future__ import annotations

import compileall
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import cProfile, pstats, sys, time, os, tempfile, json
import cupy as cp
mode, n, prof = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
def stalls(gaps):
    g = sorted(gaps)
    return {"iter_p50_us": g[len(g) // 2] / 1e3, "iter_p999_us": g[int(len(g) * 0.999)] / 1e3,
            "iter_max_us": g[-1] / 1e3}
x = cp.zeros(256, dtype=cp.float32)
x += 1; cp.cuda.Device().synchronize()
if os.environ.get("PROBE_MATMUL") == "1":  # the GPU-bound workload: 4096² matmuls
    a = cp.random.rand(4096, 4096, dtype=cp.float32)
    class _M:
        def __iadd__(self, _one):
            a @ a
            return self
    a @ a; cp.cuda.Device().synchronize()
    x = _M()
if mode.startswith("raw"):
    from cupti import cupti
    K = cupti.ActivityKind
    kinds = {"raw_k": [K.CONCURRENT_KERNEL], "raw_kd": [K.CONCURRENT_KERNEL, K.DRIVER],
             "raw_kdr": [K.CONCURRENT_KERNEL, K.DRIVER, K.RUNTIME],
             "raw_kdr_py": [K.CONCURRENT_KERNEL, K.DRIVER, K.RUNTIME],
             "raw_kd_filt": [K.CONCURRENT_KERNEL, K.DRIVER],
             "raw_kdr_filt": [K.CONCURRENT_KERNEL, K.DRIVER, K.RUNTIME]}[mode]
    recs = [0, 0]
    def req(): return 1 << 20, 0
    if mode == "raw_kdr_py":
        def done(acts):
            for a in acts:
                recs[1] += a.start & 1
            recs[0] += len(acts)
    else:
        def done(acts): recs[0] += len(acts)
    t0 = time.perf_counter_ns()
    cupti.activity_register_callbacks(req, done)
    for k in kinds: cupti.activity_enable(k)
    if mode.endswith("_filt"):
        import re
        keep = re.compile(r"Launch|Memcpy|Memset|Synchronize")
        for enum_, enable in ((cupti.DriverApiTraceCbid, cupti.activity_enable_driver_api),
                              (cupti.RuntimeApiTraceCbid, cupti.activity_enable_runtime_api)):
            for m in enum_:
                if m.name in ("INVALID", "SIZE", "FORCE_INT"):
                    continue
                try:
                    enable(int(m), 1 if keep.search(m.name) else 0)
                except Exception:
                    pass
    ta = time.perf_counter_ns()
    for _ in range(n): x += 1
    cp.cuda.Device().synchronize()
    tb = time.perf_counter_ns()
    cupti.activity_flush_all(1)
    for k in kinds: cupti.activity_disable(k)
    tc = time.perf_counter_ns()
    print(json.dumps({"mode": mode, "start": (ta-t0)/1e6, "loop": (tb-ta)/1e6, "stop": (tc-tb)/1e6,
                      "records": recs[0]}))
    sys.exit(0)
if mode == "bare":
    t0 = time.perf_counter_ns()
    gaps = [0] * n
    clk = time.perf_counter_ns
    prev = clk()
    for i in range(n):
        x += 1
        now = clk(); gaps[i] = now - prev; prev = now
    cp.cuda.Device().synchronize()
    t1 = time.perf_counter_ns()
    print(json.dumps({"mode": mode, "start": 0, "loop": (t1-t0)/1e6, "stop": 0, **stalls(gaps)}))
    sys.exit(0)
import gputrace
from gputrace.backends import cupti_lib
bufs = []
_done = cupti_lib.LibCuptiSource._completed
def _timed_done(self, *args):
    t = time.perf_counter_ns(); _done(self, *args); bufs.append((time.perf_counter_ns() - t) / 1e3)
cupti_lib.LibCuptiSource._completed = _timed_done
out = os.path.join(tempfile.mkdtemp(), "t.json")
t0 = time.perf_counter_ns()
opts = {"timing": mode.split("_")[0]}
if mode == "cupti_nofilter":
    opts["api_filter"] = False
s = gputrace.session(out, backend="cuda", quiet=True, backend_options=opts)
if prof:
    p1 = cProfile.Profile(); p1.enable(); s.start(); p1.disable()
else:
    s.start()
ta = time.perf_counter_ns()
# the file writer's own time (encode + write), to tell the stop's other work from writing
wr_ns = [0]
w = getattr(getattr(s, "_streamer", None), "writer", None)
for meth in ("append", "close") if w is not None else ():
    def _timed(*a, _f=getattr(w, meth), **k):
        t = time.perf_counter_ns()
        try:
            return _f(*a, **k)
        finally:
            wr_ns[0] += time.perf_counter_ns() - t
    setattr(w, meth, _timed)
tr = gputrace.trace("tiny")
import gc
gcs = []
def on_gc(phase, info, _t=[0]):
    if phase == "start":
        _t[0] = time.perf_counter_ns()
    else:
        gcs.append((info["generation"], (time.perf_counter_ns() - _t[0]) / 1e3))
gc.callbacks.append(on_gc)
gaps = [0] * n
clk = time.perf_counter_ns
prev = clk()
for i in range(n):
    with tr:
        x += 1
    now = clk(); gaps[i] = now - prev; prev = now
tb = time.perf_counter_ns()
gc.callbacks.remove(on_gc)
top = sorted(range(n), key=lambda i: -gaps[i])[:3]
print("worst gaps (iteration, µs):", [(i, gaps[i] / 1e3) for i in top], file=sys.stderr)
print("gc in loop (gen, µs), > 500 µs:", [g for g in gcs if g[1] > 500], "count", len(gcs), file=sys.stderr)
print("CUPTI buffers in loop:", len(bufs), "max µs", max(bufs, default=0), file=sys.stderr)
if prof:
    p2 = cProfile.Profile(); p2.enable(); s.__exit__(None, None, None); p2.disable()
else:
    s.__exit__(None, None, None)
tc = time.perf_counter_ns()
if prof:
    print("== start, cumulative", file=sys.stderr)
    pstats.Stats(p1, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    print("== stop, tottime", file=sys.stderr)
    pstats.Stats(p2, stream=sys.stderr).sort_stats(os.environ.get("PROBE_SORT", "tottime")).print_stats(45)
info = s.trace.header["backend_info"]
print(json.dumps({"mode": mode, "start": (ta-t0)/1e6, "loop": (tb-ta)/1e6, "stop": (tc-tb)/1e6,
                  **stalls(gaps), "write_ms": wr_ns[0] / 1e6,
                  "bytes": os.path.getsize(out), "cupti_start_ms": info.get("cupti_start_ms"),
                  "api_records": info.get("cupti_api_records"), "timing": info.get("timing")}))
"""


def main() -> int:
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    default = ["bare", "raw_k", "raw_kd", "raw_kdr", "raw_kdr_filt", "cupti", "cupti_nofilter", "events"]
    modes = sys.argv[1].split(",") if len(sys.argv) > 1 else default
    # byte-compiled once, as an installed package is (a checkout copied to a machine is not)
    for pkg in ("cupti", "elftools", "numpy"):
        spec = importlib.util.find_spec(pkg)
        for loc in (spec.submodule_search_locations or []) if spec else []:
            compileall.compile_dir(loc, quiet=1)
    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "gputrace"), quiet=1)
    rows: list[dict[str, object]] = []
    rounds = int(os.environ.get("PROBE_ROUNDS", "2"))
    for rnd in range(rounds):
        for m in modes:
            prof = rnd == rounds - 1 and m in ("cupti", "events") and os.environ.get("PROBE_PROFILE") == "1"
            r = subprocess.run(
                [sys.executable, "-c", CHILD, m, str(n), "1" if prof else "0"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if r.returncode != 0:
                print(m, "failed:", r.stderr[-2000:])
                continue
            if prof:
                print(f"---- {m} profile ----")
                print(r.stderr[-9000:])
            else:
                print(
                    m,
                    "\n".join(
                        ln for ln in r.stderr.splitlines() if ln.startswith(("worst", "gc in", "CUPTI buf"))
                    ),
                )
                rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    print(f"{'mode':14} {'start':>8} {'loop':>8} {'stop':>8}  extra")
    for r in rows:
        m, t0, t1, t2 = r.pop("mode"), r.pop("start"), r.pop("loop"), r.pop("stop")
        print(f"{m:14} {t0:8.1f} {t1:8.1f} {t2:8.1f}  {json.dumps(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
