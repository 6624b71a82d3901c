"""Where a CUDA session's stop goes: tiny-kernel programs, CUPTI and events timing, the stop profiled.

    python3 benchmarks/probe_stop_split.py [N ...]          # on a CUDA GPU; default 20000 100000

Each (N, timing) in its own process: N scopes of one tiny kernel each, no sync, then the stop under
cProfile; printed: the stop's wall ms (profiled, so inflated) and the cumulative ms of its phases
(collect: the backend's harvest/drain/decode/join; resolve; write: the exporters' append and close;
calibrate: the stop's clock samples; with a writer process, send: chunks handed to it,
writer_wait: waiting for it to finish the file).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import cProfile, json, pstats, sys, time
import cupy
n, timing, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
x = cupy.zeros(256, cupy.float32); x += 1; cupy.cuda.runtime.deviceSynchronize()
import gputrace
s = gputrace.session(out, backend="cuda", backend_options={"timing": timing}, quiet=True)
s.__enter__()
tr = gputrace.trace("tiny")
t0 = time.perf_counter_ns()
for _ in range(n):
    with tr:
        x += 1
cupy.cuda.runtime.deviceSynchronize()
t1 = time.perf_counter_ns()
pr = cProfile.Profile(); pr.enable()
s.__exit__(None, None, None)
pr.disable()
t2 = time.perf_counter_ns()
st = pstats.Stats(pr).stats
phases = {"collect": ("collect", "_take_finished", "drain"), "decode": ("decode",), "join": ("_join",),
          "resolve": ("resolve",), "write": ("append",), "send": ("add",), "close": ("close",),
          "writer_wait": ("_finish",),
          "calibrate": ("stop_samples", "calibrate"), "final_clock": ("final_clock",)}
got = {}
for ph, names in phases.items():
    cts = [ct for (f, l, fn), (cc, nc, tt, ct, callers) in st.items() if fn in names]
    got[ph] = max(cts + [0]) * 1e3
top = sorted(st.items(), key=lambda kv: -kv[1][2])[:6]
info = s.trace.header.get("backend_info", {}) if s.trace is not None else {}
print(json.dumps({"loop_ms": (t1 - t0) / 1e6, "stop_ms": (t2 - t1) / 1e6, **got,
                  "chunks": (s.trace.header.get("streamed") or {}).get("chunks") if s.trace else None,
                  "top_tottime": [f"{fn}:{l} {tt*1e3:.0f}" for (f, l, fn), (cc, nc, tt, ct, c) in top],
                  "bufs": info.get("cupti_buffers_allocated")}))
"""


def main() -> None:
    ns = [int(a) for a in sys.argv[1:]] or [20_000, 100_000]
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for n in ns:
        for timing in ("cupti", "events"):
            out = f"/tmp/split-{n}-{timing}.json.gz"
            p = subprocess.run([sys.executable, "-c", CHILD, str(n), timing, out],
                               capture_output=True, text=True, env=env)  # fmt: skip
            if p.returncode:
                print(n, timing, "failed:", p.stderr.strip().splitlines()[-3:])
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            top = r.pop("top_tottime")
            print(
                f"{n:>7} {timing:<7} "
                + " ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())
            )
            print("        top tottime ms:", "; ".join(top))


if __name__ == "__main__":
    main()
