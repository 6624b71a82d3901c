"""The flight recorder (ring_s, SIGUSR1) and step windows (gputrace.step, steps=)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import gputrace
from gputrace.cli import cli
from gputrace.clock import FakeClock
from gputrace.errors import GputraceError
from tests.builders import child_env

ROOT = Path(__file__).resolve().parents[2]
S = 1_000_000_000


def _second(clock: FakeClock, k: int) -> None:
    """One second of the program: a scope named after it, then a sync (one chunk per second)."""
    with gputrace.trace(f"second {k}", k=k):
        clock.advance(S // 2)
    clock.advance(S // 2)
    gputrace.sync()


def test_ring_keeps_the_last_seconds_and_writes_them_on_sigusr1(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    clock = FakeClock(10 * S, 0)
    with gputrace.session(path, backend="cpu", clock=clock, quiet=True, ring_s=3, flush_s=3600) as s:
        for k in range(10):
            _second(clock, k)
        assert not path.exists()  # nothing is written until asked
        os.kill(os.getpid(), signal.SIGUSR1)  # the program goes on; a thread writes the ring
        deadline = time.monotonic() + 20
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        t = gputrace.load(path)
        assert [sc.args["k"] for sc in t] == [7, 8, 9]  # the last 3 s only
        assert t.header["ring"]["dump"] == 1 and "truncated" not in t.header
        for k in range(10, 15):  # still recording after the signal
            _second(clock, k)
    final = gputrace.load(path)  # replaced at stop with the window then
    assert [sc.args["k"] for sc in final] == [12, 13, 14]
    assert s.written == path and final.header["ring"]["dump"] == 2


def test_ring_is_written_when_the_program_raises(tmp_path: Path) -> None:
    path = tmp_path / "ring.json.gz"
    clock = FakeClock(10 * S, 0)
    with pytest.raises(ZeroDivisionError):
        with gputrace.session(path, backend="cpu", clock=clock, quiet=True, ring_s=2, flush_s=3600):
            for k in range(5):
                _second(clock, k)
            with gputrace.trace("failing"):
                _ = 1 / 0
    t = gputrace.load(path)
    assert [sc.name for sc in t] == ["second 3", "second 4", "failing"]
    assert t.find("failing")[0].args == {"exception": "ZeroDivisionError"}


def test_ring_is_written_when_the_interpreter_exits_without_stopping_it(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    code = (
        "import gputrace\n"
        f"s = gputrace.session({str(path)!r}, backend='cpu', quiet=True, ring_s=60).start()\n"
        "with gputrace.trace('kept'):\n    pass\n"
        "raise SystemExit(4)\n"
    )
    env = child_env()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 4, out.stderr
    assert [sc.name for sc in gputrace.load(path)] == ["kept"]


def test_a_ring_needs_a_path() -> None:
    with pytest.raises(gputrace.GputraceError, match="needs a path"):
        gputrace.session(backend="cpu", ring_s=5)


def test_steps_record_only_their_window(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with gputrace.session(path, backend="cpu", quiet=True, steps="3:5") as s:
        for i in range(8):
            with gputrace.trace("iteration", i=i):
                with gputrace.trace("inner"):
                    pass
            gputrace.step()
    t = gputrace.load(path)
    assert [(sc.name, sc.args.get("i")) for sc in t] == [
        ("iteration", 3), ("inner", None), ("iteration", 4), ("inner", None)
    ]  # fmt: skip
    assert [m.name for m in t.marks] == ["step 3", "window 0", "step 4"]  # the window starts at step 3
    assert s.trace is not None and len(s.trace) == 4
    gputrace.step()  # no session: nothing happens


def test_steps_from_zero_and_bad_windows() -> None:
    with gputrace.session(backend="cpu", steps=(0, 1)) as s:
        for _ in range(3):
            with gputrace.trace("it"):
                pass
            gputrace.step()
    assert s.trace is not None and len(s.trace) == 1
    for bad in ("5", "a:b", "4:2", "-1:3"):
        with pytest.raises(gputrace.GputraceError, match="steps"):
            gputrace.session(backend="cpu", steps=bad)


def test_run_with_steps_and_ring(tmp_path: Path) -> None:
    script = tmp_path / "loop.py"
    script.write_text(
        "import gputrace\n"
        "for i in range(6):\n"
        "    with gputrace.trace('it', i=i):\n        pass\n"
        "    gputrace.step()\n"
    )
    out = tmp_path / "t.json"
    res = CliRunner().invoke(cli, ["run", "-q", "-o", str(out), "--steps", "2:4", str(script)])
    assert res.exit_code == 0, res.output
    assert [sc.args["i"] for sc in gputrace.load(out)] == [2, 3]
    ring = tmp_path / "ring.json"
    res = CliRunner().invoke(cli, ["run", "-q", "-o", str(ring), "--ring", "60", str(script)])
    assert res.exit_code == 0, res.output
    t = gputrace.load(ring)
    assert [sc.args["i"] for sc in t] == list(range(6)) and t.header["ring"]["seconds"] == 60
    res = CliRunner().invoke(cli, ["run", "-o", str(ring), "--steps", "9", str(script)])
    assert res.exit_code == 2 and "steps must look like" in res.output


@pytest.mark.parametrize(
    ("steps", "said"),
    [((1, 2, 3), "must look like START:STOP"), ((5,), "must look like"), ("9", "must look like"),
     ("4:2", "holds no step")],
)  # fmt: skip
def test_steps_of_the_wrong_shape_are_one_sentence(steps: Any, said: str) -> None:
    with pytest.raises(GputraceError, match=said):
        gputrace.session(backend="cpu", quiet=True, steps=steps).start()
    assert gputrace.recorder.active_recorder() is None  # nothing left running


# step schedules (torch.profiler's wait / warmup / active / repeat) -------------------------------
def test_schedule_records_each_active_window_marked() -> None:
    clock = FakeClock(start_ns=10**9, step_ns=1_000)
    plan = gputrace.schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=2)
    with gputrace.session(backend="cpu", clock=clock, quiet=True, schedule=plan) as s:
        for i in range(14):
            with gputrace.trace("iteration", i=i):
                pass
            gputrace.step()
    t = s.trace
    assert t is not None
    assert [sc.args["i"] for sc in t] == [3, 4, 7, 8]
    windows = [(m.name, m.args) for m in t.marks if m.name.startswith("window")]
    assert windows == [("window 0", {"window": 0, "step": 3}), ("window 1", {"window": 1, "step": 7})]
    assert [m.name for m in t.marks if m.name.startswith("step")] == ["step 3", "step 4", "step 7", "step 8"]
    assert t.header["schedule"] == {
        "skip_first": 1, "wait": 1, "warmup": 1, "active": 2, "repeat": 2, "steps": 14,
        "windows": [[3, 5], [7, 9]],
    }  # fmt: skip
    # each window's scopes lie between its mark and the next step after it
    (w0, w1) = [m.ts_ns for m in t.marks if m.name.startswith("window")]
    assert all(w0 < sc.cpu_start_ns < w1 for sc in t if sc.args["i"] in (3, 4))
    assert all(sc.cpu_start_ns > w1 for sc in t if sc.args["i"] in (7, 8))


def test_schedule_without_repeat_runs_to_the_end(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with gputrace.session(path, backend="cpu", quiet=True, schedule="wait=2,active=1") as s:
        for i in range(10):
            with gputrace.trace("iteration", i=i):
                pass
            gputrace.step()
    assert s.trace is not None
    assert [sc.args["i"] for sc in s.trace] == [2, 5, 8]
    assert gputrace.load(path).header["schedule"]["windows"] == [[2, 3], [5, 6], [8, 9]]


def test_steps_is_the_one_window_schedule() -> None:
    from gputrace.flight import Schedule, parse_steps

    assert parse_steps("100:110") == Schedule(skip_first=100, active=10, repeat=1)
    assert Schedule(skip_first=100, active=10, repeat=1).windows() == [(100, 110)]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("wait=1,active=0", "active=0"),
        ("wait=-1", "looks like wait=1"),
        ("wait=1;active=2", "looks like wait=1"),
        ({"wait": 1, "cycles": 2}, "unknown schedule field 'cycles'"),
    ],
)
def test_a_bad_schedule_is_a_clear_error(spec: object, message: str) -> None:
    with pytest.raises(gputrace.GputraceError, match=message):
        gputrace.session(backend="cpu", schedule=spec)


def test_steps_and_schedule_together_are_refused() -> None:
    with pytest.raises(gputrace.GputraceError, match="not both"):
        gputrace.session(backend="cpu", steps="1:2", schedule="active=1")


@pytest.mark.parametrize(
    "args",
    [
        {"wait": 1, "warmup": 1, "active": 2, "repeat": 2},
        {"wait": 0, "warmup": 0, "active": 1, "repeat": 0},
        {"wait": 3, "warmup": 2, "active": 1, "repeat": 3, "skip_first": 4},
        {"wait": 2, "warmup": 0, "active": 3, "repeat": 0, "skip_first": 1},
    ],
)
def test_schedule_records_the_steps_torch_profiler_records(args: dict[str, int]) -> None:
    profiler = pytest.importorskip("torch.profiler")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about warmup=0
        torch_schedule = profiler.schedule(**args)
    record = {profiler.ProfilerAction.RECORD, profiler.ProfilerAction.RECORD_AND_SAVE}
    ours = gputrace.schedule(**args)
    assert [ours.window(n) is not None for n in range(60)] == [torch_schedule(n) in record for n in range(60)]
