"""Stopping a CUPTI-timed session: N scopes, each launching one kernel, with the fake CUPTI source.

    python3 benchmarks/bench_cupti_stop.py                     # 20k scopes, every format, 3 runs each
    python3 benchmarks/bench_cupti_stop.py 20000 json          # one format
    PROF=tottime python3 benchmarks/bench_cupti_stop.py 20000 json   # cProfile of one stop

Each run is a fresh process (a program as a user runs it): session start, the loop, and the stop
(harvest, resolve, and writing the scopes, their GPU spans and one operation record each),
timed in wall-clock ms; "size" is the file's bytes per scope. "write" is the format's writer
alone on the resolved trace (``exporters.write``, median CPU time of 5 runs in one process):
the part of the stop that the output layer owns. Medians of the runs are printed.

"gputrace" is the stop less the fake's own work of laying out CUPTI's record bytes (on a GPU
libcupti does that, in C, before the stop sees the buffers), and "us/item" that per recorded
scope or operation (each scope here has one kernel: 2N items). "stop cpu" is the process's CPU
time over the stop, less the fake's, and "run cpu" the same from the loop's start to the stop's
end (steadier than wall time on a shared machine; with background chunks the work moves between
loop and stop, and "run cpu" holds it all). ``STAGES=1`` prints, per run,
the stop's CPU ms in each stage (timers around the stage functions; nested stages overlap:
"collect" holds "decode" and "join", "append" holds "plan", "render" and "gzip").
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the fake CUPTI source is a test double: ``tests.cupti_fake``, importable from the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FORMATS = ("json", "json.gz", "pftrace")

CHILD = r"""
import cProfile, inspect, os, pstats, sys, time
import gputrace
from gputrace.backends.cupti import CuptiBackend
from tests.cupti_fake import FakeActivitySource
from gputrace.clock import session_clock as clock
n, out = int(sys.argv[1]), sys.argv[2]
took = {}
def timed(owner, name, stage):
    f = getattr(owner, name)
    def run(*a, **k):
        t, c = time.perf_counter_ns(), time.thread_time_ns()
        try:
            return f(*a, **k)
        finally:
            if stage == "fake":  # its wall and its CPU time (what a waiting thread's wall holds more)
                took["fake"] = took.get("fake", 0) + time.perf_counter_ns() - t
                took["fake cpu"] = took.get("fake cpu", 0) + time.thread_time_ns() - c
            else:  # the stages: CPU time of the thread that ran them (steadier on a shared machine)
                took[stage] = took.get(stage, 0) + time.thread_time_ns() - c
    def run_lazily(*a, **k):  # a generator (``render``): its time is spent as it is read
        parts = f(*a, **k)
        while True:
            c = time.thread_time_ns()
            try:
                part = next(parts)
            except StopIteration:
                return
            finally:
                took[stage] = took.get(stage, 0) + time.thread_time_ns() - c
            yield part
    setattr(owner, name, run_lazily if inspect.isgeneratorfunction(f) else run)
timed(FakeActivitySource, "encode", "fake")
if os.environ.get("STAGES"):
    from gputrace import chunks
    from gputrace.backends import cupti_records, cupti
    from gputrace.exporters import json as js, plan, pftrace
    for owner, name, stage in ((cupti.CuptiBackend, "collect", "collect"),
                               (cupti_records.BufferDecoder, "decode", "decode"),
                               (cupti.CuptiBackend, "_join", "join"), (chunks, "resolve", "resolve"),
                               (js.StreamWriter, "append", "append"),
                               (pftrace.StreamWriter, "append", "append"),
                               (plan.Planner, "chunk", "plan"), (js, "render", "render"),
                               (js.GzipStream, "compress", "gzip"), (js.GzipStream, "flush", "gzip"),
                               (js, "write_all", "os write")):
        timed(owner, name, stage)
