"""gputrace diff: verdicts against the noise of both runs, names on one side only, CI exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import gputrace
from gputrace.cli import cli
from gputrace.clock import FakeClock
from gputrace.compare import SCHEMA, diff

DATA = Path(__file__).parents[1] / "data"
A, B = str(DATA / "before.json"), str(DATA / "after.json")


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in result["rows"]}


def test_golden_verdicts_and_numbers() -> None:
    res = diff(gputrace.load(A), gputrace.load(B))
    rows = by_name(res)
    assert {n: r["verdict"] for n, r in rows.items()} == {
        "conv": "slower", "relu": "within noise", "old": "only in A", "new": "only in B"}  # fmt: skip
    conv_a = [20_000 + (i % 3) * 100 for i in range(1, 8)]  # the script, warm calls only
    conv_b = [30_000 + (i % 3) * 100 for i in range(1, 8)]
    c = rows["conv"]
    assert c["metric"] == "gpu" and (c["calls_a"], c["calls_b"]) == (7, 7)
    assert c["median_a_ns"] == np.median(conv_a) and c["median_b_ns"] == np.median(conv_b)
    assert c["change_ns"] == 10_000 and c["change_pct"] == pytest.approx(100 * 10_000 / np.median(conv_a))
    q1, q3 = np.percentile(conv_a, [25, 75])
    assert c["iqr_a_ns"] == q3 - q1 and c["exceeds_noise"] is True
    relu_a = [5_000 + (i % 4) * 200 for i in range(1, 8)]
    relu_b = [5_100 + ((i + 1) % 4) * 200 for i in range(1, 8)]
    r = rows["relu"]
    assert r["change_ns"] == np.median(relu_b) - np.median(relu_a) == 100
    assert r["exceeds_noise"] is False
    assert rows["old"]["median_b_ns"] is None and rows["new"]["calls_a"] is None
    assert res["schema"] == SCHEMA and res["regressions"] == []
    # B against A the other way round: conv got faster
    assert by_name(diff(gputrace.load(B), gputrace.load(A)))["conv"]["verdict"] == "faster"


def test_fail_above_threshold() -> None:
    a, b = gputrace.load(A), gputrace.load(B)
    assert diff(a, b, fail_above_pct=10)["regressions"] == ["conv"]
    assert diff(a, b, fail_above_pct=60)["regressions"] == []  # conv is +49.8 %
    assert diff(a, b, fail_above_pct=0)["regressions"] == ["conv"]  # relu is within noise


def test_cli_exit_codes_and_formats() -> None:
    run = CliRunner().invoke
    assert run(cli, ["diff", A, B]).exit_code == 0
    failed = run(cli, ["diff", A, B, "--fail-above", "10"])
    assert failed.exit_code == 1 and "FAIL" in failed.output and "conv" in failed.output
    ok = run(cli, ["diff", A, B, "--fail-above", "60"])
    assert ok.exit_code == 0 and "OK: nothing slower" in ok.output
    js = orjson.loads(run(cli, ["diff", A, B, "-f", "json"]).output)
    assert js["schema"] == SCHEMA and js["a"] == A and len(js["rows"]) == 4
    md = run(cli, ["diff", A, B, "-f", "markdown"]).output
    assert "| name | metric |" in md and "+49.8%" in md
    bad = run(cli, ["diff", A, str(DATA / "missing.json")])
    assert bad.exit_code == 2 and "missing.json: no such file" in bad.output


def _run(script_us: list[int], *, gpu: bool = True) -> gputrace.Trace:
    clock = FakeClock(0, 0)
    backend = "fake" if gpu else "cpu"
    opts = {"script": lambda n, i: (1_000, script_us[i] * 1_000)} if gpu else None
    with gputrace.session(backend=backend, clock=clock, quiet=True, backend_options=opts) as s:
        for us in script_us:
            with gputrace.trace("k"):
                clock.advance(us * 1_000 if not gpu else 1_000)
            clock.advance(100_000)
    assert s.trace is not None
    return s.trace


def test_few_calls_and_cpu_only_comparisons() -> None:
    few = by_name(diff(_run([5, 10, 10]), _run([5, 20, 20])))["k"]
    assert few["verdict"] == "too few calls" and few["change_pct"] == 100.0
    cpu = by_name(diff(_run([5, 10, 10, 10, 10], gpu=False), _run([5, 20, 20, 20, 20], gpu=False)))["k"]
    assert cpu["metric"] == "cpu" and cpu["verdict"] == "slower" and cpu["change_ns"] == 10_000
    mixed = by_name(diff(_run([5, 10, 10, 10]), _run([5, 10, 10, 10], gpu=False)))["k"]
    assert mixed["verdict"] == "not comparable"
