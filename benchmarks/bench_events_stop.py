"""Stopping a CUDA-events-timed session: N scopes, each with its GPU span, on the stand-in CuPy.

    python3 benchmarks/bench_events_stop.py                 # 20k and 100k scopes, .json.gz, 3 runs
    python3 benchmarks/bench_events_stop.py 100000 json     # one size, one format
    PYTHONPATH=/other/tree python3 benchmarks/bench_events_stop.py   # another checkout, to compare

Each run is a fresh process: a session with ``timing="events"`` over ``tests/cupy_standin.py``
(CUDA's runtime calls answered in Python, each event at a scripted GPU time: 5 µs a scope), the
loop with no sync, and the ``with`` block's exit. Rows: the stream written in the program's
process (``writer="thread"``) and by a writer process (``writer="process"``, the default under
CUDA). Printed, medians in wall ms: start, loop, stop, the stop per scope, the stop's CPU time in
the program's process (with a writer process most of the stop is waiting for it), and the file's
bytes per scope. The stand-in's calls cost more than CuPy's, so the loop is no program's; what the
stop does with what the loop recorded is gputrace's alone.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import os, sys, time
import pytest
import gputrace
from tests.cupy_standin import install
n, out, writer = int(sys.argv[1]), sys.argv[2], sys.argv[3]
gpu = install(pytest.MonkeyPatch())
t0 = time.perf_counter_ns()
s = gputrace.session(out, backend="cuda", backend_options={"timing": "events"}, writer=writer, quiet=True)
s.start()
t1 = time.perf_counter_ns()
tr = gputrace.trace("tiny")
for _ in range(n):
    gpu.advance(1_000)
    with tr:
        gpu.advance(5_000)
t2, c2 = time.perf_counter_ns(), time.process_time_ns()
s.__exit__(None, None, None)
t3, c3 = time.perf_counter_ns(), time.process_time_ns()
print((t1 - t0) / 1e6, (t2 - t1) / 1e6, (t3 - t2) / 1e6, (c3 - c2) / 1e6, os.path.getsize(out))
"""


def main() -> None:
    sizes = [int(sys.argv[1])] if len(sys.argv) > 1 else [20_000, 100_000]
    fmt = sys.argv[2] if len(sys.argv) > 2 else "json.gz"
    reps = int(os.environ.get("REPS", "3"))
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), root) if p))
    print(f"CUDA events timing on the stand-in CuPy, .{fmt}; loadavg {os.getloadavg()[0]:.1f}, {reps} runs")
    print(f"{'scopes':>8} {'writer':<8} {'start ms':>9} {'loop ms':>9} {'stop ms':>9} {'us/scope':>9} "
          f"{'stop cpu':>9} {'B/scope':>8}")  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        for n in sizes:
            runs: dict[str, list[list[float]]] = {"thread": [], "process": []}
            for _ in range(reps):  # interleaved, so load on the machine affects both alike
                for writer, got in runs.items():
                    out = os.path.join(d, f"t.{fmt}")
                    done = subprocess.run([sys.executable, "-c", CHILD, str(n), out, writer], env=env,
                                          cwd=root, capture_output=True, text=True, check=True)  # fmt: skip
                    got.append([float(x) for x in done.stdout.split()])
            for writer, got in runs.items():
                start, loop, stop, cpu, size = (statistics.median(col) for col in zip(*got, strict=True))
                print(f"{n:>8,} {writer:<8} {start:>9.1f} {loop:>9.1f} {stop:>9.1f} {stop * 1e3 / n:>9.2f} "
                      f"{cpu:>9.1f} {size / n:>8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
