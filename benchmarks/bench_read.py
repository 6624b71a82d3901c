"""Reading traces back (``gputrace.load``, the path of summarize/diff/merge/view), every format.

    python3 benchmarks/bench_read.py                       # this tree
    python3 benchmarks/bench_read.py --against /path/tree  # and another source tree, side by side

Traces (written once with this tree, then read by each tree in its own child process):
"cpu" 200k plain CPU scopes; "gpu" 20k scopes from the scripted fake GPU shaped like the CUDA
20k tiny-kernel program; "cupti" 20k scopes with one CUPTI kernel record each (the fake CUPTI
source); "h200" the kept H200 CUPTI trace (tests/data/cuda_h200.json.gz); "wgpu" the wgpu
example's 100 scopes (where wgpu runs). Each trace in .json, .json.gz and .pftrace.

"stages" splits a JSON read (this tree, in this process) into its stages: the file's bytes
(inflated where gzip), the msgspec decoding of the document, the build (classifying the events
by kind and gathering the tables) and freeing the decoded events; "read" is the whole read.

Read speed is the median of REPS reads in the reading process's CPU time (the machines are
shared). "inflate" times the gzip decompression alone (this tree), zlib next to ISA-L
(python-isal, what reads gzip where it is installed). "summarize" is the whole command
(``python -m gputrace summarize FILE``, interpreter start included), median wall time of REPS runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("json", "json.gz", "pftrace")
REPS = 5


def make_traces(folder: Path, cpu_scopes: int) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_formats as bf

    import gputrace
    import gputrace.exporters as ex
    from gputrace.backends.cupti import CuptiBackend
    from gputrace.backends.cupti_fake import FakeActivitySource
    from gputrace.clock import session_clock

    traces = {"cpu": bf.cpu_trace(cpu_scopes), "gpu": bf.gpu_trace()}
    src = FakeActivitySource(session_clock)
    with gputrace.session(
        backend=CuptiBackend(session_clock, source=src), clock=session_clock, quiet=True
    ) as s:
        tr = gputrace.trace("tiny")
        for _ in range(20_000):
            with tr:
                src.launch("k", gpu_ns=900)
    assert s.trace is not None
    traces["cupti"] = s.trace
    traces["h200"] = gputrace.load(ROOT / "tests" / "data" / "cuda_h200.json.gz")
    wg = bf.wgpu_trace(folder)
    if wg is not None:
        traces["wgpu"] = wg
    for name, t in traces.items():
        for fmt in FORMATS:
            ex.write(t, folder / f"{name}.{fmt}")


def files(folder: Path) -> list[Path]:
    order = ("cpu", "gpu", "cupti", "h200", "wgpu")
    found = [folder / f"{n}.{f}" for n in order for f in FORMATS]
    return [p for p in found if p.exists()]


def measure(folder: Path, reps: int) -> dict[str, list[float]]:
    """In this process: {file name: [scopes, ops, median read CPU seconds]}."""
    import gputrace

    out = {}
    for p in files(folder):
        times = []
        for _ in range(reps):
            t0 = time.process_time()
            t = gputrace.load(p)
            times.append(time.process_time() - t0)
        out[p.name] = [len(t), len(t.ops), statistics.median(times)]
    return out


def child(tree: Path, folder: Path, reps: int) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(
        [sys.executable, __file__, "--measure", str(folder), "--reps", str(reps)],
        capture_output=True, text=True, env=env, check=True, cwd=tree,
    )  # fmt: skip
    result: dict[str, list[float]] = json.loads(done.stdout.splitlines()[-1])
    return result


def summarize_time(tree: Path, path: Path, reps: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "gputrace", "summarize", str(path)],
            capture_output=True, env=env, check=True, cwd=tree,
        )  # fmt: skip
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def inflate_table(folder: Path, reps: int) -> None:
    """Inflating each .json.gz (this tree's readlimits, same caps): zlib, and ISA-L where
    python-isal is installed (what reads gzip then)."""
    from gputrace import readlimits

    igzip = readlimits._isal()
    print(f"\ninflate .json.gz (CPU ms, median of {reps})    zlib     ISA-L  speed-up")
    for p in files(folder):
        if not p.name.endswith(".gz"):
            continue
        raw = p.read_bytes()
        cap = readlimits.gzip_cap(len(raw))
        cost = {}
        for name, fn in (("zlib", readlimits._gunzip_zlib), ("isal", readlimits._gunzip_isal)):
            if name == "isal" and igzip is None:
                continue
            times = []
            for _ in range(reps):
                t0 = time.process_time()
                out = fn(raw, cap, p) if name == "zlib" else fn(igzip, raw, cap, p)
                times.append(time.process_time() - t0)
                assert out is not None
            cost[name] = statistics.median(times)
        line = f"{p.name:<15} {len(raw) / 1e6:5.2f} MB -> {len(out) / 1e6:6.2f} MB {cost['zlib'] * 1e3:8.2f}"
        if "isal" in cost:
            line += f" {cost['isal'] * 1e3:9.2f} {cost['zlib'] / cost['isal']:8.1f}x"
        else:
            line += "   (python-isal is not installed)"
        print(line)


def stages_table(folder: Path, reps: int) -> None:
    """Where a JSON read's time goes (this tree's fast path), CPU ms, median of ``reps``."""
    import gc

    import gputrace.exporters as ex
    from gputrace.exporters import json as jf

    fast = jf._fast()
    if fast is None:
        return
    print(f"\nstages of a JSON read (CPU ms, median of {reps})   bytes  decode   build    free    read")
    for p in files(folder):
        if not p.name.endswith((".json", ".json.gz")):
            continue
        cols: dict[str, list[float]] = {k: [] for k in ("bytes", "decode", "build", "free", "read")}
        for _ in range(reps):
            gc.disable()  # as the reader runs (gputrace.gcpause)
            t0 = time.process_time()
            raw, _cut = jf.read_raw(p)
            t1 = time.process_time()
            doc = fast.DOC_DECODER.decode(raw)
            t2 = time.process_time()
            header = doc.gputrace if isinstance(doc.gputrace, dict) else doc.metadata["gputrace_stream"]
            jf._build(doc.traceEvents, dict(header))
            t3 = time.process_time()
            del doc
            t4 = time.process_time()
            ex.read(p)
            t5 = time.process_time()
            gc.enable()
            for v, d in zip(cols.values(), (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
                v.append(d)
        print(f"{p.name:<15}" + "".join(f" {statistics.median(v) * 1e3:7.1f}" for v in cols.values()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", type=Path, help="another source tree to read with, side by side")
    ap.add_argument("--dir", type=Path, help="keep the trace files here (reused when present)")
    ap.add_argument("--cpu-scopes", type=int, default=200_000)
    ap.add_argument("--reps", type=int, default=REPS)
    ap.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.reps)))
        return
    with tempfile.TemporaryDirectory() as d:
        folder = args.dir or Path(d)
        folder.mkdir(parents=True, exist_ok=True)
        if not files(folder):
            make_traces(folder, args.cpu_scopes)
        trees = {"this": ROOT} | ({"other": args.against.resolve()} if args.against else {})
        res = {k: child(tree, folder, args.reps) for k, tree in trees.items()}
        print(f"loadavg {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; median of {args.reps}")
        head = f"{'file':<15} {'scopes':>7} {'ops':>7} {'MB':>6}"
        for k in trees:
            head += f" {k + ' scopes/s':>16} {'ops/s':>10}"
        if len(trees) > 1:
            head += f" {'speed-up':>8}"
        print(head)
        for name, (n, nops, _) in res["this"].items():
            size = (folder / name).stat().st_size / 1e6
            line = f"{name:<15} {n:>7.0f} {nops:>7.0f} {size:>6.2f}"
            for k in trees:
                sec = res[k][name][2]
                line += f" {n / sec:>16,.0f} {(nops / sec if nops else 0):>10,.0f}"
            if len(trees) > 1:
                line += f" {res['other'][name][2] / res['this'][name][2]:>7.1f}x"
            print(line)
        inflate_table(folder, args.reps)
        stages_table(folder, args.reps)
        print("\nwhole `gputrace summarize FILE` (wall s, median)")
        for name in ("gpu.json", "gpu.json.gz", "cupti.json", "cupti.json.gz", "cupti.pftrace"):
            if (folder / name).exists():
                line = f"{name:<15}"
                for k, tree in trees.items():
                    line += f" {k}: {summarize_time(tree, folder / name, 3):6.3f}"
                print(line)


if __name__ == "__main__":
    main()
