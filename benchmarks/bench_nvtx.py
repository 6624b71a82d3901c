"""What ``session(nvtx=True)`` costs: whole programs, session start and stop included, side by side.

    python3 benchmarks/bench_nvtx.py [--scopes 20000] [--repeats 5] [--backend auto|cuda|cpu]

Each program runs N tiny units of work (CuPy ``x += 1`` on 256 floats with a CUDA GPU, else a
numpy add), one scope each, and is timed from before ``session()`` to after it stops:

- ``bare``: the loop alone, no gputrace;
- ``nvtx only``: the loop with an NVTX range per unit and no gputrace (the same push/pop that
  gputrace uses: NVIDIA's nvtx package, domain "gputrace", else CuPy's ``cupy.cuda.nvtx``);
- ``gputrace``: ``session()`` and one ``trace()`` scope per unit;
- ``gputrace + nvtx``: the same with ``session(nvtx=True)``.

Printed: the median wall time of each over ``--repeats`` runs (interleaved, so drift hits all
alike), its ratio to ``bare``, and the cost per scope that NVTX adds (``gputrace + nvtx`` minus
``gputrace``, divided by N). Runs on a CPU-only machine too (backend cpu), where it measures the
Python side of the ranges; without nvtx or CuPy the NVTX rows say so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gputrace
from gputrace.errors import GputraceError


def work_unit(backend: str) -> tuple[Callable[[], None], Callable[[], None], str]:
    """(one unit of work, wait for it all, what it is)."""
    if backend in ("auto", "cuda"):
        try:
            import cupy

            if cupy.cuda.is_available():
                x = cupy.zeros(256, dtype=cupy.float32)

                def unit() -> None:
                    x.__iadd__(1)

                return unit, cupy.cuda.Device().synchronize, "CuPy x += 1 (256 floats)"
        except ImportError:
            pass
        if backend == "cuda":
            sys.exit("bench_nvtx.py --backend cuda needs CuPy and a CUDA GPU.")
    import numpy as np

    y = np.zeros(256, dtype=np.float32)

    def cpu_unit() -> None:
        np.add(y, 1, out=y)

    return cpu_unit, lambda: None, "numpy add (256 floats), backend cpu"


def programs(n: int, backend: str) -> tuple[dict[str, Callable[[], None]], str, str]:
    unit, wait, what = work_unit(backend)
    session_backend = "cuda" if "CuPy" in what else "cpu"
    out: dict[str, Callable[[], None]] = {}

    def bare() -> None:
        for _ in range(n):
            unit()
        wait()

    out["bare"] = bare
    try:
        from gputrace.nvtx import load

        ranges = load()
        push, pop = ranges.push, ranges.pop
        source = ranges.source

        def nvtx_only() -> None:
            for _ in range(n):
                push("unit")
                unit()
                pop()
            wait()

        out["nvtx only"] = nvtx_only
    except GputraceError as exc:
        source = f"none ({exc})"

    def traced(nvtx: bool) -> Callable[[], None]:
        def program() -> None:
            with gputrace.session(backend=session_backend, quiet=True, nvtx=nvtx):
                for _ in range(n):
                    with gputrace.trace("unit"):
                        unit()
                wait()

        return program

    out["gputrace"] = traced(False)
    if "nvtx only" in out:
        out["gputrace + nvtx"] = traced(True)
    return out, what, source


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scopes", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backend", choices=["auto", "cuda", "cpu"], default="auto")
    args = ap.parse_args()
    progs, what, source = programs(args.scopes, args.backend)
    for p in progs.values():  # warm-up: imports, kernel compile, pools
        p()
    times: dict[str, list[float]] = {k: [] for k in progs}
    for _ in range(args.repeats):
        for name, p in progs.items():
            t0 = time.perf_counter_ns()
            p()
            times[name].append((time.perf_counter_ns() - t0) / 1e6)
    med: dict[str, Any] = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.scopes:,} units of {what}; NVTX from {source}; median of {args.repeats} runs")
    print(f"{'program':<18} {'wall ms':>9} {'× bare':>7} {'µs/unit':>8}   runs (ms)")
    for k, v in times.items():
        per = med[k] / args.scopes * 1e3
        runs = " ".join(f"{x:.0f}" for x in v)
        print(f"{k:<18} {med[k]:>9.1f} {med[k] / med['bare']:>6.2f}× {per:>8.2f}   {runs}")
    if "gputrace + nvtx" in med:
        added = (med["gputrace + nvtx"] - med["gputrace"]) / args.scopes * 1e3
        alone = (med["nvtx only"] - med["bare"]) / args.scopes * 1e3
        print(f"NVTX adds {added:.2f} µs per scope to gputrace ({alone:.2f} µs per range without gputrace).")


if __name__ == "__main__":
    main()
