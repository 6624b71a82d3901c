"""`gputrace calibrate`: structure and sanity of what it measures, exact maths of what it derives,
and the trip of its headline numbers into later traces. Never timing values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import gputrace
from gputrace.calibrate import Calibration, Stat, measure
from gputrace.calibrate.on_cpu import crossing, smallest_step, table, wall_per_op
from gputrace.calibrate.report import render
from gputrace.calibrate.result import FORMAT
from gputrace.calstore import ENV_VAR, default_path, header_calibration
from gputrace.cli import cli
from gputrace.clock import FakeClock


def invoke(args: list[str]) -> Any:
    """Run the CLI with stdout and stderr apart (click 8.1 needs asking; 8.2+ always does)."""
    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        runner = CliRunner()
    return runner.invoke(cli, args)


def check_sane(doc: dict[str, Any]) -> None:
    """Every statistic positive, ordered, and its median inside min..max."""
    assert doc["format"] == FORMAT and doc["measurements"]
    for m in doc["measurements"]:
        stats = [m[c] for c in ("wall", "device") if m[c] is not None]
        assert stats, m["key"]
        for s in stats:
            assert s["n"] >= 1
            assert 0 < s["min_ns"] <= s["p5_ns"] <= s["median_ns"] <= s["p95_ns"] <= s["max_ns"], m["key"]
    assert all(v > 0 for k, v in doc["summary"].items() if k != "timestamp_period")


@pytest.fixture
def calibration_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "machine-calibration.json"
    monkeypatch.setenv(ENV_VAR, str(path))
    return path


@pytest.mark.not_a_trace
def test_cpu_calibration_from_the_cli(tmp_path: Path, calibration_file: Path) -> None:
    out = tmp_path / "calib.json"
    res = invoke(["calibrate", "--backend", "cpu", "--quick", "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc == json.loads(out.read_text()) == json.loads(calibration_file.read_text())
    assert doc["backend"] == "cpu" and doc["quick"] is True
    check_sane(doc)
    keys = {m["key"] for m in doc["measurements"]}
    assert {"clock_read", "clock_step", "scope_cost_off", "scope_cost"} <= keys
    assert doc["breakeven"] == [] and doc["skipped"] == {}
    assert {"clock_resolution_ns", "scope_cost_ns"} <= set(doc["summary"])
    assert f"calibration saved to {out}" in res.stderr


@pytest.mark.not_a_trace
def test_table_lists_every_measurement(calibration_file: Path) -> None:
    res = invoke(["calibrate", "--backend", "cpu", "--quick", "--no-save"])
    assert res.exit_code == 0, res.output
    assert not calibration_file.exists()
    cal = Calibration.from_json(json.loads(json.dumps(measure("cpu", quick=True).to_json())))
    lines = res.stdout.splitlines()
    assert lines[0].startswith("gputrace calibrate · backend cpu")
    for m in cal.measurements:
        assert any(line.startswith(m.what) for line in lines), m.what


def test_cpu_calibration_roundtrips_through_json() -> None:
    cal = measure("cpu", quick=True)
    again = Calibration.from_json(json.loads(json.dumps(cal.to_json())))
    assert again.to_json() == cal.to_json()
    assert render(again) == render(cal)


def test_a_group_that_fails_is_said_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrace.calibrate import on_cpu

    def broken_clock(run: Any, batches: int) -> None:
        raise OSError("clock unreadable")

    monkeypatch.setattr(on_cpu, "clock", broken_clock)
    cal = measure("cpu", quick=True)
    assert cal.skipped == {"clock": "OSError: clock unreadable"}
    assert cal.get("clock_read") is None and cal.get("scope_cost") is not None
    assert "clock_resolution_ns" not in cal.summary and "scope_cost_ns" in cal.summary
    assert render(cal).endswith("not measured:\n  clock: OSError: clock unreadable")


def test_unknown_or_unusable_backend_is_one_sentence_and_exit_2() -> None:
    res = invoke(["calibrate", "--backend", "tpu"])
    assert res.exit_code == 2
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    res = invoke(["calibrate", "--backend", "cuda", "--no-save"])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("gputrace: CUDA calibration needs CuPy")


def test_stat_is_numpy_percentiles() -> None:
    s = Stat.of([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (s.n, s.median, s.min, s.max) == (5, 3.0, 1.0, 5.0)
    assert s.p5 == pytest.approx(1.2) and s.p95 == pytest.approx(4.8)
    assert Stat.from_json(s.to_json()) == s
    with pytest.raises(ValueError):
        Stat.of([])


def test_a_stat_is_kept_at_the_precision_it_is_saved_with() -> None:
    """A measured 40.3499999 ns printed 40.3 but was saved as 40.35, which printed 40.4: the
    calibration read back differed from the one shown (seen as a flaky round-trip test)."""
    s = Stat.of([40.3499999999, 40.3499999999])
    assert s.median == 40.35
    assert Stat.from_json(json.loads(json.dumps(s.to_json()))) == s


def test_wall_per_op_divides_each_batch_by_its_length() -> None:
    clock = FakeClock(start_ns=0, step_ns=1000)  # two reads per batch: 1000 ns apart
    calls = []
    samples = wall_per_op(lambda: calls.append(1), batches=3, per_batch=4, warmup=2, clock=clock)
    assert samples == [250.0, 250.0, 250.0] and len(calls) == 2 + 3 * 4


def test_smallest_step_is_the_timer_resolution() -> None:
    assert smallest_step([0.0, 64.0, 32.0, 128.0]) == 32.0
    assert smallest_step([7.0]) is None


def test_crossing_interpolates_in_log_log() -> None:
    assert crossing([100, 10_000], [1e3, 1e5], [1e4, 1e4]) == (1000, False)
    assert crossing([100, 10_000], [1e3, 1e5], [1e2, 1e6]) == (100, True)
    assert crossing([100, 10_000], [1e3, 1e5], [1e4, 1e6]) == (None, False)
    assert crossing([], [], []) == (None, False)


def test_breakeven_table_scales_the_cpu_pass_by_the_intensity() -> None:
    sizes = [100, 10_000]
    rows, curves = table(sizes, [1e3, 1e5], {1: [1e4, 1e4], 10: [5e3, 5e3]}, {1: [1e6, 1e6]})
    assert [(r.ops_per_element, r.resident, r.with_copies) for r in rows] == [
        (1, 1000, None),
        (10, 100, None),
    ]
    assert rows[1].resident_below_grid and not rows[0].resident_below_grid
    assert curves["ops10"]["cpu_ns"] == [1e4, 1e6] and curves["ops10"]["gpu_with_copies_ns"] is None


def test_default_path_is_per_machine_and_backend() -> None:
    env = {"XDG_CACHE_HOME": "/cache"}
    assert default_path("wgpu", host="gpu box/1", env=env) == Path(
        "/cache/gputrace/calibration-gpu_box_1-wgpu.json"
    )
    assert default_path("wgpu", env={ENV_VAR: "/x/c.json", **env}) == Path("/x/c.json")


def _calibration_doc(backend: str) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "backend": backend,
        "device": "GPU 0",
        "created": "2026-11-29T00:00:00+00:00",
        "summary": {"launch_cpu_ns": 6900.0, "launch_gpu_ns": 1300.0, "h2d_1k_ns": 8300.0, "other": 1.0},
    }


def test_later_sessions_record_the_calibration_of_their_backend(
    tmp_path: Path, calibration_file: Path
) -> None:
    calibration_file.write_text(json.dumps(_calibration_doc("fake")))
    with gputrace.session(tmp_path / "t.json", backend="fake") as s:
        with gputrace.trace("step"):
            pass
    expected = {
        "backend": "fake",
        "launch_cpu_ns": 6900.0,
        "launch_gpu_ns": 1300.0,
        "h2d_1k_ns": 8300.0,
        "device": "GPU 0",
        "created": "2026-11-29T00:00:00+00:00",
        "source": str(calibration_file),
    }
    assert s.trace is not None and s.trace.header["calibration"] == expected
    assert gputrace.load(tmp_path / "t.json").header["calibration"] == expected


@pytest.mark.parametrize(
    "content",
    [
        "{broken",
        json.dumps(_calibration_doc("cuda")),
        json.dumps([1, 2]),
        json.dumps({**_calibration_doc("fake"), "summary": {"launch_cpu_ns": 1}}),
    ],
)
def test_a_foreign_or_broken_calibration_is_ignored_quietly(calibration_file: Path, content: str) -> None:
    calibration_file.write_text(content)
    assert header_calibration("fake") is None
    with gputrace.session(backend="fake") as s:  # filterwarnings=error: no warning either
        pass
    assert s.trace is not None and "calibration" not in s.trace.header


@pytest.mark.wgpu
@pytest.mark.not_a_trace
def test_wgpu_calibration_on_a_real_adapter(calibration_file: Path) -> None:
    from gputrace.calibrate import on_wgpu
    from gputrace.errors import GputraceError

    try:
        on_wgpu.probe()
    except GputraceError as exc:
        pytest.skip(str(exc))
    cal = measure("wgpu", quick=True)
    doc = cal.to_json()
    check_sane(doc)
    assert cal.skipped == {}
    assert {"submit", "launch_cpu", "launch_sync", "wait", "pass_empty", "launch", "h2d_1k", "d2h_1k"} <= {
        m.key for m in cal.measurements
    }
    assert [b.ops_per_element for b in cal.breakeven] == [1, 10, 1000]
    for b in cal.breakeven:
        for n in (b.resident, b.with_copies):
            assert n is None or cal.curves["elements"][0] <= n <= cal.curves["elements"][-1]
    assert cal.summary["timestamp_period"] > 0
    assert header_calibration("wgpu") is None  # measure() itself saves nothing


@pytest.mark.gpu
@pytest.mark.not_a_trace
def test_cuda_calibration_on_a_real_gpu(calibration_file: Path) -> None:
    from gputrace.calibrate import on_cuda
    from gputrace.errors import GputraceError

    try:
        on_cuda.probe()
    except GputraceError as exc:
        pytest.skip(str(exc))
    res = invoke(["calibrate", "--backend", "cuda", "--quick", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    check_sane(doc)
    assert doc["skipped"] == {}
    keys = {m["key"] for m in doc["measurements"]}
    assert {
        "first_context",
        "launch",
        "launch_sync",
        "grid_16384",
        "graph_kernel",
        "event_pair",
        "h2d_1k_pageable",
        "d2h_large_pinned",
    } <= keys
    assert header_calibration("cuda") is not None  # saved to GPUTRACE_CALIBRATION, read back
