"""Device probe: what starting CUPTI costs, gputrace's start against the same calls made raw and Proton.

    python3 benchmarks/probe_cupti_start.py [REPS]       # on a CUDA machine (CuPy; Triton for Proton)

Each run is a fresh process that imports CuPy and runs one kernel first, then times one of:
``gputrace`` (the session made and entered, CUPTI timing, with the backend's own split,
``backend_info.cupti_start_ms``); ``proton`` (``proton.start``, backend cupti); ``ctypes-ours``
(the libcupti gputrace finds, loaded with ctypes: its load, the first
``cuptiActivityRegisterCallbacks``, where CUPTI initializes itself, and enabling kernel records);
``ctypes-triton``, the same with the libcupti that Triton ships, where it has one. Prints the
medians over REPS rounds (default 5), in ms. The question it answers: is the registration's
13-24 ms CUPTI's own floor in any process, or the cost of one libcupti build, given that
Proton's whole start reads 12-19 ms.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import ctypes, json, os, sys, tempfile, time
variant, lib = sys.argv[1], sys.argv[2]
import cupy
x = cupy.zeros(256, cupy.float32)
x += 1
cupy.cuda.runtime.deviceSynchronize()
clock = time.perf_counter_ns
out = {}
if variant == "gputrace":
    import gputrace
    t0 = clock()
    s = gputrace.session(os.path.join(tempfile.mkdtemp(), "t.json.gz"), backend="cuda",
                         backend_options={"timing": "cupti"}, quiet=True)
    t1 = clock()
    s.__enter__()
    t2 = clock()
    split = s.backend_info.get("cupti_start_ms") or {}
    out = {"make": (t1 - t0) / 1e6, "enter": (t2 - t1) / 1e6, "total": (t2 - t0) / 1e6, **split}
    s.__exit__(None, None, None)
elif variant == "proton":
    import triton.profiler as proton
    t0 = clock()
    proton.start(os.path.join(tempfile.mkdtemp(), "p"), backend="cupti")
    out = {"total": (clock() - t0) / 1e6}
    proton.finalize()
else:
    size_p = ctypes.POINTER(ctypes.c_size_t)
    requested_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), size_p, size_p)
    completed_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p,
                                   ctypes.c_size_t, ctypes.c_size_t)
    kept = []
    def requested(buf, size, max_records):
        b = ctypes.create_string_buffer(1 << 20)
        kept.append(b)
        buf[0] = ctypes.cast(b, ctypes.c_void_p)
        size[0] = 1 << 20
        max_records[0] = 0
    on_requested, on_completed = requested_t(requested), completed_t(lambda *a: None)
    t0 = clock()
    cupti = ctypes.CDLL(lib)
    t1 = clock()
    rc = cupti.cuptiActivityRegisterCallbacks(on_requested, on_completed)
    t2 = clock()
    rc = rc or cupti.cuptiActivityEnable(10)  # CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
    t3 = clock()
    version = ctypes.c_uint32()
    cupti.cuptiGetVersion(ctypes.byref(version))
    out = {"load": (t1 - t0) / 1e6, "register": (t2 - t1) / 1e6, "enable": (t3 - t2) / 1e6,
           "total": (t3 - t0) / 1e6, "rc": rc, "version": version.value}
    cupti.cuptiActivityFlushAll(1)
print("RESULT " + json.dumps(out))
"""


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    root = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, root)
    from gputrace.backends.cupti_lib import find_libcupti

    ours = find_libcupti() or ""
    triton = importlib.util.find_spec("triton")
    theirs = sorted(glob.glob(os.path.join(os.path.dirname(triton.origin or ""), "**", "libcupti.so*"),
                              recursive=True)) if triton else []  # fmt: skip
    print(f"gputrace's libcupti: {ours}\nTriton's: {theirs[-1] if theirs else 'none'}")
    variants = [("gputrace", "gputrace", ""), ("proton", "proton", ""), ("ctypes-ours", "ctypes", ours)]
    if theirs:
        variants.append(("ctypes-triton", "ctypes", theirs[-1]))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in variants}
    for _ in range(reps):  # the variants interleaved in each round
        for name, kind, lib in variants:
            p = subprocess.run([sys.executable, "-c", CHILD, kind, lib], capture_output=True, text=True,
                               env=env, timeout=120)  # fmt: skip
            got = [line[7:] for line in p.stdout.splitlines() if line.startswith("RESULT ")]
            if got:
                runs[name].append(json.loads(got[0]))
            else:
                print(f"{name} failed: {p.stderr[-600:]}")
    print(f"\nmedians over {reps} fresh processes, ms")
    for name, got in runs.items():
        if got:
            keys = [k for k, v in got[0].items() if isinstance(v, (int, float))]
            medians = (f"{k}={statistics.median(r.get(k, 0) for r in got):.2f}" for k in keys)
            print(f"{name:<14}", "  ".join(medians))


if __name__ == "__main__":
    main()
