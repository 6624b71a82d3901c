"""What `gputrace run` says: exact counts, how to get scopes when none was recorded, --timing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import gputrace
from tests.builders import gputrace_run

LOOP = """
import time
import gputrace
for i in range({n}):
    with gputrace.trace("it", i=i):
        time.sleep({sleep})
    {after}
"""


def written_count(stderr: str) -> int:
    m = re.search(r"trace written to .* \((\d+) scopes, backend", stderr)
    assert m is not None, stderr
    return int(m.group(1))


def test_ring_message_counts_the_scopes_its_file_holds(tmp_path: Path) -> None:
    prog = tmp_path / "loop.py"
    prog.write_text(LOOP.format(n=40, sleep=0.004, after="gputrace.sync()"))
    out = tmp_path / "t.json"
    done = gputrace_run("--backend", "cpu", "--ring", "0.05", "-o", out, prog, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    held = len(gputrace.load(out))
    assert 0 < held < 40  # the ring dropped the oldest chunks
    assert written_count(done.stderr) == held


@pytest.mark.parametrize(
    ("extra", "expected"),
    [([], 10), (["--steps", "2:5"], 3), (["--schedule", "wait=1,active=2,repeat=2"], 4)],
)
def test_message_counts_the_scopes_the_file_holds(tmp_path: Path, extra: list[str], expected: int) -> None:
    prog = tmp_path / "loop.py"
    prog.write_text(LOOP.format(n=10, sleep=0, after="gputrace.step()"))
    out = tmp_path / "t.json"
    done = gputrace_run("--backend", "cpu", *extra, "-o", out, prog, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert written_count(done.stderr) == len(gputrace.load(out)) == expected


def test_no_scope_recorded_says_how_to_add_some(tmp_path: Path) -> None:
    prog = tmp_path / "plain.py"
    prog.write_text("def step():\n    return 1\n\nfor _ in range(3):\n    step()\n")
    done = gputrace_run("--backend", "cpu", "-o", tmp_path / "t.json", prog, cwd=tmp_path)
    assert done.returncode == 0
    assert written_count(done.stderr) == 0
    (line,) = [ln for ln in done.stderr.splitlines() if "no scope was recorded" in ln]
    assert "--trace-module MODULE" in line and "--trace-function MODULE:FUNC" in line
    assert "gputrace.trace" in line
    # following the advice records them
    named = ("--trace-function", "__main__:step")
    again = gputrace_run("--backend", "cpu", *named, "-o", tmp_path / "u.json", prog, cwd=tmp_path)
    assert written_count(again.stderr) == 3 and "no scope was recorded" not in again.stderr


def test_steps_never_reached_says_so(tmp_path: Path) -> None:
    prog = tmp_path / "loop.py"
    prog.write_text(LOOP.format(n=4, sleep=0, after="gputrace.step()"))
    done = gputrace_run("--backend", "cpu", "--steps", "10:12", "-o", tmp_path / "t.json", prog, cwd=tmp_path)
    assert "called gputrace.step() 4 times, never reaching the first recorded step (10)" in done.stderr


def test_quiet_run_says_nothing_about_scopes(tmp_path: Path) -> None:
    prog = tmp_path / "plain.py"
    prog.write_text("x = 1\n")
    done = gputrace_run("-q", "--backend", "cpu", "-o", tmp_path / "t.json", prog, cwd=tmp_path)
    assert "no scope was recorded" not in done.stderr


def test_timing_flag_is_checked_in_one_sentence(tmp_path: Path) -> None:
    prog = tmp_path / "plain.py"
    prog.write_text("x = 1\n")
    done = gputrace_run(
        "--timing", "events", "--backend", "cpu", "-o", tmp_path / "t.json", prog, cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gputrace: timing='events' chooses how the cuda backend times GPU work; the cpu backend has "
        "no such choice (leave timing as 'auto')."
    ]
    bad = gputrace_run("--timing", "fast", prog, cwd=tmp_path)
    assert bad.returncode == 2 and "fast" in bad.stderr and "Traceback" not in bad.stderr


def test_bad_schedule_is_one_sentence(tmp_path: Path) -> None:
    prog = tmp_path / "plain.py"
    prog.write_text("x = 1\n")
    done = gputrace_run("--backend", "cpu", "--schedule", "wait=1,actve=2", prog, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gputrace: unknown schedule field 'actve'; the fields are wait, warmup, active, repeat, skip_first."
    )


WGPU_NO_SCOPES = """
import wgpu

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
device = adapter.request_device_sync()
def frame():
    encoder = device.create_command_encoder()
    encoder.begin_compute_pass().end()
    device.queue.submit([encoder.finish()])
for i in range(5):
    frame()
"""


@pytest.mark.wgpu
def test_wgpu_program_without_scopes_is_told_its_passes_were_not_timed(tmp_path: Path) -> None:
    from gputrace.calibrate.on_wgpu import probe
    from gputrace.errors import GputraceError

    try:
        _, adapter = probe()
    except GputraceError as exc:
        pytest.skip(str(exc))
    if "timestamp-query" not in adapter.features:
        pytest.skip("the adapter has no timestamp-query feature")
    prog = tmp_path / "frames.py"
    prog.write_text(WGPU_NO_SCOPES)
    done = gputrace_run("--backend", "wgpu", "-o", tmp_path / "t.json", prog, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "5 wgpu passes ran outside any scope and were not timed" in done.stderr
    # what docs/webgpu.md says to do: name the function, and its passes are timed
    named = ("--trace-function", "__main__:frame")
    again = gputrace_run("--backend", "wgpu", *named, "-o", tmp_path / "u.json", prog, cwd=tmp_path)
    assert written_count(again.stderr) == 5 and "outside any scope" not in again.stderr
    frames = gputrace.load(tmp_path / "u.json").find("frame")
    assert len(frames) == 5 and all(sc.gpu_ns is not None for sc in frames)
