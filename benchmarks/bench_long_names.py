"""Peak memory of the commands that read traces, on a trace with one very long scope name.

    python3 benchmarks/bench_long_names.py                        # this tree, names of 10 and 40 MiB
    python3 benchmarks/bench_long_names.py --against /path/tree   # and another tree, side by side
    python3 benchmarks/bench_long_names.py --mib 10 100

A name that long only comes from a hand-made or foreign file (the recorder keeps 1,000
characters), so this is about input that must not cost memory out of proportion to the file.
The trace is tests/data/handmade.json with one CPU scope renamed to N MiB of text (the file is
then about N MiB). Each command runs in its own child process with its output going to a file;
the child reports its own peak resident set (``VmHWM``, which unlike ``ru_maxrss`` does not
inherit the parent's high-water mark through fork and exec). "over" is the peak minus the same
command's peak on the unchanged file, in multiples of the file size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "tests" / "data" / "handmade.json"
CHILD = """
import sys
sys.argv = ["gputrace", *sys.argv[1:]]
from gputrace.cli import cli
try:
    cli(prog_name="gputrace")
except SystemExit:
    pass
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print("HWM", hwm, file=sys.stderr)
"""


def commands(big: Path, out: Path) -> dict[str, list[str]]:
    return {
        "diff (table)": ["diff", str(SMALL), str(big)],
        "diff -f markdown": ["diff", str(SMALL), str(big), "-f", "markdown"],
        "diff -f json": ["diff", str(SMALL), str(big), "-f", "json"],
        "summarize (table)": ["summarize", str(big)],
        "summarize -f markdown": ["summarize", str(big), "-f", "markdown"],
        "summarize -f csv": ["summarize", str(big), "-f", "csv"],
        "summarize -f json": ["summarize", str(big), "-f", "json"],
        "merge": ["merge", str(out), str(big), str(SMALL)],
    }


def peak_mib(tree: Path, args: list[str], sink: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    with sink.open("wb") as out:
        # cwd: not a source tree, which ``python -c`` would put first on the path
        r = subprocess.run([sys.executable, "-c", CHILD, *args], stdout=out, stderr=subprocess.PIPE, env=env,
                           cwd=sink.parent)  # fmt: skip
    lines = [x for x in r.stderr.decode(errors="replace").splitlines() if x.startswith("HWM")]
    if not lines:
        return float("nan")  # it died (MemoryError, killed)
    return int(lines[-1].split()[1]) / 1024


def long_name_trace(folder: Path, mib: int) -> Path:
    doc = orjson.loads(SMALL.read_bytes())
    doc["traceEvents"][6]["name"] = "n" * (mib << 20)  # the CPU scope "b" of handmade.json
    path = folder / f"name{mib}mib.json"
    path.write_bytes(orjson.dumps(doc))
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", type=Path, default=None, help="another source tree to run side by side")
    ap.add_argument("--mib", type=int, nargs="+", default=[10, 40])
    opts = ap.parse_args()
    trees = [("this tree", ROOT)] + ([("against", opts.against.resolve())] if opts.against else [])
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sink = folder / "stdout"
        bigs = {mib: long_name_trace(folder, mib) for mib in opts.mib}
        head = ["command"] + [
            f"{label}: {m} MiB name, peak MiB (over)" for label, _ in trees for m in opts.mib
        ]
        print("| " + " | ".join(head) + " |")
        print("|---" + "|--:" * (len(head) - 1) + "|")
        for what in commands(SMALL, folder / "out.json"):
            cells = [what]
            for _, tree in trees:
                base = peak_mib(tree, commands(SMALL, folder / "out.json")[what], sink)
                for big in bigs.values():
                    got = peak_mib(tree, commands(big, folder / "out.json")[what], sink)
                    over = (got - base) / (big.stat().st_size / 2**20)
                    cells.append(f"{got:.0f} ({over:.1f}×)")
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
