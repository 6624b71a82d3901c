"""A streamed file written by a writer process (``session(writer="process")``, gputrace.appender)
is the file the program's own process writes, and a killed program leaves what it had sent."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import gputrace
from gputrace.errors import GputraceError
from tests.builders import cupti_trace


@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".pftrace"])
def test_a_writer_process_writes_the_same_file(
    suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {}
    for writer in ("thread", "process"):
        monkeypatch.setenv("GPUTRACE_WRITER", writer)
        path = tmp_path / f"{writer}{suffix}"
        cupti_trace(tmp_path, monkeypatch, path)
        files[writer] = path
    a, b = (gputrace.load(gputrace.exporters.canonical(files[w])) for w in ("thread", "process"))
    assert len(a) == len(b) > 0 and len(a.ops) == len(b.ops) > 0
    docs = [_document(gputrace.exporters.canonical(files[w])) for w in ("thread", "process")]
    assert docs[0] == docs[1]
    if suffix == ".pftrace":
        assert files["process"].stat().st_size == files["thread"].stat().st_size > 0


def _document(path: Path) -> Any:
    """The file's JSON less the real clocks' reading at start (the one thing two runs differ in)."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return _without(doc, "clock_pair")


def _without(doc: Any, key: str) -> Any:
    if isinstance(doc, dict):
        return {k: _without(v, key) for k, v in doc.items() if k != key}
    return [_without(v, key) for v in doc] if isinstance(doc, list) else doc


def test_a_killed_program_leaves_what_the_writer_process_had(tmp_path: Path) -> None:
    out = tmp_path / "killed.json.gz"
    program = textwrap.dedent(f"""
        import os, signal, gputrace
        s = gputrace.session({str(out)!r}, backend="fake", writer="process", quiet=True)
        s.start()
        for i in range(30):
            with gputrace.trace("step", i=i):
                pass
            gputrace.sync()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGKILL
    t = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the writer process finishes what it had read, then ends
        with contextlib.suppress(gputrace.GputraceError):
            t = gputrace.load(out)
            if len(t) == 30:
                break
        time.sleep(0.05)
    assert t is not None and len(t) == 30
    assert t.header["truncated"] is True  # no final header: what a crash leaves, said so


def test_an_unknown_writer_is_one_sentence() -> None:
    with pytest.raises(GputraceError, match="writer='disk' is not one of auto, process, thread"):
        gputrace.session("x.json", writer="disk")
