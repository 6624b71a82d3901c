"""A scope's own cost in one process, inside a session of each timing source (on a CUDA GPU).

    python3 benchmarks/probe_scope_cost.py [none|cpu|cupti|events ...]    # default: all four

Per mode, in a fresh process: 20,000 iterations of an empty scope, then of a scope around one tiny
launch (``x += 1`` on 256 floats), and the same two loops with ``contextlib.nullcontext()`` in
place of ``gputrace.trace`` inside the same session (what the session costs without scopes).
Printed in ns an iteration; "none" runs the loops with no session at all. It also says whether
the session's process imported asyncio (the recorder's slower path) and if the backend is timed.
"""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = r"""
import contextlib, json, sys, time
import cupy, gputrace
import gputrace.recorder as recorder
x = cupy.zeros(256, cupy.float32)
x += 1
cupy.cuda.runtime.deviceSynchronize()
mode, N = sys.argv[1], 20_000
null = lambda name: contextlib.nullcontext()

def loop(scope, launch):
    t = time.perf_counter_ns()
    if launch:
        for _ in range(N):
            with scope("tiny"):
                x.__iadd__(1)
    else:
        for _ in range(N):
            with scope("tiny"):
                pass
    cupy.cuda.runtime.deviceSynchronize()
    return round((time.perf_counter_ns() - t) / N, 1)

res = {}
if mode == "none":
    loop(null, True)
    res = {"empty": loop(null, False), "launch": loop(null, True)}
else:
    kw = {"backend": "cpu"} if mode == "cpu" else {"backend": "cuda", "backend_options": {"timing": mode}}
    with gputrace.session(None, quiet=True, **kw):
        loop(gputrace.trace, True)
        res = {"empty": loop(gputrace.trace, False), "launch": loop(gputrace.trace, True),
               "empty_null": loop(null, False), "launch_null": loop(null, True),
               "asyncio": "asyncio" in sys.modules, "timed": recorder._timed}
print(json.dumps(res))
"""


def main() -> None:
    for mode in sys.argv[1:] or ["none", "cpu", "cupti", "events"]:
        p = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True)
        lines = p.stdout.strip().splitlines()
        got = json.loads(lines[-1]) if p.returncode == 0 and lines else {"failed": p.stderr[-300:]}
        print(f"{mode:7}", got)


if __name__ == "__main__":
    main()
