"""Core costs, measured side by side in one run on this machine.

    python3 benchmarks/bench_core.py [--scopes 1000000]

Prints: cost per scope (no session; cpu-backend session) next to two bare perf_counter_ns() calls,
resolve and export throughput for a trace of N scopes written to JSON, and bytes held per
recorded scope. Repetitions are interleaved and the median is reported, so load on the machine
affects every column alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import gputrace
from gputrace.exporters.json import write
from gputrace.recorder import active_recorder

LOOP = 200_000
REPS = 7


def bare_clock(n: int) -> float:
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(n):
        pc()
        pc()
    return (pc() - t0) / n


def empty_loop(n: int) -> float:
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(n):
        pass
    return (pc() - t0) / n


def scope_reused(n: int) -> float:
    tr = gputrace.trace("x")
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(n):
        with tr:
            pass
    return (pc() - t0) / n


def scope_constructed(n: int) -> float:
    trace = gputrace.trace
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(n):
        with trace("x"):
            pass
    return (pc() - t0) / n


def in_session(fn):  # type: ignore[no-untyped-def]
    def run(n: int) -> float:
        s = gputrace.session(backend="cpu", quiet=True).start()
        try:
            return fn(n)  # type: ignore[no-any-return]
        finally:
            s.stop()

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scopes", type=int, default=1_000_000)
    args = ap.parse_args()
    assert active_recorder() is None
    cases = {
        "empty loop (subtracted from all rows)": empty_loop,
        "2 × perf_counter_ns() (bare clock)": bare_clock,
        "trace: no session, object reused": scope_reused,
        "trace: no session, trace('x') each time": scope_constructed,
        "trace: cpu session, object reused": in_session(scope_reused),
        "trace: cpu session, trace('x') each time": in_session(scope_constructed),
    }
    results: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(REPS):
        for name, fn in cases.items():
            results[name].append(fn(LOOP))
    loop = statistics.median(results.pop("empty loop (subtracted from all rows)"))
    med = {k: statistics.median(v) - loop for k, v in results.items()}
    clock = med["2 × perf_counter_ns() (bare clock)"]
    print(
        f"Cost per scope ({LOOP:,} iterations × {REPS} interleaved reps, median, loop overhead "
        f"{loop:.0f} ns subtracted)"
    )
    print(f"{'case':45} {'ns/scope':>9} {'× bare clock':>13}")
    for k, v in med.items():
        print(f"{k:45} {v:9.0f} {v / clock:13.2f}")

    n = args.scopes
    tr = gputrace.trace("step")
    s = gputrace.session(backend="cpu", quiet=True).start()
    rec = active_recorder()
    assert rec is not None
    for _ in range(n):
        with tr:
            pass
    buf = rec.buffers[0]
    # the list, plus the two int objects per scope (the name string is shared by all scopes)
    held = buf.log.__sizeof__() + (buf.log[1].__sizeof__() + buf.log[2].__sizeof__()) * n
    t0 = time.perf_counter()
    trace = s.stop()
    t_resolve = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "big.json"
        t0 = time.perf_counter()
        write(trace, path)
        t_write = time.perf_counter() - t0
        size = path.stat().st_size
        t0 = time.perf_counter()
        back = gputrace.load(path)
        t_load = time.perf_counter() - t0
        assert len(back) == n

    tracemalloc.start()
    m = 100_000
    s = gputrace.session(backend="cpu", quiet=True).start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(m):
        with tr:
            pass
    after = tracemalloc.get_traced_memory()[0]
    s.stop()
    tracemalloc.stop()

    print()
    print(f"Trace of {n:,} cpu-backend scopes")
    print(f"{'stage':32} {'seconds':>8} {'scopes/s':>12}")
    print(f"{'resolve (stop)':32} {t_resolve:8.2f} {n / t_resolve:12,.0f}")
    print(
        f"{'export to JSON file':32} {t_write:8.2f} {n / t_write:12,.0f}   ({size / n:.0f} B/scope on disk)"
    )
    print(f"{'load back':32} {t_load:8.2f} {n / t_load:12,.0f}")
    print()
    print("Memory held per recorded scope")
    print(f"{'recorder buffer (list + clock ints)':40} {held / n:6.1f} B")
    print(f"{'tracemalloc, 100k scopes':40} {(after - before) / m:6.1f} B")
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
