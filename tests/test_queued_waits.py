"""The queued waits in JSON: each wait's begin (``b``) is named, its end (``e``) carries only what
Perfetto needs to close it (docs/output.md); files with named ends, as older gputrace wrote them,
read the same."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import gputrace
from gputrace.exporters.plan import GPU_PID_BASE
from tests import perfetto_rules
from tests.test_exporter import assert_same, gpu_session


def record(path: Path) -> gputrace.Trace:
    """Two queues; on the first, waits that overlap (work submitted before the previous ran)."""
    s, clock = gpu_session(path, lambda n, i: (40_000 if n == "slow" else 3_000 + 100 * i, 20_000))
    with s:
        for i in range(6):
            with gputrace.trace("slow" if i % 3 == 0 else "fast", stream="a"):
                clock.advance(5_000)
            with gputrace.trace("copy", stream="b"):
                pass
            if i == 3:
                gputrace.sync()
    assert s.trace is not None
    return s.trace


def waits(doc: Any, ph: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph]


def with_named_ends(doc: Any) -> Any:
    """``doc`` as older gputrace wrote it: both ends of a wait with ``cat`` and ``name``."""
    name = {(e["pid"], e["id2"]["local"]): e["name"] for e in waits(doc, "b")}
    events = [
        dict(e, cat="queued", name=name[e["pid"], e["id2"]["local"]]) if e["ph"] in "be" else e
        for e in doc["traceEvents"]
    ]
    return dict(doc, traceEvents=events)


def read_both_ways(path: Path) -> tuple[gputrace.Trace, ...]:
    """The trace as gputrace reads it."""
    return (gputrace.load(path),)


def test_a_waits_end_has_no_name_or_category_and_closes_its_begin(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    trace = record(path)
    doc = perfetto_rules.read(path)
    assert perfetto_rules.check(doc) == []
    begins, ends = waits(doc, "b"), waits(doc, "e")
    assert len(begins) == len(ends) == int((trace.scopes.submit_ns <= trace.scopes.gpu_start_ns).sum()) == 12
    assert all(set(e) == {"ph", "id2", "pid", "ts"} for e in ends)
    assert all(set(b) == {"ph", "name", "id2", "pid", "ts"} for b in begins)
    assert {b["name"] for b in begins} == {"queued · stream a", "queued · stream b"}
    # each end at its scope's GPU start, in the same GPU process as its begin
    gpu = {e["bind_id"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= GPU_PID_BASE}
    begin_of = {(b["pid"], b["id2"]["local"]): b for b in begins}
    for e in ends:
        g = gpu[e["id2"]["local"]]
        assert (e["pid"], e["ts"]) == (g["pid"], g["ts"])
        assert begin_of[e["pid"], e["id2"]["local"]]["ts"] <= e["ts"]
    # the waits on stream a overlap (why they are async slices)
    a = sorted((b["ts"], gpu[b["id2"]["local"]]["ts"]) for b in begins if b["name"].endswith(" a"))
    assert any(nxt[0] < cur[1] for cur, nxt in itertools.pairwise(a))
    for back in read_both_ways(path):
        assert_same(trace, back)
        assert np.array_equal(back.scopes.submit_ns, trace.scopes.submit_ns)
        assert [back.scope(i).queue_gap_ns for i in range(len(back))] == [
            trace.scope(i).queue_gap_ns for i in range(len(trace))
        ]


def test_a_file_with_named_ends_reads_the_same(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    trace = record(path)
    old = tmp_path / "old.json"
    old.write_bytes(orjson.dumps(with_named_ends(perfetto_rules.read(path))))
    doc = perfetto_rules.read(old)
    assert all(e["cat"] == "queued" and e["name"].startswith("queued · ") for e in waits(doc, "e"))
    assert perfetto_rules.check(doc) == []
    for back in read_both_ways(old):
        assert_same(trace, back)


def test_the_rules_refuse_ends_that_perfetto_would_not_pair(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    record(path)
    doc = perfetto_rules.read(path)
    # a category on one end only: Perfetto hashes it into the slice's id, so the ends miss
    half = dict(doc, traceEvents=[dict(e, cat="queued") if e["ph"] == "b" else e for e in doc["traceEvents"]])
    assert any("with the same cat" in p for p in perfetto_rules.check(half))
    # an end named otherwise than its begin closes nothing
    other = dict(
        doc, traceEvents=[dict(e, name="other") if e["ph"] == "e" else e for e in doc["traceEvents"]]
    )
    assert any("no match" in p for p in perfetto_rules.check(other))


@pytest.mark.not_a_trace  # the cut file is incomplete on purpose
@pytest.mark.parametrize("named", [False, True])
def test_a_wait_whose_end_never_came_still_gives_its_submission(tmp_path: Path, named: bool) -> None:
    """What a file cut inside a chunk would hold: a begin without its end."""
    path = tmp_path / "t.json"
    trace = record(path)
    doc = perfetto_rules.read(path)
    if named:
        doc = with_named_ends(doc)
    last_end = waits(doc, "e")[-1]
    cut = tmp_path / "cut.json"
    cut.write_bytes(orjson.dumps(dict(doc, traceEvents=[e for e in doc["traceEvents"] if e is not last_end])))
    for back in read_both_ways(cut):
        assert_same(trace, back)


def test_the_gzip_file_has_the_same_events(tmp_path: Path) -> None:
    trace = record(tmp_path / "t.json")
    gz = gputrace.exporters.write(trace, tmp_path / "t.json.gz")
    doc = perfetto_rules.read(gz)
    assert all(set(e) == {"ph", "id2", "pid", "ts"} for e in waits(doc, "e"))
    assert_same(trace, gputrace.load(gz))
