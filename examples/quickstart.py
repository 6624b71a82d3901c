"""Quick start: trace a few regions, write a trace, and say how to open it.

    python3 examples/quickstart.py [trace-path]

Runs on any machine: with CuPy and a CUDA GPU the work runs on the GPU and gputrace records when the
CPU enqueued it and when the GPU ran it; without one, the same scopes are recorded with CPU times.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import gputrace


def array_module():  # type: ignore[no-untyped-def]
    try:
        import cupy

        if cupy.cuda.is_available():
            return cupy
    except ImportError:
        pass
    return np


@gputrace.trace("normalize")
def normalize(x):  # type: ignore[no-untyped-def]
    return (x - x.mean()) / (x.std() + 1e-6)


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "quickstart.trace.json").resolve()
    xp = array_module()
    with gputrace.session(path) as s:
        a = xp.ones((512, 512), dtype=xp.float32)
        for step in range(20):
            with gputrace.trace("step", step=step):
                with gputrace.trace("matmul", n=512):
                    b = a @ a
                b = normalize(b)
            if step % 5 == 4:
                gputrace.sync()  # wait for the GPU and refresh the clock alignment
        gputrace.mark("done")
    trace = s.trace
    assert trace is not None
    steps = trace.find("step")
    print(f"recorded {len(trace)} scopes ({len(steps)} steps) with the {trace.header['backend']} backend")
    print(f"trace written to {path}")
    print("open it: drag it into https://ui.perfetto.dev, or run")
    print(f"  gputrace view {path}")
    print(f"  gputrace summarize {path}")


if __name__ == "__main__":
    main()