t0 = time.perf_counter_ns()
src = FakeActivitySource(clock)
s = gputrace.session(out, backend=CuptiBackend(clock, source=src), clock=clock, quiet=True)
s.start()
ta = time.perf_counter_ns()
cpu_start = time.process_time_ns()
tr = gputrace.trace("tiny")
for _ in range(n):
    with tr:
        src.launch("k", gpu_ns=900)
tb = time.perf_counter_ns()
prof = os.environ.get("PROF")
if prof:
    pr = cProfile.Profile()
    pr.enable()
fake_loop = took.pop("fake cpu", 0)
took.clear()
cpu0 = time.process_time_ns()
s.__exit__(None, None, None)
tc = time.perf_counter_ns()
cpu = time.process_time_ns() - cpu0 - took.get("fake cpu", 0)
cpu_all = time.process_time_ns() - cpu_start
if prof:
    pr.disable()
    pstats.Stats(pr, stream=sys.stderr).sort_stats(prof).print_stats(30)
if os.environ.get("STAGES"):
    print("  ".join(f"{k} {v / 1e6:.1f}" for k, v in took.items() if k != "fake cpu"), file=sys.stderr)
print((ta - t0) / 1e6, (tb - ta) / 1e6, (tc - tb) / 1e6, (tc - tb - took.get("fake", 0)) / 1e6,
      cpu / 1e6, (cpu_all - fake_loop - took.get("fake cpu", 0)) / 1e6, os.path.getsize(out))
"""


def write_speed(n: int, fmt: str, folder: Path) -> float:
    """Median CPU ms of ``exporters.write`` of the resolved trace (5 runs)."""
    import gputrace
    import gputrace.exporters as exporters
    from gputrace.backends.cupti import CuptiBackend
    from gputrace.clock import session_clock as clock
    from tests.cupti_fake import FakeActivitySource

    src = FakeActivitySource(clock)
    with gputrace.session(backend=CuptiBackend(clock, source=src), clock=clock, quiet=True) as s:
        tr = gputrace.trace("tiny")
        for _ in range(n):
            with tr:
                src.launch("k", gpu_ns=900)
    assert s.trace is not None
    path = folder / f"w.{fmt}"
    took = []
    for _ in range(5):
        t0 = time.process_time()
        exporters.write(s.trace, path)
        took.append(time.process_time() - t0)
    return statistics.median(took) * 1e3


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    formats = (sys.argv[2],) if len(sys.argv) > 2 else FORMATS
    reps = 1 if os.environ.get("PROF") else int(os.environ.get("REPS", "3"))
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    print(f"{n:,} scopes, one kernel each (fake CUPTI); loadavg {os.getloadavg()[0]:.1f}, {reps} runs")
    print(
        f"{'format':<8} {'start ms':>9} {'loop ms':>9} {'stop ms':>9} {'gputrace':>9} {'us/item':>8} "
        f"{'stop cpu':>9} {'run cpu':>8} {'write ms':>9} {'B/scope':>8}"
    )
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        for fmt in formats:
            runs = []
            for _ in range(reps):
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, str(n), str(folder / f"t.{fmt}")],
                    capture_output=True, text=True, env=env, check=True,
                )  # fmt: skip
                if os.environ.get("STAGES"):
                    print(f"  {fmt} stages ms: {out.stderr.strip()}")
                elif os.environ.get("PROF"):
                    print(out.stderr)
                runs.append([float(x) for x in out.stdout.split()])
            medians = (statistics.median(c) for c in zip(*runs, strict=True))
            start, loop, stop, own, cpu, cpu_all, size = medians
            w = write_speed(n, fmt, folder)
            print(
                f"{fmt:<8} {start:>9.1f} {loop:>9.1f} {stop:>9.1f} {own:>9.1f} {own * 1e3 / (2 * n):>8.2f} "
                f"{cpu:>9.1f} {cpu_all:>8.1f} {w:>9.1f} {size / n:>8.1f}"
            )


if __name__ == "__main__":
    main()
