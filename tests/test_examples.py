"""The README's main command: the quick-start example writes a valid trace on any machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gputrace
from tests import perfetto_rules

ROOT = Path(__file__).resolve().parent.parent


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
