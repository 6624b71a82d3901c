"""gputrace's own Python per scope with CUDA events timing, on any machine: CuPy replaced by a stand-in.

    python3 benchmarks/probe_events_python.py [SCOPES] [--reps 3] [--profile]
    W=thread TREE=/tmp/old python3 benchmarks/probe_events_python.py   # writer; another checkout

The stand-in ``cupy`` answers every runtime call the events timing makes with a C builtin (an event
record stores the stream, every event is done, an elapsed time is a float), so what a loop of
empty scopes costs over the bare loop is gputrace's own Python: the recorder, the backend's
``begin``/``end``, its harvests, and the streamer's thread (collect, chunks, the pipe). On a GPU
the CUDA calls themselves add their own cost (``probe_event_costs.py``: 1.4 µs an event record).
Each variant runs in its own process, 3 rounds, median; ``--profile`` prints a cProfile of the
program's thread for one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

FAKE_CUPY = r"""
import itertools, operator, sys, types
cupy, cuda = types.ModuleType("cupy"), types.ModuleType("cupy.cuda")
rt = types.ModuleType("cupy.cuda.runtime")
class Stream:
    def __init__(self, non_blocking=False, ptr=7):
        self.ptr, self.device_id = ptr, 0
class Device:
    def __init__(self, index=0): pass
    def __enter__(self): return self
    def __exit__(self, *a): return None
recorded = {}
_ids = itertools.count(1)
rt.eventRecord = recorded.__setitem__          # (event, stream)
rt.streamIsCapturing = (0).__mul__             # never capturing
rt.eventQuery = (0).__mul__                    # every event done
rt.eventElapsedTime = operator.truediv            # (some float)
rt.eventCreateWithFlags = lambda flags: next(_ids)
rt.eventDestroy = recorded.pop
rt.getDevice = int
rt.setDevice = int
rt.getDeviceCount = lambda: 1
rt.getDeviceProperties = lambda i: {"name": b"stand-in"}
rt.driverGetVersion = rt.runtimeGetVersion = lambda: 13000
cuda.runtime, cuda.Stream, cuda.Device = rt, Stream, Device
cuda.is_available = lambda: True
cuda.get_current_stream = itertools.repeat(Stream(ptr=0)).__next__
cupy.cuda, cupy.__version__ = cuda, "stand-in"
sys.modules.update({"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": rt})
"""

CHILD = (
    FAKE_CUPY
    + r"""
import json, os, time, contextlib
n, variant, path, profile = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
import gputrace
scope = (lambda name: contextlib.nullcontext()) if variant == "bare" else gputrace.trace
s = None
if variant != "bare":
    s = gputrace.session(path, backend="cuda", backend_options={"timing": "events"}, quiet=True,
                         writer=os.environ.get("W", "process"))
    s.__enter__()
    exec(os.environ.get("PATCH", ""))  # (an experiment's change, on ``s``)
    time.sleep(1.0)  # (the writer process is ready, as in a run longer than its start)
prof = None
if profile:
    import cProfile
    prof = cProfile.Profile(); prof.enable()
c0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
for i in range(n):
    with scope("tiny"):
        pass
    if i % 1000 == 999:
        time.sleep(0.002)  # (a GPU program waits now and then: the streamer's thread gets its turn)
w1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
if prof:
    prof.disable()
t = time.perf_counter()
if s is not None:
    s.__exit__(None, None, None)
stop = time.perf_counter() - t
if prof:
    import pstats
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(14)
print(json.dumps({"main": (c1 - c0) * 1e6 / n, "others": ((p1 - p0) - (c1 - c0)) * 1e6 / n,
                  "wall": ((w1 - w0) - 0.002 * (n // 1000)) * 1e6 / n, "stop_ms": stop * 1e3}))
"""
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scopes", type=int, nargs="?", default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    root = os.environ.get("TREE") or str(Path(__file__).resolve().parents[1])  # (TREE: another checkout)
    got: dict[str, list[dict[str, float]]] = {"bare": [], "events": []}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.reps):
            for v in got:
                cmd = [sys.executable, "-c", CHILD, str(a.scopes), v, f"{d}/{v}.json.gz", "0"]
                p = subprocess.run(cmd, capture_output=True, text=True, cwd=root, check=True)
                got[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
        if a.profile:
            cmd = [sys.executable, "-c", CHILD, str(a.scopes), "events", f"{d}/p.json.gz", "1"]
            print(subprocess.run(cmd, capture_output=True, text=True, cwd=root, check=True).stderr)
    print(f"{a.scopes:,} empty scopes, events timing, stand-in CuPy; median of {a.reps} (µs a scope)")
    print(f"{'variant':<8}{'wall':>8}{'main CPU':>10}{'others CPU':>12}{'stop ms':>9}")
    for v, runs in got.items():
        m = {k: statistics.median(r[k] for r in runs) for k in ("wall", "main", "others", "stop_ms")}
        print(f"{v:<8}{m['wall']:>8.2f}{m['main']:>10.2f}{m['others']:>12.2f}{m['stop_ms']:>9.1f}")


if __name__ == "__main__":
    main()
