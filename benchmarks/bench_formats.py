"""Trace formats side by side: bytes per scope, write and read speed, and a streaming session's
memory and stalls, measured in one run on this machine.

    python3 benchmarks/bench_formats.py                       # everything (10 M scopes for memory)
    python3 benchmarks/bench_formats.py --mem-scopes 1000000  # a quicker memory run
    python3 benchmarks/bench_formats.py --skip-memory

Traces: "cpu" is N plain CPU scopes; "gpu" is 20k tiny GPU scopes from the scripted fake backend
shaped like the CUDA 20k tiny-kernel program (6 µs enqueue, ~0.9 µs kernels, a few µs queued),
with odd nanosecond times as a real clock gives; "cupti" is 20k scopes timed by the fake CUPTI
source, each with its kernel and launch call (per-operation records); "wgpu" is the trace of
examples/wgpu_tiny_vs_large.py (100 scopes, each one timed compute pass), where wgpu runs.
Bytes per scope count the whole file ("write ms": one file, what a small file costs). Speeds are
the median of REPS runs of ``exporters.write``/``exporters.load`` (session not included), in
this process's CPU time (the machines are shared; waiting for a core is not the format's cost).

Memory: a child process records M CPU scopes with a sync every 10k, streaming to a file, and
reports its peak RSS next to the same program with no session (the scopes still entered and left);
the difference is what gputrace holds. "stall" is the longest gap between two loop iterations
(the timer thread writing a chunk competes for the GIL), next to the same without a session.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the fake CUPTI source is a test double: ``tests.cupti_fake``, importable from the repository root
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gputrace
import gputrace.exporters as exporters
from gputrace.backends.fake import FakeBackend
from gputrace.clock import FakeClock

REPS = 3
# Speeds count this process's CPU time, not wall time: the development machines are shared, and
# waiting for a core is not the format's cost (writes are buffered by the OS either way).
CLOCK = time.process_time
FORMATS = ("json", "json.gz", "pftrace")


def cpu_trace(n: int) -> gputrace.Trace:
    with gputrace.session(backend="cpu", quiet=True) as s:
        tr = gputrace.trace("step")
        for _ in range(n):
            with tr:
                pass
    assert s.trace is not None
    return s.trace


def gpu_trace(n: int = 20_000) -> gputrace.Trace:
    clock = FakeClock(1_234_567_891, 0)
    be = FakeBackend(clock, script=lambda name, i: (4_871 + (i * 37) % 1_500, 896 + (i * 13) % 97))
    with gputrace.session(backend=be, clock=clock, quiet=True) as s:
        for i in range(n):
            with gputrace.trace("tiny"):
                clock.advance(6_103 + (i * 7) % 211)
            clock.advance(1_017)
            if i % 1000 == 999:
                gputrace.sync()
    assert s.trace is not None
    return s.trace


def cupti_trace(n: int = 20_000) -> gputrace.Trace:
    """``n`` scopes, each launching one kernel, timed by the fake CUPTI source: a scope, its GPU
    span, its wait and one per-operation record (kernel and launch call) each."""
    from gputrace.backends.cupti import CuptiBackend
    from gputrace.clock import session_clock
    from tests.cupti_fake import FakeActivitySource

    src = FakeActivitySource(session_clock)
    be = CuptiBackend(session_clock, source=src)
    with gputrace.session(backend=be, clock=session_clock, quiet=True) as s:
        tr = gputrace.trace("tiny")
        for _ in range(n):
            with tr:
                src.launch("k", gpu_ns=900)
    assert s.trace is not None
    return s.trace


def wgpu_trace(folder: Path) -> gputrace.Trace | None:
    """The wgpu example's trace (100 scopes, one timed pass each), or None without wgpu."""
    try:
        import wgpu  # noqa: F401
    except ImportError:
        return None
    root = Path(__file__).resolve().parent.parent
    out = folder / "wgpu_example.json"
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "wgpu_tiny_vs_large.py"), "--out", str(out)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    return gputrace.load(out) if done.returncode == 0 else None


