"""Summarize a large trace file, side by side with ``orjson.loads`` of the same file.

The goal: ``gputrace summarize`` of a 1M-scope trace in under 3x the time
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
from click.testing import CliRunner

from gputrace.cli import cli
from gputrace.exporters import load
from gputrace.exporters.json import write
from gputrace.model import NO_TIME, Flag, QueueInfo, ScopeTable, SpanTable, ThreadInfo, Trace, nest
from gputrace.summary import summarize


def synthetic_trace(n: int, seed: int = 0) -> Trace:
    """``n`` scopes: a CPU-only "step" around every 3 kernels (16 names) on two GPU streams."""
    rng = np.random.default_rng(seed)
    base = 1_000_000_000
    groups = n // 4
    k = 3 * groups
    cpu_ns = rng.integers(3_000, 12_000, k)
    step = cpu_ns + rng.integers(500, 2_000, k)
    k_start = base + 1_000 + np.concatenate([[0], np.cumsum(step[:-1])]).astype(np.int64)
    k_end = k_start + cpu_ns
    submit = k_start + cpu_ns // 2
    queue = (np.arange(k) % 2).astype(np.int32)
    gpu_ns = rng.integers(2_000, 20_000, k)
    free = [base, base]
    sub_l, q_l, g_l = submit.tolist(), queue.tolist(), gpu_ns.tolist()
    g_start = [0] * k
    for i in range(k):  # in-order streams
        t = max(sub_l[i] + 4_000, free[q_l[i]])
        g_start[i] = t
        free[q_l[i]] = t + g_l[i]
    first = np.arange(groups) * 3
    # rows: kernels then steps, ordered as every trace is: (cpu start, thread, -cpu end)
    starts = np.concatenate([k_start, k_start[first] - 200])
    ends = np.concatenate([k_end, k_end[first + 2] + 200])
    order = np.lexsort((-ends, starts))
    is_kernel = order < k
    kr = np.where(is_kernel, order, 0)

    def col(kernel_values: np.ndarray, step_value: int) -> np.ndarray:
        return np.where(is_kernel, kernel_values[kr], step_value)

    s = ScopeTable.empty(len(order))
    s.name = col(np.arange(k) % 16 + 1, 0).astype(np.int32)
    s.cpu_start_ns, s.cpu_end_ns = starts[order], ends[order]
    s.submit_ns = col(submit, NO_TIME)
    s.gpu_start_ns = col(np.array(g_start, np.int64), NO_TIME)
    s.gpu_end_ns = col(np.array(g_start, np.int64) + gpu_ns, NO_TIME)
    s.queue = col(queue, -1).astype(np.int32)
    s.uncertainty_ns = col(np.full(k, 700, np.int64), 0)
    flags = np.zeros(len(order), np.uint32)
    _, firsts = np.unique(s.name, return_index=True)
    flags[firsts] |= int(Flag.COLD)
    s.flags = flags
    nest(s)
    rows = np.flatnonzero(is_kernel)
    spans = SpanTable(
        scope=rows.astype(np.int64), label=np.full(len(rows), 17, np.int32), queue=s.queue[rows],
        submit_ns=s.submit_ns[rows], gpu_start_ns=s.gpu_start_ns[rows], gpu_end_ns=s.gpu_end_ns[rows],
    )  # fmt: skip
    header = {
        "format_version": 1, "version": "bench", "backend": "fake", "start_ns": base,
        "base_ns": base, "end_ns": int(s.gpu_end_ns.max()) + 1000, "pid": 4242, "rank": None,
        "clock_pair": {"monotonic_ns": base, "realtime_ns": 1_700_000_000_000_000_000},
        "host": {"name": "bench", "cpu_count": 2, "loadavg_start": [0.1, 0.1, 0.1],
                 "loadavg_end": [0.2, 0.1, 0.1]},
        "clock": [], "anomalies": {"counts": {}, "items": [], "truncated": 0},
    }  # fmt: skip
    names = ["step"] + [f"kernel_{i}" for i in range(16)] + [""]
    return Trace(
        header, names, [ThreadInfo(4242, "MainThread")],
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
        runner = CliRunner()
        t_cli = best_of(lambda: runner.invoke(cli, ["summarize", str(path)]), args.repeat)
        check = runner.invoke(cli, ["summarize", str(path), "--top", "3"])
        assert check.exit_code == 0, check.output
        # the loaded trace is the one written (exact round trip)
        back, orig = load(path), synthetic_trace(args.scopes)
        for c in ScopeTable.COLUMNS:
            assert np.array_equal(getattr(back.scopes, c), getattr(orig.scopes, c)), c
    print(f"trace: {args.scopes:,} scopes, {n_events:,} events, {size_mb:.0f} MB (written in {made:.1f} s)")
    print(f"{'step':<34}{'best of ' + str(args.repeat) + ' (s)':>16}{'x orjson.loads':>16}")
    for label, t in (
        ("read bytes", t_read),
        ("orjson.loads(read bytes)", t_json),
        ("gputrace.load", t_load),
        ("summarize(gputrace.load)", t_sum),
        ("gputrace summarize FILE (CLI)", t_cli),
    ):
        print(f"{label:<34}{t:>16.3f}{t / t_json:>16.2f}")
    print(f"goal: CLI summarize < 3.00 x orjson.loads -> {'met' if t_cli < 3 * t_json else 'NOT met'}")


if __name__ == "__main__":
    main()
