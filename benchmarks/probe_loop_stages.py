"""What a CUPTI-timed session with a writer process does in the program's interpreter, per stage.

    python3 benchmarks/probe_loop_stages.py [SCOPES]     # default 100,000; fake CUPTI, any machine

One run of ``bench_writer_stop.py``'s program (SCOPES scopes of one kernel each, paced, no
sync, ``writer="process"``) with timers put around the stage functions: the CPU ms of the thread
that ran each (the streamer's thread while the program runs), for the loop and for the stop.
"decode" and "join" are inside the collect, "send" (pickling a chunk of raw records down the
pipe) inside "write"; "resolve" is what this process resolved itself (the chunks of a writer
process that was not ready yet); "fake" is the test double's own work of laying out CUPTI's record bytes
(libcupti's, in C, on a GPU), left out of every other stage.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_writer_stop  # (the program, from beside this file)

TIMERS = r"""
from gputrace import appender, chunks, streaming
from gputrace.backends import cupti, cupti_records
took = {}
def timed(owner, name, stage):
    f = getattr(owner, name)
    def run(*a, **k):
        c = time.thread_time_ns()
        try:
            return f(*a, **k)
        finally:
            took[stage] = took.get(stage, 0) + time.thread_time_ns() - c
    setattr(owner, name, run)
timed(FakeActivitySource, "encode", "fake")
timed(cupti_records.BufferDecoder, "decode", "decode")
timed(cupti.CuptiBackend, "_join", "join")
timed(chunks, "resolve", "resolve")
timed(streaming.Streamer, "_write", "write")
timed(appender.WriterProcess, "add", "send")
"""

REPORT = r"""
for part, got in (("loop", loop), ("stop", took)):
    print(part, "  ".join(f"{k} {v / 1e6:.1f}" for k, v in got.items()),
          f"(µs a scope: {' '.join(f'{k} {v / 1e3 / n:.2f}' for k, v in got.items())})")
"""


def child() -> str:
    """bench_writer_stop's program with the timers: loop's stages kept apart from the stop's."""
    code = bench_writer_stop.CHILD
    for old, new in (
        ("n = int(sys.argv[1])\n", "n = int(sys.argv[1])\n" + TIMERS),
        ("t1 = time.perf_counter()\n", "t1 = time.perf_counter()\nloop = dict(took)\ntook.clear()\n"),
    ):
        assert old in code, old
        code = code.replace(old, new, 1)
    return code[: code.rindex("print(")] + REPORT


def main() -> None:
    n = sys.argv[1] if len(sys.argv) > 1 else "100000"
    root = str(Path(__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, root) if p))
    print(f"{int(n):,} scopes + kernels (fake CUPTI), writer process: CPU ms per stage")
    p = subprocess.run(
        [sys.executable, "-c", child(), n], text=True, env=env, cwd="/"
    )  # (see bench_programs)
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
