"""Where a launch-bound loop's time goes under each profiler: wall, this thread's CPU, all threads' CPU.

    python3 benchmarks/probe_loop_cpu.py [--n 100000] [--reps 3]     # on a CUDA GPU

The loop of ``bench_programs.py``'s ``tiny100k`` (one ``x += 1`` on 256 floats per scope, no sync
until the end), each variant in its own process, rounds interleaved, median over the rounds. The
main thread's CPU time against the loop's wall time says whether the loop waited (for the GIL
another thread of the program held, or for the driver); the process's CPU time less the main
thread's is what the other threads of the program used (CUPTI's own, gputrace's streamer).
Variants: ``bare``; ``rawsame`` (CUPTI with gputrace's kinds through cupti-python, no scopes);
``scopes`` (gputrace scopes, cpu backend: the recorder alone); ``cupti_noscope`` (a gputrace
CUPTI session, the loop without scopes: what collecting and writing the kernels costs);
``cupti`` (gputrace CUPTI → .json, the default writer process); ``cupti_nostream`` (the same,
no chunk before the stop: ``flush_s`` longer than the run); ``cupti_gz`` (→ .json.gz); ``events``
(CUDA events timing → .json.gz) and ``events_nostream`` (the same, no chunk before the stop).
A second table splits the loop's CPU time by thread (``/proc/self/task/*/schedstat``): Python's
threads by name, the others (CUPTI's, the CUDA driver's) as "native".
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
n, variant, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import cupy, contextlib
x = cupy.zeros(256, cupy.float32)
x += 1
cupy.cuda.runtime.deviceSynchronize()
scope = lambda name: contextlib.nullcontext()
stop = lambda: None
if variant == "rawsame":
    from cupti import cupti
    K = cupti.ActivityKind
    cupti.activity_register_callbacks(lambda: (1 << 20, 0), lambda a: None)
    for k in (K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET):
        cupti.activity_enable(k)
    from gputrace.backends import cupti_cbids as ids
    for table, enable in ((ids.DRIVER, cupti.activity_enable_driver_api),
                          (ids.RUNTIME, cupti.activity_enable_runtime_api)):
        for cbid in table:
            try:
                enable(cbid, 1)
            except cupti.cuptiError:
                pass
    stop = lambda: cupti.activity_flush_all(1)
elif variant != "bare":
    import gputrace
    timing = "events" if variant.startswith("events") else "cupti"
    kw = {"backend": "cpu"} if variant == "scopes" else {
        "backend": "cuda", "backend_options": {"timing": timing}}
    if variant.endswith("_nostream"):
        kw["flush_s"] = 1e6
    path = out + (".json.gz" if variant in ("cupti_gz", "events") else ".json")
    s = gputrace.session(path, quiet=True, **kw)
    s.__enter__()
    scope = gputrace.trace
    stop = lambda: s.__exit__(None, None, None)
if variant == "cupti_noscope":
    scope = lambda name: contextlib.nullcontext()
import os, threading
def on_cpu():  # ns each thread of the process ran (schedstat), by thread name (native: not Python's)
    names = {t.native_id: t.name for t in threading.enumerate()}
    got = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except OSError:
            continue
        name = names.get(int(tid), "native")
        got[name] = got.get(name, 0) + ns
    return got
t0 = on_cpu()
w0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
for _ in range(n):
    with scope("tiny"):
        x += 1
cupy.cuda.runtime.deviceSynchronize()
w1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
t1 = on_cpu()
stop()
print(json.dumps({"wall": (w1 - w0) * 1e3, "main_cpu": (c1 - c0) * 1e3,
                  "others_cpu": ((p1 - p0) - (c1 - c0)) * 1e3,
                  "threads": {k: (v - t0.get(k, 0)) / 1e6 for k, v in t1.items()}}))
"""

VARIANTS = (
    "bare",
    "rawsame",
    "scopes",
    "cupti_noscope",
    "cupti",
    "cupti_nostream",
    "cupti_gz",
    "events",
    "events_nostream",
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    variants = a.variants.split(",")
    got: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.reps):
            for v in variants:
                p = subprocess.run([sys.executable, "-c", CHILD, str(a.n), v, str(Path(d) / v)],
                                   capture_output=True, text=True, cwd=d, timeout=300)  # fmt: skip
                if p.returncode == 0:
                    got[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
                else:
                    print(v, "failed:", (p.stderr.strip().splitlines() or ["?"])[-1][:100])
    bare = statistics.median(r["wall"] for r in got["bare"]) if got.get("bare") else float("nan")
    print(f"{a.n:,} tiny kernels, one scope each; median of {a.reps} rounds (ms; µs a scope over bare)")
    print(f"{'variant':<16}{'loop wall':>10}{'main CPU':>10}{'others CPU':>11}{'µs/scope':>10}")
    for v in variants:
        if got[v]:
            m = {k: statistics.median(r[k] for r in got[v]) for k in ("wall", "main_cpu", "others_cpu")}
            extra = (m["wall"] - bare) * 1e3 / a.n
            print(f"{v:<16}{m['wall']:>10.1f}{m['main_cpu']:>10.1f}{m['others_cpu']:>11.1f}{extra:>10.2f}")
    print("CPU ms of each thread during the loop (median; 'native': threads Python did not start)")
    for v in variants:
        if got[v]:
            names = sorted({k for r in got[v] for k in r["threads"]})
            cells = [f"{k} {statistics.median(r['threads'].get(k, 0.0) for r in got[v]):.0f}" for k in names]
            print(f"{v:<16}" + ", ".join(cells))


if __name__ == "__main__":
    main()
