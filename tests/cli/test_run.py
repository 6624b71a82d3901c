"""`gputrace run`: a program runs as `python script.py` would, and its trace is written however it ends."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

import gputrace
from gputrace.errors import GputraceError
from gputrace.model import Flag
from gputrace.runner import RunOptions, parse_targets, run_script
from tests.builders import gputrace_run

SCRIPTS = Path(__file__).parents[1] / "scripts"
ROOT = Path(__file__).parents[2]


def test_program_that_raises_exits_1_with_a_python_traceback_and_writes_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    done = gputrace_run("-o", out, "--backend", "cpu", SCRIPTS / "raises.py", cwd=tmp_path)
    assert done.returncode == 1
    err = done.stderr
    assert err.startswith("Traceback (most recent call last):\n")
    assert "runner.py" not in err and "gputrace" not in err.split("FileNotFoundError")[0]
    assert 'raises.py", line 14, in <module>' in err and "in load" in err
    assert "FileNotFoundError: missing.bin" in err
    assert f"trace written to {out}" in err
    t = gputrace.load(out)
    (load,) = t.find("load")
    assert load.args["exception"] == "FileNotFoundError" and load.flags & Flag.ERROR
    assert [sc.name for sc in t] == ["startup", "load"]


def test_sys_exit_code_and_argv_pass_through(tmp_path: Path) -> None:
    done = gputrace_run("--backend", "cpu", SCRIPTS / "exits.py", "-o", "x", "--flag", cwd=tmp_path)
    assert done.returncode == 3
    assert done.stdout == "argv: -o x --flag\n"  # options after the script belong to it
    t = gputrace.load(tmp_path / "exits.run.trace.json")  # the default name, in the working directory
    (work,) = t.find("work")
    assert work.args == {"argc": 4}
    assert t.header["metadata"]["args"] == ["-o", "x", "--flag"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("name", ["TERM", "INT"])
def test_a_signal_writes_the_trace_then_ends_the_process_by_that_signal(tmp_path: Path, name: str) -> None:
    out = tmp_path / "s.json"
    done = gputrace_run("-o", out, "--backend", "cpu", SCRIPTS / "signals.py", name, cwd=tmp_path)
    assert done.returncode == -getattr(signal, "SIG" + name)
    if name == "INT":  # as Python does it: a KeyboardInterrupt traceback
        assert done.stderr.startswith("Traceback") and "KeyboardInterrupt" in done.stderr
    t = gputrace.load(out)
    assert [sc.name for sc in t] == ["before-signal", "waiting"]
    assert t.find("waiting")[0].flags & Flag.ERROR  # the scope the signal interrupted


def test_the_program_s_threads_are_waited_for(tmp_path: Path) -> None:
    script = tmp_path / "threads.py"
    script.write_text(
        "import threading, time, gputrace\n"
        "def work():\n"
        "    time.sleep(0.05)\n"
        "    with gputrace.trace('in-thread'):\n"
        "        pass\n"
        "threading.Thread(target=work).start()\n"
    )
    result = run_script(RunOptions(script, [], output=None, backend="cpu", quiet=True))
    assert result.exit_code == 0 and result.trace is not None
    assert [sc.name for sc in result.trace] == ["in-thread"]


def test_python_dash_m_and_trace_module_in_a_fresh_process(tmp_path: Path) -> None:
    done = gputrace_run(
        "-o",
        tmp_path / "m.json.gz",
        "--backend",
        "cpu",
        "--trace-module",
        "scopes_helper",
        "--trace-function",
        "__main__:Model.forward",
        SCRIPTS / "scopes.py",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "name: __main__ file: scopes.py path0: scripts" in done.stdout
    t = gputrace.load(tmp_path / "m.json.gz")
    names = [sc.name for sc in t]
    assert names.count("scopes_helper.double") == 3
    assert names.count("scopes_helper.square_root_of_square") == 3  # calls inside the module too
    assert names.count("Model.forward") == 1 and names.count("iteration") == 3


def test_unknown_script_is_a_one_line_error_with_exit_2(tmp_path: Path) -> None:
    done = gputrace_run("--backend", "cpu", tmp_path / "nope.py", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == f"gputrace: {tmp_path / 'nope.py'}: no such Python file."


def test_in_process_run_restores_the_interpreter_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv, path0, main = list(sys.argv), sys.path[0], sys.modules["__main__"]
    result = run_script(
        RunOptions(
            SCRIPTS / "scopes.py", ["a"], output=None, backend="cpu", quiet=True, trace_modules=["__main__"]
        )
    )
    assert result.exit_code == 0 and result.signal is None
    assert (sys.argv, sys.path[0], sys.modules["__main__"]) == (argv, path0, main)
    assert "total: 12" in capsys.readouterr().out  # same output as `python scopes.py`
    assert result.trace is not None
    names = [sc.name for sc in result.trace]
    assert names.count("step") == 3 and names.count("main") == 1 and "Model.forward" not in names
    (main_scope,) = result.trace.find("main")
    assert all(sc.depth > main_scope.depth for sc in result.trace if sc.name != "main")


def test_exit_statuses_follow_python(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "sys.exit()": 0,
        "sys.exit(0)": 0,
        "sys.exit(300)": 300 & 0xFF,
        "sys.exit('bye')": 1,
        "raise KeyError(1)": 1,
    }
    for body, status in cases.items():
        script = tmp_path / "prog.py"
        script.write_text(f"import sys\n{body}\n")
        result = run_script(RunOptions(script, [], output=None, backend="cpu", quiet=True))
        assert result.exit_code == status, body
    err = capsys.readouterr().err
    assert "bye\n" in err and "KeyError: 1" in err


def test_a_syntax_error_is_reported_like_python(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "bad_syntax.py"
    script.write_text("def f(:\n")
    result = run_script(RunOptions(script, [], output=tmp_path / "never.json", backend="cpu"))
    assert (result.exit_code, result.trace, result.written) == (1, None, None)
    assert "SyntaxError" in capsys.readouterr().err
    assert not (tmp_path / "never.json").exists()


def test_trace_function_targets_are_checked() -> None:
    assert parse_targets(["m"], ["m:f", "n:C.g", "n:h"]) == {"m": None, "n": {"C.g", "h"}}
    for bad in ("nocolon", "m:", ":f", "m:1f"):
        with pytest.raises(GputraceError, match="module:function"):
            parse_targets([], [bad])


def test_a_missing_function_or_module_is_noted(tmp_path: Path) -> None:
    result = run_script(
        RunOptions(
            SCRIPTS / "exits.py",
            [],
            output=None,
            backend="cpu",
            quiet=True,
            trace_functions=["__main__:nothing", "json:no_such_function", "never_imported_mod:f"],
        )
    )
    assert result.exit_code == 3
    assert result.notes == [
        "--trace-function: exits.py has no function nothing.",
        "--trace-function: json has no function no_such_function.",
        "--trace-module/--trace-function: the program never imported never_imported_mod.",
    ]


@pytest.mark.wgpu
def test_wgpu_devices_the_program_creates_are_traced() -> None:
    from gputrace.calibrate.on_wgpu import probe

    try:
        _, adapter = probe()
    except GputraceError as exc:
        pytest.skip(str(exc))
    if "timestamp-query" not in adapter.features:
        pytest.skip("the adapter has no timestamp-query feature")
    from wgpu.backends.wgpu_native._api import GPUAdapter

    result = run_script(RunOptions(SCRIPTS / "wgpu_passes.py", [], output=None, backend="wgpu", quiet=True))
    assert result.exit_code == 0 and result.trace is not None
    frames = result.trace.find("frame")
    assert len(frames) == 3
    assert all(sc.gpu_ns is not None and not sc.flags & Flag.UNTIMED for sc in frames)
    assert "request_device_sync" not in GPUAdapter.__dict__  # the program's wgpu is left as it was


def test_a_program_with_its_own_session_keeps_it(tmp_path: Path) -> None:
    script = tmp_path / "own_session.py"
    script.write_text(
        "import sys, gputrace\n"
        "with gputrace.trace('outside'):\n"
        "    pass\n"
        "with gputrace.session(sys.argv[1], backend='cpu', quiet=True):\n"
        "    with gputrace.trace('inside'):\n"
        "        pass\n"
        "with gputrace.trace('after'):\n"
        "    pass\n"
    )
    own = tmp_path / "own.json"
    result = run_script(RunOptions(script, [str(own)], output=None, backend="cpu", quiet=True))
    assert result.exit_code == 0 and result.trace is not None
    assert [sc.name for sc in result.trace] == ["outside", "after"]
    assert [sc.name for sc in gputrace.load(own)] == ["inside"]


def test_a_streamed_run_is_not_read_back_at_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file holds a long run's trace: counting it needs no read-back (which would hold the
    whole trace in memory at exit); ``result.trace`` reads it on first use."""
    from gputrace import exporters

    reads: list[object] = []
    real = exporters.load
    monkeypatch.setattr(exporters, "load", lambda *a, **k: reads.append(a) or real(*a, **k))
    script = tmp_path / "many.py"
    script.write_text("import gputrace\nfor i in range(300):\n    with gputrace.trace('s'):\n        pass\n")
    out = tmp_path / "many.json"
    result = run_script(RunOptions(script, [], output=out, backend="cpu", quiet=True))
    assert (result.exit_code, result.scopes, result.backend, result.written) == (0, 300, "cpu", out)
    assert reads == []
    assert result.trace is not None and len(result.trace) == 300 and len(reads) == 1
