"""Progress lines: shown only on a terminal, for loading (by the JSON's size), merge and calibrate."""

from __future__ import annotations

import gzip
import io
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from gputrace import progress
from gputrace.calibrate import measure, steps
from gputrace.cli import cli
from gputrace.commands import _common
from gputrace.progress import Progress, content_size

DATA = Path(__file__).parents[1] / "data"
CALIBRATE_CPU = ["calibrate", "--backend", "cpu", "--quick", "--no-save", "--format", "json"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_shown_on_a_terminal_only() -> None:
    tty, pipe = Terminal(), io.StringIO()
    for stream in (tty, pipe):
        with Progress("work", total=2, stream=stream) as p:
            p.step("first")
            p.step("second")
            if stream is tty:
                assert "work: second [1/2]" in tty.getvalue()
    assert pipe.getvalue() == ""
    assert tty.getvalue().endswith("\r\x1b[K")  # the line is cleared when the work ends
    broken = Terminal()
    broken.close()
    with Progress("work", stream=broken) as p:  # a closed terminal never stops the work
        p.step("x")


def test_the_elapsed_time_keeps_moving_through_a_long_step() -> None:
    tty = Terminal()
    with Progress("calibrating", total=1, stream=tty, tick_s=0.01) as p:
        p.step("one long step")
        time.sleep(0.2)
        progress.clear()  # an error message is about to be printed: the line goes, and stays gone
        after = tty.getvalue()
        time.sleep(0.05)
        assert tty.getvalue() == after and after.endswith("\r\x1b[K")
    assert after.count("one long step [0/1]") >= 3  # redrawn while the step ran


def test_a_gzip_file_is_sized_by_the_json_it_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = (DATA / "story.json").read_bytes()
    path = tmp_path / "story.json.gz"
    path.write_bytes(gzip.compress(raw))
    assert content_size(path) == len(raw) > 4 * path.stat().st_size
    assert content_size(DATA / "story.json") == len(raw) and content_size(tmp_path / "nope") == 0
    monkeypatch.setattr(_common, "PROGRESS_MIN_BYTES", len(raw))  # more than the file on disk
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    monkeypatch.setattr(_common, "is_terminal", lambda stream: True)
    res = CliRunner().invoke(cli, ["summarize", str(path)])
    assert res.exit_code == 0 and f"loading {path}: building [2/3]" in res.stderr


def test_merge_shows_each_input_and_errors_start_on_a_clean_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    a, b = str(DATA / "rank0.json"), str(DATA / "rank1.json")
    res = CliRunner().invoke(cli, ["merge", str(tmp_path / "all.json"), a, b])
    assert res.exit_code == 0, res.stderr
    assert f"reading {a} [0/4]" in res.stderr and f"reading {b} [1/4]" in res.stderr
    assert f"writing {tmp_path / 'all.json'} [3/4]" in res.stderr
    res = CliRunner().invoke(cli, ["merge", str(tmp_path / "x.json"), a, str(tmp_path / "missing.json")])
    assert res.exit_code == 2
    last = res.stderr.split("\r\x1b[K")[-1]
    assert last.startswith("gputrace: ") and "missing.json" in last


def test_merge_is_silent_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["merge", str(tmp_path / "all.json"), str(DATA / "rank0.json")])
    assert res.exit_code == 0 and "\x1b[K" not in res.stderr and "reading" not in res.stderr


def test_calibrate_reports_each_group_of_measurements(monkeypatch: pytest.MonkeyPatch) -> None:
    stages: list[str] = []
    measure("cpu", quick=True, progress=stages.append)
    assert stages == ["clock", "scope_cost"] == list(steps("cpu"))
    assert steps("wgpu") == ("submit", "copies", "breakeven", "clock", "scope_cost", "numpy_breakeven")
    monkeypatch.setattr(progress, "is_terminal", lambda stream: True)
    res = CliRunner().invoke(cli, CALIBRATE_CPU)
    assert res.exit_code == 0, res.stderr
    assert "gputrace calibrate --backend cpu: session clock [0/2]" in res.stderr
    assert "profiler cost per scope [1/2]" in res.stderr
    json.loads(res.stdout)  # stdout holds only the results


def test_calibrate_is_silent_when_stderr_is_not_a_terminal() -> None:
    res = CliRunner().invoke(cli, CALIBRATE_CPU)
    assert res.exit_code == 0 and "\x1b[K" not in res.stderr
