"""gputrace summarize: exact numbers on golden traces, every output format, filters, foreign traces."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import gputrace
from gputrace.cli import cli
from gputrace.clock import FakeClock
from gputrace.model import NO_TIME
from gputrace.render import human_ns, render
from gputrace.summary import SCHEMA, summarize
from tests.data.make_golden import MATMUL_US

DATA = Path(__file__).parents[1] / "data"


def row(summary: dict[str, Any], name: str, queue: str | None = "any") -> dict[str, Any]:
    hits = [r for r in summary["rows"] if r["name"] == name and (queue == "any" or r["queue"] == queue)]
    assert len(hits) == 1, hits
    return hits[0]


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


# --- exact numbers -----------------------------------------------------------------------------


def test_handmade_numbers() -> None:
    s = summarize(gputrace.load(DATA / "handmade.json"))
    assert s["schema"] == SCHEMA and s["scopes"] == 6 and s["session_ns"] == 600_000
    a = row(s, "a")
    assert (a["calls"], a["warm_calls"], a["timed_calls"]) == (4, 3, 3)
    assert a["cold"] == {"cpu_ns": 5_000, "gpu_ns": 50_000, "queue_gap_ns": 9_000}
    assert a["gpu_ns"] == {"median": 33_000.0, "p95": float(np.percentile([30, 36, 33], 95) * 1000),
                           "min": 30_000, "max": 36_000, "total": 149_000}  # fmt: skip
    assert a["cpu_ns"] == {"median": 5_000.0, "p95": 5_000.0, "total": 20_000}
    assert a["queue_gap_ns"] == {"median": 19_000.0, "p95": 19_000.0}  # gaps 14, 19, 19 µs
    assert a["gpu_over_cpu"] == 33_000 / 5_000
    assert a["spread"] == pytest.approx((34_500 - 31_500) / 33_000)
    assert a["gpu_share"] == 1.0 and a["launch_bound"] is None and a["device"] == 0
    b = row(s, "b")
    assert (
        b["queue"] is None
        and b["gpu_ns"] is None
        and b["cold"] == {"cpu_ns": 7_000, "gpu_ns": None, "queue_gap_ns": None}
    )
    assert b["cpu_ns"]["median"] == 9_000.0 and b["cpu_ns"]["total"] == 16_000
    # idle: busy 149 µs of a 343 µs window; gaps 70→125 (submitted 111), 155→230 (211), 266→330
    # (311): each gap's next work was submitted after the gap opened, so the whole of each gap is
    # waiting for the host (HTA's rule: the GPU had nothing queued when it went idle)
    assert s["idle"] == [{
        "device": 0, "device_name": "Hand GPU", "queue": "stream 0", "window_ns": 343_000,
        "busy_ns": 149_000, "idle_ns": 194_000, "waiting_for_host_ns": 55_000 + 75_000 + 64_000,
        "between_queued_work_ns": 0, "unknown_ns": 0, "from": "spans",
    }]  # fmt: skip
    assert s["gpu_busy_ns"] == 149_000
    assert s["clock"]["max_uncertainty_ns"] == 500 and s["clock"]["devices"][0]["samples"] == 2
    assert s["host"]["high"] is True and "load 2.50 on 2 CPUs" in s["host"]["note"]
    assert s["anomalies"] == []


def test_story_numbers_match_the_script() -> None:
    trace = gputrace.load(DATA / "story.json")
    s = summarize(trace)
    assert [r["name"] for r in s["rows"]] == ["matmul", "copy", "noop", "step"]  # by GPU busy
    m = row(s, "matmul")
    warm = np.array(MATMUL_US[1:]) * 1_000
    assert m["cold"] == {"cpu_ns": 3_000, "gpu_ns": MATMUL_US[0] * 1_000, "queue_gap_ns": 5_000}
    assert m["gpu_ns"] == {"median": float(np.median(warm)), "p95": float(np.percentile(warm, 95)),
                           "min": int(warm.min()), "max": int(warm.max()),
                           "total": sum(MATMUL_US) * 1_000}  # fmt: skip
    assert m["outliers"] == 1 and m["flags"] == {"cold": 1, "outlier": 1}
    # 5 µs after submission, except behind the 200 µs outlier: 98 µs, then 11 µs
    gaps = [5_000] * 4 + [5_000, 98_000, 11_000]
    assert m["queue_gap_ns"] == {"median": float(np.median(gaps)), "p95": float(np.percentile(gaps, 95))}
    assert m["cpu_ns"]["median"] == 3_000 and m["gpu_over_cpu"] == np.median(warm) / 3_000
    q1, q3 = np.percentile(warm, [25, 75])
    assert m["spread"] == pytest.approx((q3 - q1) / np.median(warm)) and not m["noisy"]
    c = row(s, "copy")
    assert c["queue"] == "stream copy" and c["gpu_ns"]["median"] == 4_000 and c["gpu_ns"]["total"] == 32_000
    assert c["queue_gap_ns"]["median"] == 2_000
    noop = row(s, "noop")
    assert noop["empty"] == 1 and noop["gpu_ns"] is None and noop["cold"]["gpu_ns"] is None
    step = row(s, "step")
    assert step["queue"] is None and step["untimed"] == 8 and step["cpu_ns"]["median"] == 7_000
    assert s["gpu_busy_ns"] == (sum(MATMUL_US) + 8 * 4) * 1_000  # noop's span is empty
    assert m["gpu_share"] == 1.0 and c["gpu_share"] == 1.0  # each alone on its stream
    assert m["gpu_busy_ns"] == {"median": float(np.median(warm)), "total": sum(MATMUL_US) * 1_000}
    kinds = {(a["kind"], a["name"]): a for a in s["anomalies"]}
    assert set(kinds) == {("outlier", "matmul"), ("empty_gpu_span", "noop")}
    ex = kinds[("outlier", "matmul")]["examples"]
    assert [e["gpu_ns"] for e in ex] == [200_000] and "what_to_do" in kinds[("outlier", "matmul")]
    assert s["host"]["high"] is False and s["calibration"] is None


def _idle_reference(trace: gputrace.Trace, qi: int) -> tuple[int, int, int]:
    """A plain-Python reading of the idle-time rule, to hold the vectorised one to."""
    sc = [x for x in trace if x.queue is not None and x.gpu_start_ns is not None
          and trace.queues.index(x.queue) == qi]  # fmt: skip
    sc.sort(key=lambda x: (x.gpu_start_ns, -(x.gpu_end_ns or 0)))
    busy_end = None
    host = queued = busy = 0
    for x in sc:
        assert x.gpu_start_ns is not None and x.gpu_end_ns is not None and x.submit_ns is not None
        if busy_end is None or x.gpu_start_ns > busy_end:
            if busy_end is not None:  # HTA's rule: submitted after the GPU went idle
                if x.submit_ns > busy_end:
                    host += x.gpu_start_ns - busy_end
                else:
                    queued += x.gpu_start_ns - busy_end
            busy += x.gpu_end_ns - x.gpu_start_ns
            busy_end = x.gpu_end_ns
        elif x.gpu_end_ns > busy_end:
            busy += x.gpu_end_ns - busy_end
            busy_end = x.gpu_end_ns
    return busy, host, queued


@pytest.mark.parametrize("name", ["story.json", "handmade.json"])
def test_idle_time_matches_a_plain_reading(name: str) -> None:
    trace = gputrace.load(DATA / name)
    for qi, q in enumerate(summarize(trace)["idle"]):
        busy, host, queued = _idle_reference(trace, qi)
        assert (q["busy_ns"], q["waiting_for_host_ns"], q["between_queued_work_ns"]) == (busy, host, queued)
        assert q["idle_ns"] == q["waiting_for_host_ns"] + q["between_queued_work_ns"] + q["unknown_ns"]


def test_launch_bound_only_with_calibration() -> None:
    trace = gputrace.load(DATA / "story_calibrated.json")
    s = summarize(trace)
    # one launch costs the CPU 2.5 µs: copy's 4 µs and matmul's 21 µs per launch are longer
    assert row(s, "copy")["launch_bound"] is False and row(s, "matmul")["launch_bound"] is False
    assert row(s, "step")["launch_bound"] is None  # no GPU time: nothing to say
    trace.header["calibration"]["launch_cpu_ns"] = 5_000.0  # now copy's 4 µs is the shorter
    s = summarize(trace)
    assert row(s, "copy")["launch_bound"] is True and row(s, "matmul")["launch_bound"] is False
    assert [a["name"] for a in s["anomalies"] if a["kind"] == "launch_bound"] == ["copy"]
    assert "launch-bound" in render(s, "table")
    plain = summarize(gputrace.load(DATA / "story.json"))
    assert all(r["launch_bound"] is None for r in plain["rows"])
    assert "launch-bound" not in render(plain, "table") and "launch_bound" not in render(plain, "table")


def test_another_backends_calibration_says_nothing() -> None:
    trace = gputrace.load(DATA / "story_calibrated.json")
    trace.header["calibration"].update(backend="cuda", launch_cpu_ns=5_000.0)  # a fake-GPU trace
    assert all(r["launch_bound"] is None for r in summarize(trace)["rows"])


def test_noisy_names_are_flagged() -> None:
    times = [10, 10, 30, 10, 30, 10, 30]  # warm: IQR 20 µs, median 20 µs
    clock = FakeClock(0, 0)
    opts = {"script": lambda n, i: (0, times[i] * 1_000)}
    with gputrace.session(backend="fake", clock=clock, quiet=True, backend_options=opts) as sess:
        for _ in times:
            with gputrace.trace("jittery"):
                clock.advance(1_000)
            clock.advance(100_000)
    s = summarize(sess.trace)  # type: ignore[arg-type]
    r = row(s, "jittery")
    q1, med, q3 = np.percentile(times[1:], [25, 50, 75])
    assert r["noisy"] and r["spread"] == pytest.approx((q3 - q1) / med) == 1.0
    assert [a["kind"] for a in s["anomalies"]] == ["noisy"] and "noisy" in render(s, "table")


# --- filters, formats --------------------------------------------------------------------------


def test_sort_top_and_name_filters() -> None:
    t = gputrace.load(DATA / "story.json")
    assert [r["name"] for r in summarize(t, sort="name")["rows"]] == ["copy", "matmul", "noop", "step"]
    assert [r["name"] for r in summarize(t, sort="cpu_median", top=2)["rows"]] == ["step", "matmul"]
    assert [r["name"] for r in summarize(t, sort="calls")["rows"]] == ["copy", "matmul", "step", "noop"]
    s = summarize(t, name="mat*")
    assert [r["name"] for r in s["rows"]] == ["matmul"] and {a["name"] for a in s["anomalies"]} == {"matmul"}
    assert [r["name"] for r in summarize(t, name="noo")["rows"]] == ["noop"]  # substring
    with pytest.raises(ValueError, match="unknown sort key"):
        summarize(t, sort="nope")


def test_human_units() -> None:
    assert [human_ns(x) for x in (0, 999, 1_000, 33_000, 147_100.5, 2_500_000, 3e9, None)] == [
        "0 ns", "999 ns", "1.00 µs", "33.0 µs", "147 µs", "2.50 ms", "3.00 s", "—"]  # fmt: skip


def test_every_format_from_the_cli() -> None:
    path = str(DATA / "handmade.json")
    res = run_cli("summarize", path, "--format", "json")
    assert res.exit_code == 0, res.output
    doc = orjson.loads(res.output)
    assert doc == orjson.loads(orjson.dumps(summarize(gputrace.load(path), file=path)))
    assert list(doc) == sorted(doc)  # stable key order
    table = run_cli("summarize", path).output
    assert "33.0 µs" in table and "50.0 µs" in table and "WARNING: the host was busy" in table
    assert table.index("GPU idle time per stream") < table.index("Anomalies") < table.index("Clock")
    md = run_cli("summarize", path, "-f", "markdown").output
    assert "| name | stream | calls |" in md and "\n|---|---|--:|" in md and "### Host load" in md
    rows = list(csv.DictReader(io.StringIO(run_cli("summarize", path, "-f", "csv").output)))
    assert [r["name"] for r in rows] == ["a", "b"]
    assert rows[0]["gpu_median_ns"] == "33000.0" and rows[0]["gpu_total_ns"] == "149000"
    assert rows[1]["gpu_median_ns"] == "" and rows[1]["cold_cpu_ns"] == "7000"


def test_cli_filters_and_bad_option() -> None:
    path = str(DATA / "story.json")
    out = run_cli("summarize", path, "--sort", "name", "--top", "1", "-f", "csv").output
    assert [r["name"] for r in csv.DictReader(io.StringIO(out))] == ["copy"]
    res = run_cli("summarize", path, "--sort", "bogus")
    assert res.exit_code == 2


# --- other sources -----------------------------------------------------------------------------


def test_pytorch_profiler_trace_is_read_as_cpu_and_gpu_slices() -> None:
    res = run_cli("summarize", str(DATA / "pytorch.json"), "-f", "json")
    assert res.exit_code == 0, res.output
    s = orjson.loads(res.output)
    assert s["source"] == "chrome" and "not written by gputrace" in s["note"]
    k = row(s, "sgemm")
    assert k["cold"] == {
        "cpu_ns": 6_000,
        "gpu_ns": 40_000,
        "queue_gap_ns": 10_000,
    }  # its cudaLaunchKernel is the window
    assert k["gpu_ns"]["median"] == 44_000 and k["queue_gap_ns"]["median"] == 16_000
    assert k["cpu_ns"]["median"] == 5_000 and k["queue"] == "stream 7"
    assert row(s, "aten::mm")["queue"] is None and row(s, "Memcpy DtoH")["gpu_ns"]["total"] == 3_000
    assert s["idle"][0]["unknown_ns"] == 6_000  # the memcpy has no launch to say why
    table = run_cli("summarize", str(DATA / "pytorch.json")).output
    assert "was not written by gputrace" in table


def test_cpu_only_and_empty_traces(tmp_path: Path) -> None:
    with gputrace.session(tmp_path / "cpu.json", backend="cpu", quiet=True):
        for _ in range(3):
            with gputrace.trace("host_work"):
                pass
    s = summarize(gputrace.load(tmp_path / "cpu.json"))
    assert row(s, "host_work")["gpu_ns"] is None and s["idle"] == [] and s["gpu_busy_ns"] == 0
    assert "no GPU times" in s["clock"]["note"]
    with gputrace.session(tmp_path / "empty.json", backend="cpu", quiet=True):
        pass
    res = run_cli("summarize", str(tmp_path / "empty.json"))
    assert res.exit_code == 0 and "(no scopes match)" in res.output


def test_load_reports_progress_stages() -> None:
    stages: list[str] = []
    gputrace.load(DATA / "story.json", progress=stages.append)
    assert stages == ["read", "parsed", "built"]


def test_untimed_scope_has_no_gpu_columns() -> None:
    t = gputrace.load(DATA / "story.json")
    steps = t.find("step")
    assert (
        all(x.gpu_start_ns is None for x in steps) and (t.scopes.gpu_start_ns != NO_TIME).sum() == 17
    )  # with noop


def test_progress_bar_only_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    from gputrace.commands import _common

    monkeypatch.setattr(_common, "PROGRESS_MIN_BYTES", 0)
    _common.load_any(str(DATA / "story.json"))
    assert "loading" not in capsys.readouterr().err  # captured stderr is not a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    _common.load_any(str(DATA / "story.json"))
    assert f"loading {DATA / 'story.json'}" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["summary", "render", "compare", "merge", "exporters.reader", "exporters"])
def test_docstring_examples(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import doctest
    import importlib

    monkeypatch.delenv("RANK", raising=False)
    result = doctest.testmod(importlib.import_module(f"gputrace.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_summary_of_the_file_equals_summary_of_the_session(tmp_path: Path) -> None:
    from tests.data.make_golden import story

    trace = story()
    path = tmp_path / "story.json.gz"
    from gputrace.exporters.json import write

    write(trace, path)
    assert summarize(gputrace.load(path)) == summarize(trace)
