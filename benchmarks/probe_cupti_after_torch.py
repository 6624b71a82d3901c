"""CUPTI's clock before and after torch.profiler ran in the process (device probe).

    python3 benchmarks/probe_cupti_after_torch.py

Prints the rate of ``cupti.get_timestamp()`` against the session clock over 100 ms, before and
after a torch.profiler run, and where a forced CUPTI session then put its operations.
"""

from __future__ import annotations

import time

import cupy as cp
import torch
from cupti import cupti

import gputrace


def rate(label: str) -> None:
    a0, c0 = cupti.get_timestamp(), time.perf_counter_ns()
    time.sleep(0.1)
    a1, c1 = cupti.get_timestamp(), time.perf_counter_ns()
    ratio = (a1 - a0) / (c1 - c0)
    print(f"{label}: get_timestamp {a1} advanced {a1 - a0} over {c1 - c0} ns (ratio {ratio:.6f})")


def main() -> None:
    x = cp.zeros(256, dtype=cp.float32)
    x += 1
    cp.cuda.Device().synchronize()
    rate("before torch.profiler")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts):
        x += 1
        torch.cuda.synchronize()
    rate("after torch.profiler")
    with gputrace.session(backend="cuda", quiet=True, backend_options={"timing": "cupti"}) as s:
        for _ in range(5):
            with gputrace.trace("work"):
                x += 1
        gputrace.sync()
    t = s.trace
    assert t is not None
    info = t.header["backend_info"]
    print(
        "fit",
        t.header.get("clock_fits") or t.header.get("clock"),
        {k: info.get(k) for k in ("ops_recorded", "launch_calls_without_operations", "blind")},
    )
    print("ops header", t.header.get("ops"))
    for sc in t.find("work"):
        print("scope", sc.cpu_start_ns, sc.cpu_end_ns, sc.flag_names)
    for i in range(len(t.ops)):
        print(
            "op",
            int(t.ops.scope[i]),
            int(t.ops.thread[i]),
            int(t.ops.call_start_ns[i]),
            int(t.ops.gpu_start_ns[i]),
        )
    print("threads", t.threads)


if __name__ == "__main__":
    main()
