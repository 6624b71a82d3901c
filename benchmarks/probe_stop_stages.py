"""Where a CUDA session's start and stop go, stage by stage, in bench_programs' programs (no profiler).

    python3 benchmarks/probe_stop_stages.py [PROGRAM ...]    # on a CUDA GPU; W=thread|auto|process
    V=events python3 benchmarks/probe_stop_stages.py tiny20k   # another of bench_programs' variants

Each program (default solver, tiny20k, matmul) runs twice with CUPTI timing writing ``.json.gz``,
each run in its own process, the writer chosen by ``W`` (default thread: the session renders).
Timers around the stage functions add up the wall ms each took on the program's main thread;
nested stages overlap ("stop_stream" holds "write_chunk", which holds "append", which holds
"plan" and "render_write" (rendering, compressing and writing run as one generator);
"cupti.collect" holds "drain", which holds "decode").
"""

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
import bench_programs  # (the programs, from beside this file)

import gputrace

# (module, owner inside it or "", function, stage)
STAGES = [
    ("gputrace.session", "session", "_start", "start"),
    ("gputrace.appender", "", "spawn", "spawn"),
    ("gputrace.session", "", "create", "backend_create"),
    ("gputrace.backends.cupti", "", "create", "cupti_create"),
    ("gputrace.session", "", "host_facts", "host_facts"),
    ("gputrace.session", "", "header_calibration", "header_cal"),
    ("gputrace.session", "session", "_calibrate", "calibrate"),
    ("gputrace.session", "session", "_exchange_clocks", "exchange_clocks"),
    ("gputrace.session", "session", "_start_stream", "start_stream"),
    ("gputrace.streaming", "Streamer", "__init__", "streamer_init"),
    ("gputrace.session", "session", "stop", "stop"),
    ("gputrace.session", "session", "_collect", "collect_final"),
    ("gputrace.session", "session", "_stop_stream", "stop_stream"),
    ("gputrace.streaming", "Streamer", "_write", "write_chunk"),
    ("gputrace.chunks", "", "resolve", "resolve"),
    ("gputrace.streaming", "", "final_clock", "final_clock"),
    ("gputrace.backends.cupti", "CuptiBackend", "collect", "cupti.collect"),
    ("gputrace.backends.cupti", "CuptiBackend", "_join", "join"),
    ("gputrace.backends.cupti", "CuptiBackend", "close", "backend_close"),
    ("gputrace.backends.cupti_lib", "LibCuptiSource", "drain", "drain"),
    ("gputrace.backends.cupti_records", "BufferDecoder", "decode", "decode"),
    ("gputrace.appender", "Appender", "add", "append"),
    ("gputrace.appender", "WriterProcess", "_write_here", "write_here"),
    ("gputrace.appender", "", "_finish", "writer_wait"),
    ("gputrace.exporters.plan", "Planner", "chunk", "plan"),
    ("gputrace.exporters.json", "StreamWriter", "append", "render_write"),
]

TIMERS = r"""
import importlib, sys, threading, time
took = {}
def timed(owner, name, stage):
    f = getattr(owner, name)
    def run(*a, **k):
        t = time.perf_counter_ns()
        try:
            return f(*a, **k)
        finally:
            if threading.current_thread() is threading.main_thread():
                took[stage] = took.get(stage, 0) + time.perf_counter_ns() - t
    setattr(owner, name, run)
import gputrace
for module, owner, name, stage in STAGES:
    m = sys.modules.get(module) or importlib.import_module(module)
    timed(getattr(m, owner) if owner else m, name, stage)
"""


def main() -> None:
    child = bench_programs.CHILD.replace("t0 = clock()\n", f"STAGES = {STAGES!r}\n{TIMERS}t0 = clock()\n", 1)
    child = child.replace('print(json.dumps({"import"', 'extra["stages"] = took\nprint(json.dumps({"import"')
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, GPUTRACE_WRITER=os.environ.get("W", "thread"))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    variant = os.environ.get("V", "cupti_jsongz")  # or events (bench_programs' variants)
    for prog in sys.argv[1:] or ["solver", "tiny20k", "matmul"]:
        for _ in range(2):
            cmd = [sys.executable, "-c", child, prog, variant, f"/tmp/stages-{prog}.json.gz"]
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd="/")  # (see bench_programs)
            if p.returncode:
                print(prog, "failed:", p.stderr.strip().splitlines()[-1:])
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            stages = " ".join(f"{k} {v / 1e6:.1f}" for k, v in r["stages"].items())
            print(f"{prog:8} start {r['start']:.0f} loop {r['loop']:.0f} stop {r['stop']:.0f} | {stages}")
            with contextlib.suppress(Exception):  # what the writer process says of itself
                print(
                    "   writer process:",
                    gputrace.load(f"/tmp/stages-{prog}.json.gz").header["writer_process"],
                )


if __name__ == "__main__":
    main()
