"""Summarize a large trace file, side by side with ``orjson.loads`` of the same file.

The goal (issue 5): ``gputrace summarize`` of a 1M-scope trace in under 3x the time
``orjson.loads`` takes to parse that file. The trace is synthetic (numpy columns written by the
real Chrome exporter): every scope has a CPU enqueue window and a GPU span on one of two streams.

    python3 benchmarks/bench_summarize.py            # 1M scopes
    python3 benchmarks/bench_summarize.py --scopes 100000
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from gputrace.exporters.chrome import write
from gputrace.loader import load
from gputrace.model import NO_TIME, Flag, QueueInfo, ScopeTable, SpanTable, ThreadInfo, Trace
from gputrace.summary import summarize


def synthetic_trace(n: int, seed: int = 0) -> Trace:
    """``n`` top-level scopes over 16 names, GPU work on two streams of one device."""
    rng = np.random.default_rng(seed)
    base = 1_000_000_000
    s = ScopeTable.empty(n)
    s.name = (np.arange(n) % 16).astype(np.int32)
    cpu_ns = rng.integers(3_000, 12_000, n)
    step = cpu_ns + rng.integers(500, 2_000, n)
    s.cpu_start_ns = base + np.concatenate([[0], np.cumsum(step[:-1])]).astype(np.int64)
    s.cpu_end_ns = s.cpu_start_ns + cpu_ns
    s.submit_ns = s.cpu_start_ns + cpu_ns // 2
    s.queue = (np.arange(n) % 2).astype(np.int32)
    gpu_ns = rng.integers(2_000, 20_000, n)
    start = np.empty(n, np.int64)
    free = [base, base]
    sub, q = s.submit_ns.tolist(), s.queue.tolist()
    gl = gpu_ns.tolist()
    st = [0] * n
    for i in range(n):  # in-order queues
        t = max(sub[i] + 4_000, free[q[i]])
        st[i] = t
        free[q[i]] = t + gl[i]
    start[:] = st
    s.gpu_start_ns = start
    s.gpu_end_ns = start + gpu_ns
    s.uncertainty_ns = np.full(n, 700, np.int64)
    flags = np.zeros(n, np.uint32)
    flags[:16] |= int(Flag.COLD)
    s.flags = flags
    names = [f"kernel_{i}" for i in range(16)]
    spans = SpanTable(
        scope=np.arange(n, dtype=np.int64), label=np.full(n, 16, np.int32), queue=s.queue.copy(),
        submit_ns=s.submit_ns.copy(), gpu_start_ns=s.gpu_start_ns.copy(),
        gpu_end_ns=s.gpu_end_ns.copy(),
    )  # fmt: skip
    header = {
        "format_version": 1, "version": "bench", "backend": "fake", "start_ns": base,
        "base_ns": base, "end_ns": int(s.gpu_end_ns.max()) + 1000, "pid": 4242, "rank": None,
        "clock_pair": {"monotonic_ns": base, "realtime_ns": 1_700_000_000_000_000_000},
        "host": {"name": "bench", "cpu_count": 2, "loadavg_start": [0.1, 0.1, 0.1],
                 "loadavg_end": [0.2, 0.1, 0.1]},
        "clock": [], "anomalies": {"counts": {}, "items": [], "truncated": 0},
    }  # fmt: skip
    assert not (s.gpu_start_ns == NO_TIME).any()
    return Trace(
        header, [*names, ""], [ThreadInfo(4242, "MainThread")],
        [QueueInfo(0, "Bench GPU", "fake", "stream 0"), QueueInfo(0, "Bench GPU", "fake", "stream 1")],
        s, spans, [], {},
    )  # fmt: skip


def best_of(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scopes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.json"
        t0 = time.perf_counter()
        write(synthetic_trace(args.scopes), path)
        made = time.perf_counter() - t0
        size_mb = os.path.getsize(path) / 1e6
        raw = path.read_bytes()
        n_events = len(orjson.loads(raw)["traceEvents"])
        t_read = best_of(path.read_bytes, args.repeat)
        t_json = best_of(lambda: orjson.loads(path.read_bytes()), args.repeat)
        t_load = best_of(lambda: load(path), args.repeat)
        t_sum = best_of(lambda: summarize(load(path)), args.repeat)
    print(f"trace: {args.scopes:,} scopes, {n_events:,} events, {size_mb:.0f} MB (written in {made:.1f} s)")
    print(f"{'step':<34}{'best of ' + str(args.repeat) + ' (s)':>16}{'x orjson.loads':>16}")
    for label, t in (
        ("read bytes", t_read),
        ("orjson.loads(read bytes)", t_json),
        ("gputrace.load", t_load),
        ("summarize(gputrace.load)", t_sum),
    ):
        print(f"{label:<34}{t:>16.3f}{t / t_json:>16.2f}")
    print(f"goal: summarize < 3.00 x orjson.loads -> {'met' if t_sum < 3 * t_json else 'NOT met'}")


if __name__ == "__main__":
    main()
