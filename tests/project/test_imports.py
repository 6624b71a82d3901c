"""What a session imports: nothing heavy that the user's program did not ask for.

Each case runs in a fresh interpreter, since an import, once done, is never undone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SESSION = r"""
import sys
import gputrace
from gputrace import summary
path = sys.argv[1]
with gputrace.session(path, backend="fake", quiet=True):
    for i in range(300):
        with gputrace.trace("step", i=i):
            with gputrace.trace("inner"):
                pass
        if i % 100 == 99:
            gputrace.sync()
t = gputrace.load(path)
summary.summarize(t)
heavy = sorted(m for m in ("numpy.ma", "cupy", "wgpu", "torch", "cupti") if m in sys.modules)
print(len(t.spans), heavy)
"""


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_a_streamed_session_its_load_and_summary_never_import_numpy_ma(tmp_path: Path, suffix: str) -> None:
    """``numpy.ma`` costs 12-17 ms to import (73 ms without bytecode); numpy 2 loads it lazily from
    ``np.unique``, ``np.median`` and ``np.percentile``. A session start once paid it up front."""
    out = subprocess.run(
        [sys.executable, "-c", SESSION, str(tmp_path / f"t{suffix}")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.split() == ["600", "[]"], out.stdout + out.stderr


CUPTI_SESSION = r"""
import sys
import gputrace
from gputrace.backends.cupti import CuptiBackend
from gputrace.clock import session_clock
from tests.cupti_fake import FakeActivitySource
src = FakeActivitySource(session_clock)
path = sys.argv[1]
with gputrace.session(path, backend=CuptiBackend(session_clock, source=src), writer="thread", quiet=True):
    for i in range(200):  # a sync each: past the 64 clock samples a chunk's fit refines its hull
        with gputrace.trace("step"):
            src.launch("k", gpu_ns=900)
        gputrace.sync()
print(len(gputrace.load(path).ops), "numpy.ma" in sys.modules)
"""


def test_a_cupti_session_never_imports_numpy_ma(tmp_path: Path) -> None:
    """The same for CUPTI timing, whose chunks fit the clock over many samples (the hull's
    refinement once took ``np.setdiff1d``, whose ``np.unique`` imported numpy.ma in the program's
    process, at its first chunk)."""
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", CUPTI_SESSION, str(tmp_path / "t.json.gz")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=root,
    )
    assert out.stdout.split() == ["200", "False"], out.stdout + out.stderr


def test_the_output_layer_has_no_import_cycle() -> None:
    """Every import between the modules of gputrace/exporters (lazy ones inside functions
    included) points one way: the opener and the plan at the bottom, the formats above them."""
    import ast

    folder = Path(__file__).resolve().parents[2] / "gputrace" / "exporters"
    mods = {p.stem if p.stem != "__init__" else "": p for p in folder.glob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.module.startswith("gputrace.exporters")
            ):
                sub = node.module.removeprefix("gputrace.exporters").lstrip(".")
                if sub:
                    edges[m].add(sub.split(".")[0])
                else:  # from gputrace.exporters import x: a submodule, or a name of __init__
                    edges[m] |= {a.name if a.name in mods else "" for a in node.names}
    edges = {m: {d for d in ds if d != m} for m, ds in edges.items()}
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"import cycle: {' -> '.join((*path, m))}"
        if m not in done:
            for d in edges.get(m, ()):
                visit(d, (*path, m))
            done.add(m)

    for m in mods:
        visit(m, ())


# What the recorder offers the rest of the package; its buffers' layout (``RICH``, ``ThreadBuffer``,
# ``raw_thread``, ``ThrottledLog``) stays inside it.
RECORDER_API = {
    "Recorder",
    "Recorded",
    "active_recorder",
    "drain",
    "innermost_token",
    "mark",
    "scopes_in",
    "trace",
}


def test_only_the_recorder_touches_its_thread_buffers() -> None:
    """A track's lists (``log``, ``old_logs``, ``rich``, ``stack``) belong to the recorder: the
    stream's writer and the session go through ``Recorder`` methods (``take_recorded``,
    ``throttle``, ``unclosed``, ``add_mark``, ``open_tids``) and what they hand out
    (``Recorded``); no module imports the recorder's internals."""
    import ast

    root = Path(__file__).resolve().parents[2] / "gputrace"
    internal = {"old_logs", "rich", "stack", "log"}
    found = []
    for p in sorted(root.rglob("*.py")):
        if p.name == "recorder.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in internal:
                owner = node.value
                name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
                if name in ("buf", "b", "track", "buffer"):
                    found.append(f"{p.relative_to(root)}:{node.lineno} {name}.{node.attr}")
            if isinstance(node, ast.ImportFrom) and node.module == "gputrace.recorder":
                found += [
                    f"{p.relative_to(root)}: imports {a.name}"
                    for a in node.names
                    if a.name not in RECORDER_API
                ]
    assert not found, found