def formats_table(traces: dict[str, gputrace.Trace], folder: Path) -> None:
    print(
        f"{'trace':<6} {'format':<8} {'scopes':>8} {'B/scope':>8} {'write/s':>10} {'read/s':>10}"
        f" {'write ms':>9}"
    )
    for tname, t in traces.items():
        for fmt in FORMATS:
            path = folder / f"{tname}.{fmt}"
            w, r = [], []
            for _ in range(REPS):
                t0 = CLOCK()
                exporters.write(t, path)
                t1 = CLOCK()
                if fmt != "pftrace":  # an export: gputrace does not read it back
                    assert len(exporters.load(path)) == len(t)
                t2 = CLOCK()
                w.append(t1 - t0)
                r.append(t2 - t1)
            n = len(t)
            size = path.stat().st_size / n
            read = f"{n / statistics.median(r):>10,.0f}" if fmt != "pftrace" else f"{'-':>10}"
            print(
                f"{tname:<6} {fmt:<8} {n:>8} {size:>8.1f} "
                f"{n / statistics.median(w):>10,.0f} {read}"
                f" {statistics.median(w) * 1e3:>9.2f}"
            )


CHILD = r"""
import sys, time
import gputrace
mode, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
every = 0 if mode == "no-sync" else 10_000
fake = None
tr = gputrace.trace("step")
pc = time.perf_counter_ns
def loop():
    worst = 0  # the longest iteration that does not sync (a sync writes its chunk: expected)
    last = pc()
    for i in range(n):
        with tr:
            pass
        now = pc()
        if now - last > worst:
            worst = now - last
        if every and i % every == every - 1:
            gputrace.sync()
            if fake is not None:
                fake.truth.clear()  # the fake GPU's test oracle (true times per scope), not gputrace's
            now = pc()
        last = now
    return worst
t0 = time.perf_counter()
if mode == "bare":
    worst = loop()
else:
    if mode == "fake-gpu":
        from gputrace.backends.fake import FakeBackend
        from gputrace.clock import session_clock
        fake = FakeBackend(session_clock)
    with gputrace.session(path, backend=fake or "cpu", quiet=True, stream=mode != "at-stop"):
        worst = loop()
dt = time.perf_counter() - t0
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(hwm, worst, dt)
"""


def memory_table(n: int, folder: Path) -> None:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    rows = {}
    modes = ("bare", "stream", "fake-gpu", "no-sync") + (("at-stop",) if n <= 2_000_000 else ())
    for mode in modes:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, mode, str(n), str(folder / "mem.json")],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        kb, worst, dt = out.stdout.split()
        rows[mode] = (int(kb) / 1024, int(worst) / 1e3, float(dt))
    size = (folder / "mem.json").stat().st_size
    print(f"\n{n:,} CPU scopes, a sync every 10k (whole program, session included)")
    print("(GPU scopes: the same with the scripted fake GPU, every scope timed; streaming, no syncs:")
    print(" the CPU program without any sync, the timer writes a chunk every second)")
    print(f"{'':<22} {'peak RSS MB':>12} {'longest gap µs':>15} {'wall s':>8}")
    labels = {
        "bare": "without gputrace",
        "stream": "streaming to .json",
        "fake-gpu": "GPU scopes (fake GPU)",
        "no-sync": "streaming, no syncs",
        "at-stop": "written at stop",
    }
    for mode in modes:
        label = labels[mode]
        mb, worst, dt = rows[mode]
        print(f"{label:<22} {mb:>12.1f} {worst:>15.0f} {dt:>8.2f}")
    print(f"{'streaming − without':<22} {rows['stream'][0] - rows['bare'][0]:>12.1f}")
    print(f"{'GPU scopes − without':<22} {rows['fake-gpu'][0] - rows['bare'][0]:>12.1f}")
    print(f"file: {size / 1e6:.0f} MB, {size / n:.1f} B/scope; loadavg {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-scopes", type=int, default=200_000)
    ap.add_argument("--mem-scopes", type=int, default=10_000_000)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--only-memory", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        print(f"loadavg {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        if not args.only_memory:
            traces = {"cpu": cpu_trace(args.cpu_scopes), "gpu": gpu_trace(), "cupti": cupti_trace()}
            wg = wgpu_trace(folder)
            if wg is not None:
                traces["wgpu"] = wg
            formats_table(traces, folder)
        if not args.skip_memory:
            memory_table(args.mem_scopes, folder)


if __name__ == "__main__":
    main()
