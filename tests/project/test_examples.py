"""The README's main command: the quick-start example writes a valid trace on any machine; the
CUDA examples end with one sentence where they cannot run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gputrace
from tests import perfetto_rules

ROOT = Path(__file__).resolve().parents[2]


def test_quickstart_writes_a_trace_and_says_how_to_open_it(tmp_path: Path) -> None:
    out = tmp_path / "quick.trace.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert f"trace written to {out}" in proc.stdout
    assert "ui.perfetto.dev" in proc.stdout and f"gputrace summarize {out}" in proc.stdout
    assert proc.stderr.count("gputrace:") <= 1  # at most the one notice about the backend
    trace = gputrace.load(out)
    assert [len(trace.find(n)) for n in ("step", "matmul", "normalize")] == [20, 20, 20]
    assert all(sc.depth == 1 for sc in trace.find("matmul"))
    assert perfetto_rules.check(perfetto_rules.read(out)) == []


RUN_WITHOUT_CUPY = """
import runpy, sys, types
if sys.argv[1] == "missing":
    sys.modules["cupy"] = None  # import cupy raises ImportError, as where CuPy is not installed
else:  # CuPy installed, no GPU
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(is_available=lambda: False)
    sys.modules["cupy"] = cupy
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("how", ["missing", "no_gpu"])
@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("cuda_*.py")))
def test_cuda_examples_end_with_one_sentence_without_a_gpu(example: str, how: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN_WITHOUT_CUPY,
            how,
            str(ROOT / "examples" / example),
            str(tmp_path / "t.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and proc.stdout == ""
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"{example} needs ") and "quickstart.py runs on any machine" in proc.stderr
    assert not (tmp_path / "t.json").exists()
