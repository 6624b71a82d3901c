"""The JSON header's anomaly examples: one that only repeats its scope is written as the scope and
its kinds, and every reader makes it whole again (docs/output.md, Lean JSON)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

import gputrace
from gputrace.exporters.chrome import anomaly_example
from gputrace.flags import EXPLAIN
from tests.test_exporter import gpu_session


def record(path: Path, across_sync: bool = True) -> gputrace.Trace:
    """Empty GPU spans ("noop"), the first one open across a sync, so the file holds it after
    scopes that started later (a streamed file's scopes come in the order they ended)."""
    s, clock = gpu_session(path, lambda n, i: (2_000, 0 if n == "noop" else 10_000))
    with s:
        with gputrace.trace("noop" if across_sync else "outer"):
            for _ in range(3):
                with gputrace.trace("work"):
                    clock.advance(1_000)
            gputrace.sync()
            clock.advance(7_000)
        for _ in range(2):
            with gputrace.trace("noop"):
                clock.advance(3_000)
    assert s.trace is not None
    return s.trace


def header_of(path: Path) -> dict:  # type: ignore[type-arg]
    return orjson.loads(path.read_bytes())["gputrace"]  # type: ignore[no-any-return]


def whole_examples(trace: gputrace.Trace) -> list[dict]:  # type: ignore[type-arg]
    """The examples as the trace itself gives them (each scope found by its name and start)."""
    out = []
    for it in trace.header["anomalies"]["items"]:
        row = next(
            r for r in range(len(trace))
            if trace.scope(r).name == it["name"] and trace.scope(r).cpu_start_ns == it["cpu_start_ns"]
        )  # fmt: skip
        out.append(dict(anomaly_example(trace, row, it["kinds"]), scope=it["scope"]))
    return out


@pytest.mark.parametrize("name", ["t.json", "t.json.gz", "t.pftrace"])
def test_a_streamed_files_examples_are_their_scope_and_kinds_and_read_whole(
    tmp_path: Path, name: str
) -> None:
    path = tmp_path / name
    record(path)
    if name == "t.json":
        items = header_of(path)["anomalies"]["items"]
        assert items == [{"scope": k, "kinds": ["empty_gpu_span"]} for k in (3, 4, 5)]  # in file order
    back = gputrace.load(path)
    got = back.header["anomalies"]["items"]
    assert [it["name"] for it in got] == ["noop"] * 3
    assert got[0]["cpu_ns"] > got[1]["cpu_ns"] == got[2]["cpu_ns"]  # the first is the one across the sync
    assert all(it["gpu_ns"] == 0 and it["explain"] == [EXPLAIN["empty_gpu_span"]] for it in got)
    assert got == whole_examples(back)


def test_a_whole_file_writes_and_reads_them_the_same(tmp_path: Path) -> None:
    trace = gputrace.load(record(tmp_path / "t.json", across_sync=False) and tmp_path / "t.json")
    again = gputrace.exporters.write(trace, tmp_path / "again.json")
    assert all(set(it) == {"scope", "kinds"} for it in header_of(again)["anomalies"]["items"])
    assert gputrace.load(again).header["anomalies"] == trace.header["anomalies"]
    gz = gputrace.exporters.write(trace, tmp_path / "again.json.gz")
    assert gputrace.load(gz).header["anomalies"] == trace.header["anomalies"]


def test_an_example_that_says_more_than_its_scope_is_kept_whole(tmp_path: Path) -> None:
    trace = gputrace.load(record(tmp_path / "t.json", across_sync=False) and tmp_path / "t.json")
    items = trace.header["anomalies"]["items"]
    items[0] = dict(items[0], cpu_ns=items[0]["cpu_ns"] + 1)
    again = gputrace.exporters.write(trace, tmp_path / "again.json")
    written = header_of(again)["anomalies"]["items"]
    assert written[0]["cpu_ns"] == items[0]["cpu_ns"] and set(written[1]) == {"scope", "kinds"}
    assert gputrace.load(again).header["anomalies"] == trace.header["anomalies"]


def test_older_files_with_whole_examples_read_as_written(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    record(path)
    whole = gputrace.load(path).header["anomalies"]
    doc = orjson.loads(path.read_bytes())
    doc["gputrace"]["anomalies"] = whole
    old = tmp_path / "old.json"
    old.write_bytes(orjson.dumps(doc))
    assert gputrace.load(old).header["anomalies"] == whole


def test_the_threads_and_queues_are_listed_by_the_name_events_only(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    trace = record(path)
    assert "threads" not in header_of(path) and "queues" not in header_of(path)
    back = gputrace.load(path)
    assert back.threads == trace.threads and back.queues == trace.queues
    assert back.header["threads"] == [{"tid": t.tid, "name": t.name} for t in trace.threads]
    whole = gputrace.exporters.write(back, tmp_path / "whole.json")
    assert "threads" not in header_of(whole)
    assert gputrace.load(whole).header["queues"] == back.header["queues"]


def test_threads_the_name_events_cannot_say_stay_in_the_header(tmp_path: Path) -> None:
    from gputrace.model import ThreadInfo

    trace = gputrace.load(record(tmp_path / "t.json") and tmp_path / "t.json")
    # one tid listed twice (a name event per tid says only one of them)
    trace.threads = [*trace.threads, ThreadInfo(trace.threads[0].tid, "again")]
    out = gputrace.exporters.write(trace, tmp_path / "twice.json")
    assert [t["name"] for t in header_of(out)["threads"]] == [t.name for t in trace.threads]
