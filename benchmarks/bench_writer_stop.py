"""The stop of a CUPTI-timed session whose file a writer process writes, with the fake CUPTI source.

    python3 benchmarks/bench_writer_stop.py [SCOPES] [RUNS]        # default 100,000 scopes, 3 runs
    PYTHONPATH=/other/tree python3 benchmarks/bench_writer_stop.py  # another checkout, to compare

Each run is a fresh process: a session with ``writer="process"``, then SCOPES scopes of one
kernel each, paced like a launch-bound program (a 0.1 ms sleep every 8 scopes, so the run lasts
longer than the writer process's start and it renders as the program goes), no sync, and the
``with`` block's exit (no read-back). Printed: the loop's and the stop's wall ms. Unlike
``bench_cupti_stop.py``, whose loop ends before a writer process is ready, this measures the stop
that a program longer than the child's start sees: the last chunk, and waiting for the child.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import os, sys, tempfile, time
import gputrace
from gputrace.backends.cupti import CuptiBackend
from gputrace.clock import session_clock
from tests.cupti_fake import FakeActivitySource
n = int(sys.argv[1])
src = FakeActivitySource(session_clock)
path = os.path.join(tempfile.mkdtemp(), "run.json.gz")
s = gputrace.session(path, backend=CuptiBackend(session_clock, source=src), writer="process", quiet=True)
s.__enter__()
tr = gputrace.trace("tiny")
t0 = time.perf_counter()
for i in range(n):
    with tr:
        src.launch("k", gpu_ns=900)
    if i % 8 == 0:
        time.sleep(0.0001)
t1 = time.perf_counter()
s.__exit__(None, None, None)
t2 = time.perf_counter()
print(f"{(t1 - t0) * 1e3:.0f} {(t2 - t1) * 1e3:.1f} {gputrace.load(path).header['streamed']['chunks']}")
"""


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    root = str(Path(__file__).resolve().parent.parent)  # (tests.cupti_fake, the test double)
    path = os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, root) if p))
    print(f"{n:,} scopes + {n:,} kernels (fake CUPTI), writer process; loadavg {os.getloadavg()[0]:.1f}")
    print(f"{'run':>4} {'loop ms':>9} {'stop ms':>9} {'chunks':>7}")
    for r in range(runs):
        # (run from "/": with -c the working folder comes first on the path, before PYTHONPATH)
        p = subprocess.run(
            [sys.executable, "-c", CHILD, str(n)], capture_output=True, text=True, env=env, cwd="/"
        )
        if p.returncode:
            print(f"{r + 1:>4} failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            continue
        loop, stop, chunks = p.stdout.split()
        print(f"{r + 1:>4} {loop:>9} {stop:>9} {chunks:>7}")


if __name__ == "__main__":
    main()
