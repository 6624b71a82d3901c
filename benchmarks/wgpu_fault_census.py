"""wgpu fault census (lavapipe): a small wgpu program, each run its own process, with a GPU wait
timeout of 10 µs, or a fault at call N of a read-back hook. Prints one table: aborts (a
wgpu-native panic kills the process), exceptions that reached the program, wrong results,
unloadable files.

    PYTHONPATH=. python3 benchmarks/wgpu_fault_census.py [--calls 8] [--timeouts 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gputrace  # noqa: E402

SCRIPT = ROOT / "tests" / "scripts" / "wgpu_faults.py"
TARGETS = [
    "gputrace.backends.wgpu_queries.wait_mapped",
    "gputrace.backends.wgpu_queries.mapped_ready",
    "gputrace.backends.wgpu_queries.poll",
]
EXPECTED = [2.0**16 - 1]  # 12 steps in the session, 4 after it


def one(out: Path, timeout_s: float, target: str | None = None, n: int = 0) -> dict[str, object]:
    cmd = [sys.executable, str(SCRIPT), str(out), repr(timeout_s)]
    if target:
        cmd += [target, str(n)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), GPUTRACE_ROOT=str(ROOT))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    res = {"abort": done.returncode != 0, "exc": 0, "wrong": False, "unloadable": False, "why": ""}
    last = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT")]
    if done.returncode != 0:
        res["why"] = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
        panic = [ln for ln in done.stderr.splitlines() if "still mapped" in ln or "panicked" in ln]
        if panic:
            res["why"] = panic[-1].strip()
    elif last:
        res["exc"] = int(last[0].rsplit(" ", 1)[1])
        res["wrong"] = f"{EXPECTED}" not in last[0]
    try:
        gputrace.load(out)
    except Exception as exc:
        res["unloadable"] = True
        res["why"] = res["why"] or f"{type(exc).__name__}: {exc}"
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=8, help="call indices tried per hook (1..N)")
    ap.add_argument("--timeouts", type=int, default=10, help="runs with timeout_s=1e-5")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(None, 0, 1e-5)] * args.timeouts
        runs += [(t, n, 10.0) for t in TARGETS for n in range(1, args.calls + 1)]
        for k, (target, n, timeout_s) in enumerate(runs):
            r = one(Path(tmp) / f"w{k}.json", timeout_s, target, n)
            rows.append((target or "timeout_s=1e-5", n, r))
    print("| case | runs | aborts | exceptions in the program | wrong results | unloadable files |")
    print("|---|---|---|---|---|---|")
    for case in ["timeout_s=1e-5", *TARGETS]:
        rs = [r for c, _, r in rows if c == case]
        print(
            f"| {case.rsplit('.', 1)[-1]} | {len(rs)} | {sum(bool(r['abort']) for r in rs)} "
            f"| {sum(int(r['exc']) for r in rs)} | {sum(bool(r['wrong']) for r in rs)} "
            f"| {sum(bool(r['unloadable']) for r in rs)} |"
        )
    whys = sorted({str(r["why"]) for _, _, r in rows if r["why"]})
    for w in whys[:10]:
        print("  ", w)


if __name__ == "__main__":
    main()
