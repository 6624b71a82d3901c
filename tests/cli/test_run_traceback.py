"""`gputrace run`: a traced function's traceback reads as it would without gputrace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.builders import child_env

SCRIPT = """\
import helper


def inner():
    raise ValueError("boom")


def step():
    try:
        helper.work()
    except KeyError as exc:
        raise RuntimeError("wrapped") from exc


def main():
    try:
        step()
    finally:
        inner()


main()
"""

HELPER = """\
def work():
    raise KeyError("missing")
"""


def test_traced_functions_leave_no_gputrace_frames_in_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(SCRIPT)
    (tmp_path / "helper.py").write_text(HELPER)
    args = ["--trace-function", "__main__:step", "--trace-function", "__main__:inner"]
    done = subprocess.run(
        [sys.executable, "-m", "gputrace", "run", "-o", "t.json", "--backend", "cpu",
         *args, "--trace-module", "helper", "prog.py"],
        cwd=tmp_path, env=child_env(),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    err = done.stderr.split("gputrace: trace written to")[0]
    assert "KeyError: 'missing'" in err and "RuntimeError: wrapped" in err and "ValueError: boom" in err
    assert "in wrapper" not in err and "recorder.py" not in err and "gputrace" not in err, err
    for frame in ('prog.py", line 22, in <module>', "in main", "in step", "in inner", 'helper.py", line 2'):
        assert frame in err, (frame, err)
    assert err.count('File "') == 7  # step, work; main, step; <module>, main, inner
