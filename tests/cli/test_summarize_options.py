"""gputrace summarize: default order, --top on every section, --group, host of foreign traces,
no made-up precision in the anomaly lines."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import gputrace
from gputrace.cli import cli
from gputrace.clock import FakeClock
from gputrace.exporters.reader import from_chrome
from gputrace.render import render
from gputrace.summary import summarize

DATA = Path(__file__).parents[1] / "data"


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args))


def cpu_trace(tmp_path: Path, calls: dict[str, int]) -> Path:
    path = tmp_path / "cpu.json"
    with gputrace.session(path, backend="cpu", clock=FakeClock(0, 1_000), quiet=True):
        for name, n in calls.items():
            for _ in range(n):
                with gputrace.trace(name):
                    pass
    return path


def test_default_order_is_gpu_busy_else_cpu_total(tmp_path: Path) -> None:
    path = cpu_trace(tmp_path, {"alpha": 1, "beta": 3, "gamma": 2})
    s = summarize(gputrace.load(path))
    assert s["sort"] == "cpu_total"
    assert [r["name"] for r in s["rows"]] == ["beta", "gamma", "alpha"]  # not alphabetical
    out = run_cli("summarize", str(path), "-f", "csv").output
    assert [line.split(",")[0] for line in out.splitlines()[1:]] == ["beta", "gamma", "alpha"]
    story = summarize(gputrace.load(DATA / "story.json"))
    assert story["sort"] == "busy_total" and story["rows"][0]["name"] == "matmul"
    assert summarize(gputrace.load(path), sort="name")["sort"] == "name"


def test_top_limits_every_section() -> None:
    t = gputrace.load(DATA / "story.json")
    full = summarize(t)
    assert len(full["anomalies"]) == 2 and len(full["idle"]) == 2 and len(full["rows"]) > 1
    one = summarize(t, top=1)
    assert len(one["rows"]) == len(one["anomalies"]) == len(one["idle"]) == 1
    assert one["anomalies"] == full["anomalies"][:1] and one["idle"] == full["idle"][:1]
    table = run_cli("summarize", str(DATA / "story.json"), "--top", "1").output
    assert table.count("what to do") + table.count(": no GPU work") <= 1
    assert sum(line.startswith("  GPU ") and "idle" in line for line in table.splitlines()) == 1


def test_group_folds_trailing_numbers(tmp_path: Path) -> None:
    path = tmp_path / "steps.json"
    with gputrace.session(path, backend="cpu", clock=FakeClock(0, 1_000), quiet=True):
        for i in range(5):
            with gputrace.trace(f"ProfilerStep#{i + 10}"):
                with gputrace.trace("layer3"):
                    pass
    t = gputrace.load(path)
    assert len(summarize(t)["rows"]) == 6
    s = summarize(t, group=True)
    assert s["group"] is True and summarize(t)["group"] is False
    step = next(r for r in s["rows"] if r["name"] == "ProfilerStep#*")
    assert step["calls"] == 5 and step["warm_calls"] == 4 and step["cold"] is not None
    assert {r["name"] for r in s["rows"]} == {"ProfilerStep#*", "layer*"}
    out = run_cli("summarize", str(path), "--group", "-f", "csv").output
    assert sum(line.startswith("ProfilerStep#*,") for line in out.splitlines()) == 1
    assert len(t.names) == len(gputrace.load(path).names)  # the loaded trace itself is unchanged


def test_host_of_a_pytorch_trace(tmp_path: Path) -> None:
    doc = json.loads((DATA / "pytorch.json").read_text())
    doc["host_name"] = "node-7"
    assert summarize(from_chrome(doc, "t.json"))["host"]["name"] == "node-7"
    path = tmp_path / "torch.json"
    path.write_text(json.dumps(doc))
    assert "node-7, ? CPUs" in run_cli("summarize", str(path)).output
    assert (
        summarize(from_chrome(json.loads((DATA / "pytorch.json").read_text()), "t"))["host"]["name"] is None
    )


def test_no_uncertainty_is_printed_when_there_is_none() -> None:
    s = summarize(gputrace.load(DATA / "story.json"))
    assert "±1 ns" in render(s, "table")  # the golden trace's examples carry 1 ns
    for unc in (0, None):
        s2 = copy.deepcopy(s)
        for a in s2["anomalies"]:
            for ex in a["examples"]:
                ex["uncertainty_ns"] = unc
        for fmt in ("table", "markdown"):
            text = render(s2, fmt)
            assert "±0 ns" not in text and "±—" not in text and "scope " in text


def test_a_note_names_the_file_as_safe_text(tmp_path: Path) -> None:
    """The notes summarize prints name the file as the table does: control characters in its
    name reach the terminal escaped."""
    live = tmp_path / "live.json"
    odd = tmp_path / "odd\x07\rname.json"
    with gputrace.session(live, backend="cpu", quiet=True) as s:
        with gputrace.trace("a"):
            pass
        s.sync()  # a chunk reaches the file; the session has not ended it yet
        odd.write_bytes(live.read_bytes())
    res = CliRunner().invoke(cli, ["summarize", str(odd)])
    assert res.exit_code == 0, res.output
    assert "ends early" in res.output and "\r" not in res.output and "\x07" not in res.output
