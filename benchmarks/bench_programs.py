"""Whole programs with and without a profiler, on a CUDA GPU: issue 22's table as a script.

    python3 benchmarks/bench_programs.py                       # every program and variant, best of 3
    python3 benchmarks/bench_programs.py --programs tiny20k --variants bare,cupti_jsongz --reps 1
    python3 benchmarks/bench_programs.py --json out.json      # every run's numbers too
    python3 benchmarks/bench_programs.py --seconds 400        # the rounds that fit (a time-boxed machine)
    python3 benchmarks/bench_programs.py --tree old=/tmp/old --variants bare,cupti_jsongz,cupti_jsongz@old
                                                  # a variant of another checkout, in the same rounds
    python3 benchmarks/bench_programs.py --variants bare,cupti_jsongz,cupti_jsongz+thread
                                                  # the stream written in the program's process

Programs (CuPy; each warmed up before the clock starts, so compiling its kernels is not counted):
- ``tiny20k``: 20,000 tiny kernels (``x += 1`` on 256 floats), one scope each;
- ``tiny100k``: 100,000 of them, one scope each, no sync until the end;
- ``solver``: a launch-bound solver-like loop, 300 iterations of 4 scopes (matvec, dots, update,
  check) with 20 small kernels, and a residual read back (a sync) per iteration;
- ``matmul``: 60 float32 matmuls 4096², one scope each (GPU-bound).
Variants: ``bare``; gputrace CUPTI timing writing ``.json.gz`` / ``.json`` / ``.pftrace``;
gputrace events timing (``.json.gz``); Proton (``triton.profiler``, backend cupti, ``proton.scope``);
raw CUPTI kernel + driver records through cupti-python (no scopes, records counted in a Python
buffer callback: the floor of a Python CUPTI client); ``rawsame``, raw CUPTI with gputrace's
activity kinds (kernel, memcpy, memset, and the launch / copy / set / sync API calls it keeps);
torch.profiler (CPU + CUDA) with ``record_function`` scopes, exporting a Chrome trace; NVTX
ranges (``nvtx.annotate``).

Each run is its own process (``python3 -c CHILD``), variants interleaved within each round, best
(smallest total) of ``--reps`` rounds. Times: ``import`` the profiler's modules (before the clock);
``start`` the profiler's start call; ``loop`` the program, ending with a device sync; ``stop`` from
there until the profiler stopped and wrote its file. ``×`` = (start + loop + stop) / bare loop.
A second table gives, per variant, the median over the rounds of each round's ``×`` against the
bare loop of the same round: steadier where the machine's speed drifts between rounds. A third,
the same for CPU time from start to stop: every thread of the program's process (CUPTI's and the
profiler's included) plus what gputrace's writer process says it took (the header's
``writer_process``); steadier still where other work shares the machine's cores.
Run with compiled bytecode, as ``pip install`` leaves it (the script says when numpy has none).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PROGRAMS = ("tiny20k", "tiny100k", "solver", "matmul")
VARIANTS = (
    "bare",
    "cupti_jsongz",
    "cupti_json",
    "cupti_pftrace",
    "events",
    "proton",
    "rawcupti",
    "rawsame",
    "torch",
    "nvtx",
)

CHILD = r"""
import json, sys, time
prog, variant, out = sys.argv[1], sys.argv[2], sys.argv[3]
import cupy
clock = time.perf_counter_ns

# the program's data and kernels, warmed up before any clock ---------------------------------
if prog.startswith("tiny"):
    N = 20_000 if prog == "tiny20k" else 100_000
    x = cupy.zeros(256, cupy.float32)
    x += 1
