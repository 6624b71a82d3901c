"""Peak memory of a long CUPTI-timed run without a sync, against the same program bare.

    python3 benchmarks/bench_cupti_memory.py [KERNELS]      # on a CUDA GPU; default 1,000,000

KERNELS tiny kernels (``x += 1``), 1,000 per scope, no sync until the end; each variant in its
own process; peak RSS (``ru_maxrss``) and wall time, and the peak of the session's writer process
(``gputrace.appender``: it holds the file's writer, apart from the program). The streamed CUPTI
file is written while the program runs, so its peak should stay near the bare program's.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import cupy
def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
def final_header(path):  # a .json.gz trace's final header: the JSON after its events, streamed
    import zlib
    z, tail = zlib.decompressobj(31), b""
    with open(path, "rb") as f:
        while data := f.read(1 << 24):
            tail = (tail + z.decompress(data))[-(8 << 20):]
    tail += z.flush()
    at = tail.rfind(b'],"gputrace":') + len(b'],"gputrace":')
    return json.JSONDecoder().raw_decode(tail[at:].decode())[0]
started = 0.0
n, variant, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
x = cupy.zeros(256, cupy.float32); x += 1; cupy.cuda.runtime.deviceSynchronize()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
marks = []
if variant in ("bare", "rawcupti"):
    if variant == "rawcupti":  # CUPTI's own cost: kernel + driver records, counted and dropped
        from cupti import cupti
        got = [0]
        def completed(acts):
            got[0] += len(acts)
        cupti.activity_register_callbacks(lambda: (1 << 20, 0), completed)
        cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)
        cupti.activity_enable(cupti.ActivityKind.DRIVER)
        started = rss_mb()
    for i in range(n // 1000):
        for _ in range(1000):
            x += 1
        if i % (n // 4000) == 0:
            marks.append(round(rss_mb()))
    cupy.cuda.runtime.deviceSynchronize()
    if variant == "rawcupti":
        cupti.activity_flush_all(1)
else:
    import gputrace
    if variant == "cupti_traced":  # Python and numpy allocations, traced (their peak; slower)
        import tracemalloc
        tracemalloc.start()
    with gputrace.session(out, backend="cuda", backend_options={"timing": "cupti"}, quiet=True) as s:
        started = rss_mb()  # what starting costs (imports, libcupti, CUPTI's own state), not held
        tr = gputrace.trace("block")
        for i in range(n // 1000):
            with tr:
                for _ in range(1000):
                    x += 1
                if i % (n // 4000) == 0:
                    marks.append(round(rss_mb()))
        cupy.cuda.runtime.deviceSynchronize()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # (before reading the file back)
    took = time.perf_counter() - t0
    if variant == "cupti_traced":
        marks.append({"traced_peak_mb": round(tracemalloc.get_traced_memory()[1] / 2**20, 1)})
    info = s.backend_info
    keys = ("cupti_buffers", "cupti_buffers_allocated", "cupti_dropped_records", "cupti_incomplete_records",
            "launch_calls_without_operations")
    marks.append({k: info.get(k) for k in keys})
    header = final_header(out)  # (a long run's file decompresses past load's 2 GiB cap)
    marks.append({"ops": header.get("ops"), "chunks": header.get("streamed")})
if variant in ("bare", "rawcupti"):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    took = time.perf_counter() - t0
writer = None  # the writer process's own peak (VmHWM: ru_maxrss would count its fork's pages)
if variant not in ("bare", "rawcupti"):
    writer = (header.get("writer_process") or {}).get("peak_rss_mb")
print(json.dumps({"variant": variant, "before_mb": base / 1024, "peak_mb": peak / 1024, "s": took,
                  "writer_mb": writer,
                  "started_mb": started, "rss_quarters": marks}))
"""


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    # cupti_malloc: glibc told to give large blocks back (fixed mmap threshold, two arenas), to
    # tell the heap's retention apart from what is held
    malloc = {"MALLOC_MMAP_THRESHOLD_": "262144", "MALLOC_ARENA_MAX": "2"}
    for v in os.environ.get("VARIANTS", "bare,rawcupti,cupti_jsongz,cupti_malloc,cupti_traced").split(","):
        out = f"/tmp/mem-{v}.json.gz"
        p = subprocess.run(
            [sys.executable, "-c", CHILD, str(n), v.replace("cupti_malloc", "cupti_jsongz"), out],
            capture_output=True, text=True, env=dict(env, **malloc) if v == "cupti_malloc" else env, cwd="/",
        )  # fmt: skip
        if p.returncode:
            print(v, "failed:", p.stderr.strip().splitlines()[-1:])
            continue
        rows.append(dict(json.loads(p.stdout.strip().splitlines()[-1]), variant=v))
    print(f"{n:,} kernels, 1,000 per scope, no sync")
    for r in rows:
        print(
            f"{r['variant']:<14} peak {r['peak_mb']:8.1f} MB "
            f"(at loop start {r['before_mb']:7.1f}, RSS after the session's start "
            f"{r['started_mb']:7.1f})  {r['s']:6.2f} s; writer process peak {r['writer_mb']} MB; "
            f"RSS by quarter {r['rss_quarters']}"
        )
    bare = [r for r in rows if r["variant"] == "bare"]
    for r in rows:
        if bare and r is not bare[0]:
            print(f"{r['variant']} peak over bare: {r['peak_mb'] - bare[0]['peak_mb']:.1f} MB")


if __name__ == "__main__":
    main()
