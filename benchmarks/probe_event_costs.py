"""What the pieces of the events timing cost per call on a real GPU, next to the bare launch.

    python3 benchmarks/probe_event_costs.py

One row per CUDA runtime call the events backend makes per scope (through CuPy), in µs per call,
20,000 calls each, and the same 20k tiny-kernel loop bare and between two event records.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import cupy as cp

N = 20_000


def main() -> None:
    rt = cp.cuda.runtime
    x = cp.zeros(256, dtype=cp.float32)
    x += 1
    cp.cuda.Device().synchronize()
    sptr = cp.cuda.get_current_stream().ptr
    evs = [rt.eventCreateWithFlags(0) for _ in range(2 * N + 1)]

    def timed(label: str, fn: Callable[[], None]) -> None:
        t0 = time.perf_counter_ns()
        fn()
        print(f"{label:28} {(time.perf_counter_ns() - t0) / N / 1e3:8.3f} µs/call")

    def bare() -> None:
        for _ in range(N):
            x.__iadd__(1)
        cp.cuda.Device().synchronize()

    def record() -> None:
        for ev in evs:
            rt.eventRecord(ev, sptr)
        cp.cuda.Device().synchronize()

    def between() -> None:
        for i in range(N):
            rt.eventRecord(evs[2 * i], sptr)
            x.__iadd__(1)
            rt.eventRecord(evs[2 * i + 1], sptr)
        cp.cuda.Device().synchronize()

    timed("x += 1 (bare launch)", bare)
    t0 = time.perf_counter_ns()
    record()
    print(f"{'eventRecord':28} {(time.perf_counter_ns() - t0) / len(evs) / 1e3:8.3f} µs/call")
    timed("streamIsCapturing", lambda: [rt.streamIsCapturing(sptr) for _ in range(N)] and None)
    timed("get_current_stream", lambda: [cp.cuda.get_current_stream() for _ in range(N)] and None)
    timed("eventQuery", lambda: [rt.eventQuery(evs[i]) for i in range(N)] and None)
    timed("eventElapsedTime", lambda: [rt.eventElapsedTime(evs[i], evs[i + 1]) for i in range(N)] and None)
    timed("record, x += 1, record", between)
    for ev in evs:
        rt.eventDestroy(ev)


if __name__ == "__main__":
    main()