elif prog == "solver":
    n = 2048
    A = cupy.random.rand(n, n, dtype=cupy.float32) / n + cupy.eye(n, dtype=cupy.float32)
    b = cupy.random.rand(n, dtype=cupy.float32)
    def iteration(s, xv, r, p):
        with s("matvec"):
            q = A @ p                      # 1 gemv
        with s("dots"):
            rr = r @ r                     # 2 reductions, 1 elementwise
            pq = p @ q
            alpha = rr / pq
        with s("update"):
            xv += alpha * p                # 4 elementwise
            r -= alpha * q
        with s("check"):
            rr2 = r @ r                    # reduction, elementwise, sqrt
            beta = rr2 / rr
            p *= beta                      # 2 elementwise
            p += r
            res = cupy.sqrt(rr2)
            for _ in range(5):             # the small bookkeeping kernels of a real solver
                res = res * 1.0
            float(res)                     # the residual, read back: a sync per iteration
        return xv, r, p
    xv, r = cupy.zeros(n, cupy.float32), b.copy()
    p = r.copy()
    import contextlib
    iteration(lambda name: contextlib.nullcontext(), xv, r, p)
else:
    a = cupy.random.rand(4096, 4096, dtype=cupy.float32)
    c = a @ a
cupy.cuda.runtime.deviceSynchronize()

# the profiler ---------------------------------------------------------------------------------
import contextlib
t_import = clock()
start = stop = None
scope = lambda name: contextlib.nullcontext()
if variant.startswith("cupti_") or variant == "events":
    import gputrace
    timing = "events" if variant == "events" else "cupti"
    scope = gputrace.trace
    def start():  # the session made and started: both are the profiler's start
        global session
        session = gputrace.session(out, backend="cuda", backend_options={"timing": timing}, quiet=True)
        session.__enter__()
    stop = lambda: session.__exit__(None, None, None)
elif variant == "proton":
    import triton.profiler as proton
    scope = proton.scope
    start = lambda: proton.start(out, backend="cupti")
    stop = proton.finalize
elif variant in ("rawcupti", "rawsame"):
    from cupti import cupti
    K = cupti.ActivityKind
    kinds = [K.CONCURRENT_KERNEL, *((K.DRIVER,) if variant == "rawcupti" else (K.MEMCPY, K.MEMSET))]
    got = [0]
    def requested():
        return 1 << 20, 0
    def completed(activities):
        got[0] += len(activities)
    def start():
        cupti.activity_register_callbacks(requested, completed)
        for k in kinds:
            cupti.activity_enable(k)
        if variant == "rawsame":  # gputrace's API calls only (an id this CUPTI lacks is skipped)
            from gputrace.backends import cupti_cbids as ids
            for table, enable in ((ids.DRIVER, cupti.activity_enable_driver_api),
                                  (ids.RUNTIME, cupti.activity_enable_runtime_api)):
                for cbid in table:
                    try:
                        enable(cbid, 1)
                    except cupti.cuptiError:
                        pass
    def stop():
        cupti.activity_flush_all(1)
        for k in kinds:
            cupti.activity_disable(k)
elif variant == "torch":
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    scope = record_function
    start = prof.__enter__
    def stop():
        prof.__exit__(None, None, None)
        prof.export_chrome_trace(out)
elif variant == "nvtx":
    import nvtx
    scope = lambda name: nvtx.annotate(name)
t0 = clock()
cpu0 = time.process_time_ns()  # every thread of this process (CUPTI's, the profiler's)
if start is not None:
    start()
t1 = clock()
if prog.startswith("tiny"):
    for _ in range(N):
        with scope("tiny"):
            x += 1
elif prog == "solver":
    for _ in range(300):
        xv, r, p = iteration(scope, xv, r, p)
else:
    for _ in range(60):
        with scope("matmul"):
            c = a @ a
cupy.cuda.runtime.deviceSynchronize()
t2 = clock()
if stop is not None:
    stop()
t3 = clock()
cpu = time.process_time_ns() - cpu0
extra = {}
if variant.startswith("cupti_"):  # (the session's facts, without reading its file back)
    info = session.backend_info
    extra = {"cupti_start_ms": info.get("cupti_start_ms"), "timing": info.get("timing"),
             "dropped": info.get("cupti_dropped_records")}
