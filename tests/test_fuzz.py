"""Mutation fuzz: hostile variants of the real traces through every command.

Seeded mutants of the traces in ``tests/data`` (see ``tests/fuzz_mutants.py``) go through
summarize, diff, merge and view's load path, in worker processes limited to 1 GiB of address
space, each run under a 20 s alarm. Every run must end with exit code 0 or 2, a failure must be
one line, and nothing may raise (no traceback), hang or run out of memory.

CI runs ``GPUTRACE_FUZZ_N`` mutants (default 200, about half a minute); for the full run:

    GPUTRACE_FUZZ_N=1000 python3 -m pytest -q tests/test_fuzz.py -s
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.fuzz_mutants import LINE_BREAKS, mutant

ROOT = Path(__file__).parent.parent
MEMORY_LIMIT = 1 << 30
WORKERS = 2
N = int(os.environ.get("GPUTRACE_FUZZ_N", "200"))
SEED0 = 14_000


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _problems(r: dict[str, Any]) -> list[str]:
    if r.get("hang"):
        return ["hang"]
    out: list[str] = []
    if r["crashed"] or "Traceback" in r["output"]:
        out.append("traceback")
    if r["exit"] not in (0, 2):
        out.append(f"exit {r['exit']}")
    if any(c in r["output"] for c in LINE_BREAKS):
        out.append("raw line break")  # a name's line break reached the terminal unescaped
    lines = r["output"].strip().splitlines()
    if r["exit"] == 2 and not (len(lines) == 1 and lines[0].startswith("gputrace: ")):
        out.append("not one line")
    return out


def test_mutants_through_every_command(tmp_path: Path) -> None:
    dirs = [tmp_path / f"w{k}" for k in range(WORKERS)]
    for d in dirs:
        d.mkdir()
    for i in range(N):
        name, content = mutant(SEED0 + i)
        (dirs[i % WORKERS] / name).write_bytes(content)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OPENBLAS_NUM_THREADS": "1"}  # fmt: skip
    procs = [
        subprocess.Popen([sys.executable, "-m", "tests.fuzz_mutants", str(d)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_limit_memory)
        for d in dirs
    ]  # fmt: skip
    results: list[dict[str, Any]] = []
    peaks: list[int] = []
    for p in procs:
        out, err = p.communicate(timeout=60 + 4 * 20 * N)
        assert p.returncode == 0, f"worker died ({p.returncode}): {err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]
        for line in out.splitlines():
            rec = json.loads(line)
            if "peak_rss_kb" in rec:
                peaks.append(rec["peak_rss_kb"])
            else:
                results.append(rec)
    assert len(results) == 4 * N
    bad = [(r["args"], p, r.get("traceback") or r.get("output")) for r in results if (p := _problems(r))]
    exits = {code: sum(r.get("exit") == code for r in results) for code in (0, 2)}
    slowest = max(r["seconds"] for r in results)
    print(f"\nfuzz: {N} mutants, {len(results)} runs, exit 0: {exits[0]}, exit 2: {exits[2]}, "
          f"problems: {len(bad)}, hangs: {sum(bool(r.get('hang')) for r in results)}, "
          f"slowest run {slowest:.2f} s, peak RSS {max(peaks) / 1024:.0f} MiB")  # fmt: skip
    assert not bad, bad[:5]
    assert max(peaks) < MEMORY_LIMIT // 1024


def test_mutants_are_deterministic() -> None:
    assert [mutant(s) for s in range(5)] == [mutant(s) for s in range(5)]
    assert len({mutant(s)[1] for s in range(20)}) == 20
