"""session(nvtx=True) / gputrace run --nvtx: every scope is also an NVTX range, balanced per thread;
off, nothing changes. NVTX itself is replaced by a fake module that logs each call."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

import gputrace
from gputrace.errors import GputraceError, GputraceWarning
from gputrace.nvtx import MISSING
from gputrace.recorder import active_recorder, trace

ROOT = Path(__file__).parents[2]

FAKE_NVTX = """
import atexit, os, threading
log = []
class Domain:
    def get_event_attributes(self, message):
        return ("attributes", message)
    def push_range(self, attributes):
        log.append(("push", attributes[1], threading.get_ident()))
    def pop_range(self):
        log.append(("pop", None, threading.get_ident()))
def get_domain(name):
    assert name == "gputrace"
    return Domain()
if os.environ.get("FAKE_NVTX_LOG"):
    atexit.register(lambda: open(os.environ["FAKE_NVTX_LOG"], "w").write(repr(log)))
"""


@pytest.fixture
def fake_nvtx(monkeypatch: pytest.MonkeyPatch) -> Any:
    mod = types.ModuleType("nvtx")
    exec(FAKE_NVTX, mod.__dict__)
    monkeypatch.setitem(sys.modules, "nvtx", mod)
    return mod


def balanced(log: list[tuple[str, str | None, int]]) -> dict[int, list[str]]:
    """Per thread, the names pushed, checking every pop closes the innermost open range."""
    open_: dict[int, list[str]] = {}
    pushed: dict[int, list[str]] = {}
    for op, name, tid in log:
        if op == "push":
            open_.setdefault(tid, []).append(str(name))
            pushed.setdefault(tid, []).append(str(name))
        else:
            assert open_.get(tid), "a pop without a push"
            open_[tid].pop()
    assert all(not v for v in open_.values()), open_
    return pushed


def test_every_scope_is_an_nvtx_range(fake_nvtx: Any) -> None:
    @gputrace.trace("decorated")
    def work() -> None:
        with gputrace.trace("inner"):
            pass

    with gputrace.session(backend="cpu", nvtx=True, quiet=True) as s:
        with gputrace.trace("outer", step=1):
            work()
        with pytest.raises(ValueError), gputrace.trace("raises"):
            raise ValueError
        t = threading.Thread(target=work)
        t.start()
        t.join()
    main = threading.get_ident()
    per_thread = balanced(fake_nvtx.log)
    assert per_thread[main] == ["outer", "decorated", "inner", "raises"]
    assert per_thread[t.ident or 0] == ["decorated", "inner"]
    assert [sc.name for sc in s.trace] == ["outer", "decorated", "inner", "raises", "decorated", "inner"]
    assert s.trace.find("raises")[0].args["exception"] == "ValueError"  # scopes record as before


def test_off_by_default_and_after_the_session(fake_nvtx: Any) -> None:
    plain_enter, plain_exit = trace.__enter__, trace.__exit__
    with gputrace.session(backend="cpu", quiet=True):
        assert trace.__enter__ is plain_enter and trace.__exit__ is plain_exit
        with gputrace.trace("plain"):
            pass
    with gputrace.session(backend="cpu", nvtx=True, quiet=True):
        assert trace.__enter__ is not plain_enter
        with gputrace.trace("ranged"):
            pass
    assert trace.__enter__ is plain_enter and trace.__exit__ is plain_exit  # the plain path is back
    with gputrace.trace("after"):
        pass
    assert [name for op, name, _ in fake_nvtx.log if op == "push"] == ["ranged"]


def test_a_scope_open_when_nvtx_starts_pushes_nothing_and_pops_nothing(fake_nvtx: Any) -> None:
    outer = gputrace.session(backend="cpu", quiet=True)
    outer.yields_to_inner = True
    with outer:
        with gputrace.trace("before"):
            with gputrace.session(backend="cpu", nvtx=True, quiet=True):
                with gputrace.trace("during"):
                    pass
    assert balanced(fake_nvtx.log)[threading.get_ident()] == ["during"]


def test_cupy_is_the_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    log: list[tuple[str, str | None, int]] = []
    cupy, cuda, nv = (types.ModuleType(n) for n in ("cupy", "cupy.cuda", "cupy.cuda.nvtx"))
    nv.RangePush = lambda name: log.append(("push", name, 0))  # type: ignore[attr-defined]
    nv.RangePop = lambda: log.append(("pop", None, 0))  # type: ignore[attr-defined]
    cuda.nvtx = nv  # type: ignore[attr-defined]
    cupy.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvtx", None)  # import nvtx fails
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.nvtx", nv)):
        monkeypatch.setitem(sys.modules, name, mod)
    with gputrace.session(backend="cpu", nvtx=True, quiet=True) as s:
        with gputrace.trace("a"):
            pass
    assert s._recorder is not None and s._recorder.nvtx.source == "cupy"
    assert balanced(log) == {0: ["a"]}


def test_missing_nvtx_is_one_sentence_and_starts_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # (every CuPy module: where CuPy is installed, earlier tests imported cupy.cuda already)
    for name in ("nvtx", "cupy", "cupy.cuda", "cupy.cuda.nvtx"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(GputraceError) as err:
        gputrace.session(backend="cpu", nvtx=True, quiet=True).start()
    assert str(err.value) == MISSING and "pip install nvtx" in MISSING
    assert active_recorder() is None


def test_a_failing_nvtx_call_never_reaches_the_program(fake_nvtx: Any) -> None:
    def broken(attributes: Any) -> None:
        raise OSError("no NVTX injection library")

    fake_nvtx.Domain.push_range = lambda self, a: broken(a)
    with pytest.warns(GputraceWarning, match="NVTX range could not be pushed"):
        with gputrace.session(backend="cpu", nvtx=True, quiet=True) as s:
            for _ in range(3):
                with gputrace.trace("still recorded"):
                    pass
    assert len(s.trace.find("still recorded")) == 3
    assert [op for op, _, _ in fake_nvtx.log] == []  # no pop for a push that failed


def run_cli(tmp_path: Path, *args: str, python: str = "") -> subprocess.CompletedProcess[str]:
    code = (
        f"{python}\nimport sys\nfrom gputrace.cli import main\nsys.argv = ['gputrace', *sys.argv[1:]]\nmain()"
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]),
        FAKE_NVTX_LOG=str(tmp_path / "nvtx.log"),
    )
    return subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


def test_gputrace_run_nvtx(tmp_path: Path) -> None:
    (tmp_path / "nvtx.py").write_text(FAKE_NVTX)  # the script's directory comes first on sys.path
    (tmp_path / "prog.py").write_text("def step():\n    pass\n\nfor _ in range(2):\n    step()\n")
    done = run_cli(tmp_path, "run", "--nvtx", "--backend", "cpu", "--trace-function", "__main__:step",
                   "prog.py")  # fmt: skip
    assert done.returncode == 0, done.stderr
    log = eval((tmp_path / "nvtx.log").read_text())
    assert [name for op, name, _ in log if op == "push"] == ["step", "step"]
    assert len(log) == 4


def test_gputrace_run_nvtx_without_nvtx_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("print('ran')\n")
    done = run_cli(tmp_path, "run", "--nvtx", "--backend", "cpu", "prog.py",
                   python="import sys\nsys.modules['nvtx'] = sys.modules['cupy'] = None")  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"gputrace: {MISSING}"


def test_import_and_a_plain_session_do_not_import_nvtx() -> None:
    code = (
        "import sys, gputrace\n"
        "with gputrace.session(backend='cpu', quiet=True):\n"
        "    with gputrace.trace('x'):\n"
        "        pass\n"
        "print('nvtx' in sys.modules, 'gputrace.nvtx' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["False", "False"]