if variant.startswith("cupti_") or variant == "events":  # what the writer process says it took
    from gputrace.exporters import canonical
    w = gputrace.load(canonical(out)).header.get("writer_process") or {}
    cpu += int(1e9 * (w.get("start_cpu_s", 0) + w.get("chunks_cpu_s", 0)))
    extra["writer"] = w
print(json.dumps({"import": (t0 - t_import) / 1e6, "start": (t1 - t0) / 1e6, "loop": (t2 - t1) / 1e6,
                  "stop": (t3 - t2) / 1e6, "cpu": cpu / 1e6, **extra}))
"""

SUFFIX = {"cupti_jsongz": ".json.gz", "cupti_json": ".json", "cupti_pftrace": ".pftrace",
          "events": ".json.gz",
          "proton": "", "torch": ".json"}  # fmt: skip


def run_one(prog: str, variant: str, folder: Path, env: dict[str, str]) -> dict[str, float] | str:
    """One run of ``prog`` under ``variant`` (``name@tree``: with another checkout's gputrace;
    ``name+thread`` / ``name+process``: gputrace's stream written in the program's process / by a
    writer process, ``GPUTRACE_WRITER``)."""
    variant, _, writer = variant.split("@")[0].partition("+")
    if writer:
        env = dict(env, GPUTRACE_WRITER=writer)
    out = str(folder / f"{prog}-{variant}{SUFFIX.get(variant, '')}")
    try:
        # (run in the scratch folder: ``-c`` puts the working folder first on the path, and a
        # checkout there would shadow the one this script's PYTHONPATH names)
        p = subprocess.run([sys.executable, "-c", CHILD, prog, variant, out], capture_output=True, text=True,
                           env=env, timeout=240, cwd=folder)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "timed out"
    if p.returncode != 0:
        return (p.stderr.strip().splitlines() or ["failed"])[-1][:80]
    got: dict[str, float] = json.loads(p.stdout.strip().splitlines()[-1])
    return got


def uncompiled_numpy() -> bool:
    """Whether numpy has no compiled bytecode here. pip compiles it at install, but an image
    built with ``--no-compile`` and ``PYTHONDONTWRITEBYTECODE=1`` (the H200's) compiles numpy in
    every process that imports it: ``python3 -c "import numpy"`` took 0.38 s there against
    0.11 s compiled, and a writer process was ready in 0.38-0.55 s against 0.13-0.21 s. The
    programs import numpy before the clock; gputrace's writer process imports it while the
    program runs."""
    import importlib.util

    spec = importlib.util.find_spec("numpy")
    return spec is not None and spec.cached is not None and not os.path.exists(spec.cached)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", default=",".join(PROGRAMS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", default="")
    ap.add_argument("--seconds", type=float, default=0.0, help="no round begun that would end past this")
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH: variant V@NAME imports it")
    a = ap.parse_args()
    progs, variants = a.programs.split(","), a.variants.split(",")
    if uncompiled_numpy():
        print("numpy has no compiled bytecode here: run `python3 -m compileall -q <site-packages>` "
              "first, as pip does at install (see uncompiled_numpy)", file=sys.stderr)  # fmt: skip
    root = str(Path(__file__).resolve().parent.parent)
    trees = dict(t.split("=", 1) for t in a.tree)
    path_after = os.pathsep + os.environ.get("PYTHONPATH", "")
    envs = {
        name: dict(os.environ, PYTHONPATH=os.path.abspath(path) + path_after)
        for name, path in [("", root), *trees.items()]
    }
    # gputrace compiled as pip leaves it: a fresh checkout (or PYTHONDONTWRITEBYTECODE=1) would
    # compile the modules a session imports at its start in every run (15-35 ms on an H100)
    for path in [root, *trees.values()]:
        compileall.compile_dir(os.path.join(path, "gputrace"), quiet=1)
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    errors: dict[tuple[str, str], str] = {}
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        for rep in range(a.reps):
            spent = time.monotonic() - began
            if rep and a.seconds and spent + spent / rep > a.seconds:  # (rounds take about as long)
                print(f"{rep} of {a.reps} rounds: another would end past --seconds", file=sys.stderr)
                break
            for prog in progs:
                for v in variants:
                    got = run_one(prog, v, Path(d), envs[v.partition("@")[2]])
                    if isinstance(got, str):
                        errors[(prog, v)] = got
                    else:
                        runs.setdefault((prog, v), []).append(dict(got, round=rep))
            print(f"round {rep + 1} of {a.reps} done", file=sys.stderr, flush=True)
    best = {k: min(r, key=lambda x: x["start"] + x["loop"] + x["stop"]) for k, r in runs.items()}
    if a.json:
        Path(a.json).write_text(json.dumps({f"{p}/{v}": r for (p, v), r in runs.items()}, indent=1))
    print(f"best of {a.reps}; ms: start / loop / stop; × = (start + loop + stop) / bare loop")
    head = f"{'variant':<14}" + "".join(f"{p:>34}" for p in progs)
    print(head)
    for v in variants:
        cells = []
        for p in progs:
            b, r = best.get((p, "bare")), best.get((p, v))
            if r is None:
                cells.append(f"{errors.get((p, v), 'no run')[:33]:>34}")
                continue
            ratio = (r["start"] + r["loop"] + r["stop"]) / b["loop"] if b else float("nan")
            cells.append(f"{r['start']:>7.1f}/{r['loop']:>8.1f}/{r['stop']:>7.1f} {ratio:>6.2f}×")
        print(f"{v:<14}" + "".join(cells))

    # The shared machines' speed drifts between rounds (bare loops 30-50% apart in one run), and
    # best-of pairs the fastest bare round with each variant's fastest: each round's ratio to the
    # bare loop of the same round, median over the rounds, is steadier.
    def medians(title: str, cost: Callable[[dict[str, float]], float], of_bare: str) -> None:
        """Per variant and program, the median over the rounds of ``cost(run)`` over the bare
        run's ``of_bare`` in the same round (rounds with both)."""
        print(title)
        print(f"{'variant':<14}" + "".join(f"{p:>12}" for p in progs))
        for v in variants:
            cells = []
            for p in progs:
                bare = {r["round"]: r[of_bare] for r in runs.get((p, "bare"), [])}
                got = sorted(cost(r) / bare[r["round"]] for r in runs.get((p, v), []) if r["round"] in bare)
                cells.append(f"{statistics.median(got):>11.2f}×" if got else f"{'-':>12}")
            print(f"{v:<14}" + "".join(cells))

    medians("median over rounds of × against the same round's bare loop (rounds with both):",
            lambda r: r["start"] + r["loop"] + r["stop"], "loop")  # fmt: skip
    # CPU time, start to stop, of every thread of the program's process and of gputrace's writer
    # process: what the profiler costs the machine, and steadier than wall time where the
    # machine is shared.
    medians("median over rounds of CPU time (the process and its writer process), × the same round's bare:",
            lambda r: r["cpu"], "cpu")  # fmt: skip
    print(
        "import ms: "
        + ", ".join(f"{v} {best[(progs[0], v)]['import']:.0f}" for v in variants if (progs[0], v) in best)
    )
    for (p, v), r in sorted(best.items()):
        if "cupti_start_ms" in r:
            print(
                f"{p}/{v}: timing {r.get('timing')}, start parts {r.get('cupti_start_ms')}, "
                f"dropped {r.get('dropped')}"
            )
        if r.get("writer"):  # the writer process: ready how long after its spawn, and its CPU
            print(f"{p}/{v}: writer process {r['writer']}")


if __name__ == "__main__":
    main()
