"""The Chrome/Perfetto exporter and gputrace.load: layout rules, exact round trip, bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import orjson
import pytest

import gputrace
from gputrace.clock import FakeClock
from gputrace.exporters.plan import GPU_PID_BASE, OVERLAP_TID_STEP, LaneCarry
from tests import perfetto_rules
from tests.builders import assert_same, gpu_session, record_story


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_round_trip_is_exact(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    written = record_story(path)
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert_same(written, gputrace.load(path))


def test_layout(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    trace = record_story(path)
    doc = perfetto_rules.read(path)
    assert perfetto_rules.check(doc) == []
    ev = doc["traceEvents"]
    pid = doc["gputrace"]["pid"]
    # every slice says which side it is on
    assert {e["cat"] for e in ev if e["ph"] == "X"} <= {"cpu", "gpu", "gpu.pass"}
    cpu = [e for e in ev if e["ph"] == "X" and e["pid"] < GPU_PID_BASE]
    gpu = [e for e in ev if e["ph"] == "X" and e["pid"] >= GPU_PID_BASE]
    assert len(cpu) == len(trace) == 16 and {e["pid"] for e in cpu} == {pid}
    assert len(gpu) == 16 and {e["pid"] for e in gpu} == {GPU_PID_BASE}
    procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs[GPU_PID_BASE] == "GPU 0 · Fake GPU · fake"
    gpu_threads = {
        e["tid"]: e["args"]["name"]
        for e in ev
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == GPU_PID_BASE
    }
    assert sorted(gpu_threads.values()) == ["stream 0", "stream a", "stream b"]
    # one flow per GPU scope, v2, bound to the scope's CPU slice and to its GPU slice
    assert not [e for e in ev if e["ph"] in ("s", "t", "f")]
    out_ids = sorted(e["bind_id"] for e in cpu if e.get("flow_out"))
    in_ids = sorted(e["bind_id"] for e in gpu if e.get("flow_in"))
    assert out_ids == in_ids == list(range(16))
    # queued waits are async slices inside the GPU process (id2.local), one b/e pair per scope
    b = [e for e in ev if e["ph"] == "b"]
    assert {e["pid"] for e in b} == {GPU_PID_BASE} and all("id" not in e for e in b)
    assert sorted(e["id2"]["local"] for e in b) == list(range(16))
    assert len(b) == 16 and {e["name"] for e in b} == {
        "queued · stream a",
        "queued · stream b",
        "queued · stream 0",
    }
    # args carry the numbers, exactly
    sc = trace.find("matmul")[2]
    g = next(e for e in gpu if e["bind_id"] == sc.index)
    wait = next(e for e in b if e["id2"]["local"] == sc.index)
    assert g["dur"] == sc.gpu_ns / 1000  # type: ignore[operator]
    assert round((g["ts"] - wait["ts"]) * 1000) == sc.queue_gap_ns
    # every field on every GPU slice, none left for a reader to derive
    assert all(
        {"submit_ts", "submit_to_start_us", "gpu_us", "cpu_enqueue_us", "uncertainty_us", "flags"}
        <= set(e["args"])
        for e in gpu
    )
    a = g["args"]
    assert round(a["submit_to_start_us"] * 1000) == sc.queue_gap_ns and a["gpu_us"] * 1000 == sc.gpu_ns
    assert round(a["cpu_enqueue_us"] * 1000) == sc.cpu_ns and round(a["submit_ts"], 3) == wait["ts"]
    assert a["flags"] == sc.flag_names
    # a queue-depth counter per stream, named so that Perfetto's "<name> <key>" reads once
    depth = [e for e in ev if e["ph"] == "C"]
    assert {e["name"] for e in depth} == {"stream 0", "stream a", "stream b"}
    assert {k for e in depth for k in e["args"]} == {"queue depth"}
    assert (
        min(e["args"]["queue depth"] for e in depth) == 0
        and max(e["args"]["queue depth"] for e in depth) >= 1
    )
    # processes: Python first, then the GPU
    sort = {
        e["pid"]: e["args"]["sort_index"] for e in ev if e["ph"] == "M" and e["name"] == "process_sort_index"
    }
    assert sort[pid] < sort[GPU_PID_BASE]
    assert [e["name"] for e in ev if e["ph"] == "i" and e["cat"] == "mark"] == ["tick"] * 5
    assert len([e for e in ev if e["ph"] == "i" and e["cat"] == "sync"]) == 2
    anomalies = [e for e in ev if e["ph"] == "i" and e["cat"] == "anomaly"]
    assert [e["name"] for e in anomalies] == ["anomaly: empty_gpu_span"]
    h = doc["gputrace"]
    assert h["backend"] == "fake" and h["clock"][0]["samples"] >= 3
    assert set(h["host"]) >= {"name", "cpu_count", "loadavg_start", "loadavg_end"}


def test_times_are_relative_exact_microseconds(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    trace = record_story(path)
    doc = perfetto_rules.read(path)
    base = doc["gputrace"]["base_ns"]
    first = next(e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] < GPU_PID_BASE)
    assert round(first["ts"] * 1000) + base == trace.scope(0).cpu_start_ns
    assert first["ts"] < 1_000_000  # relative, so Perfetto keeps sub-µs precision


def test_partial_overlaps_move_to_another_track(tmp_path: Path) -> None:
    def script(n: str, i: int) -> tuple[int, int]:
        return (1000, 100_000) if n == "first" else (-50_000, 100_000)

    path = tmp_path / "t.json"
    s, clock = gpu_session(path, script, in_order=False)
    with s:
        with gputrace.trace("first"):
            pass
        clock.advance(60_000)
        with gputrace.trace("second"):
            pass
    doc = perfetto_rules.read(path)
    assert perfetto_rules.check(doc) == []
    gpu = {e["name"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] >= GPU_PID_BASE}
    assert gpu["first"]["tid"] != gpu["second"]["tid"]
    assert {gpu["first"]["tid"] % OVERLAP_TID_STEP, gpu["second"]["tid"] % OVERLAP_TID_STEP} == {1}
    # started 50 µs before its submission and ran 100 µs: impossible three ways, all flagged
    assert gputrace.load(path).find("second")[0].flag_names == [
        "cold",
        "gpu_exceeds_wall",
        "start_before_submit",
        "overlap",
    ]


def test_gpu_time_before_session_start_shifts_base_not_values(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    s, _ = gpu_session(path, lambda n, i: (-10_000_000, 1_000), in_order=False)
    with s:
        with gputrace.trace("early"):
            pass
    doc = perfetto_rules.read(path)
    assert perfetto_rules.check(doc) == []  # no negative ts
    sc = gputrace.load(path).find("early")[0]
    assert "start_before_submit" in sc.flag_names and sc.queue_gap_ns is not None
    assert sc.queue_gap_ns < -9_000_000  # kept as measured


def test_cpu_trace_round_trip_and_interleaved_lanes(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    a, b = gputrace.trace("a"), gputrace.trace("b")
    with gputrace.session(path, backend="cpu", clock=FakeClock(0, 1), quiet=True) as s:
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        b.__exit__(None, None, None)
    assert s.trace is not None
    assert perfetto_rules.check(perfetto_rules.read(path)) == []
    assert_same(s.trace, gputrace.load(path))


# --- bad input: one error type, one sentence naming the file ---------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        (b"", "the file is empty"),
        (b'{"traceEvents": [{"ph": "X", "ts": 1', "truncated JSON"),
        (b"hello, world", "not valid JSON"),
        (b'{"a": 1}', "not a Chrome trace"),
        (b'{"traceEvents": []}', "not one written by gputrace"),
        (b'{"traceEvents": [], "gputrace": {"format_version": 99}}', "format version 99"),
        (
            b'{"traceEvents": [{"ph":"X","cat":"cpu"}], "gputrace": {"format_version": 2, "base_ns": 0}}',
            "malformed",
        ),
        (gzip.compress(b'{"traceEvents": [')[:-6], "gzip data is truncated"),
    ],
)
def test_load_bad_input(tmp_path: Path, content: bytes | None, expected: str) -> None:
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(gputrace.GputraceError) as info:
        gputrace.load(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: ") and expected in msg and "\n" not in msg


def test_json_is_plain_and_complete(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    record_story(path)
    doc = orjson.loads(path.read_bytes())
    # Perfetto's tokenizer stops at the first top-level key it does not know: only known keys
    # come before the events (the start header inside "metadata"), gputrace's own after them
    assert list(doc) == ["displayTimeUnit", "metadata", "traceEvents", "gputrace"]
    assert set(doc["metadata"]) == {"gputrace_stream"}
    assert b"NaN" not in path.read_bytes() and b"Infinity" not in path.read_bytes()


def test_lanes_carry_open_slices_from_one_chunk_to_the_next() -> None:
    """Back-to-back GPU work written in two chunks, each under its own clock fit, can overlap by
    tens of ns; the later slice moves to an overflow lane, and only it."""
    carry = LaneCarry()
    i64 = np.int64
    first = carry.lanes(("gpu", 0), np.array([0, 10], i64), np.array([10, 20], i64))
    assert first.tolist() == [0, 0]
    # 19 starts before the last written slice ends at 20: lane 1; 30 is clear of everything
    second = carry.lanes(("gpu", 0), np.array([19, 30, 31], i64), np.array([30, 40, 35], i64))
    assert second.tolist() == [1, 0, 0]  # (31, 35) nests inside (30, 40)
    # another track keeps its own lanes
    assert carry.lanes(("gpu", 1), np.array([5], i64), np.array([6], i64)).tolist() == [0]
    # a slice that nests inside one still open from an earlier chunk shares its lane
    assert carry.lanes(("gpu", 0), np.array([36], i64), np.array([38], i64)).tolist() == [0]
    assert carry.lanes(("gpu", 0), np.array([39], i64), np.array([45], i64)).tolist() == [1]


def test_a_large_gzip_chunk_is_compressed_beside_its_rendering_and_a_fault_there_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of 4,096 scopes or more is compressed on a second thread while it is rendered;
    when compressing fails part-way the append is undone and written again with CPU times only
    (flagged degraded): nothing reaches the program, every scope is in the file."""
    import threading

    from gputrace.exporters import json as json_format

    real, calls = json_format.GzipStream.compress, []

    def compress(self: json_format.GzipStream, data: object) -> bytes:
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise RuntimeError("an injected fault")
        return real(self, data)

    monkeypatch.setattr(json_format.GzipStream, "compress", compress)
    path = tmp_path / "big.json.gz"
    with pytest.warns(gputrace.GputraceWarning, match="injected fault"):
        with gputrace.session(path, backend="fake", quiet=True):
            for i in range(json_format.THREADED_ROWS):
                with gputrace.trace("step", i=i):
                    pass
    assert calls[0] == threading.current_thread().name  # the file's start, before any chunk
    assert calls[2] == "gputrace-gzip"  # the chunk's pieces: on the compressing thread
    t = gputrace.load(path)
    assert [sc.args["i"] for sc in t.find("step")] == list(range(json_format.THREADED_ROWS))
    assert t.header["lost"] == {"scopes": 0, "chunks": 0, "degraded_chunks": 1}
    assert not [th for th in threading.enumerate() if th.name == "gputrace-gzip"]


def test_a_writers_state_copy_shares_what_never_changes_and_copies_the_rest() -> None:
    """A checkpoint's copy of a writer's state: numbers, strings, tuples, functions and classes are
    shared; every container the writer may change is a copy of its own, at every depth."""
    from gputrace.exporters.json import state_copy

    class Table:
        def __init__(self) -> None:
            self.rows = [[1, 2]]

    def make(k: int) -> int:
        return k

    state = {"kind": Table, "make": make, "key": (1, "a"), "named": {(1, 0)}, "table": Table()}
    copied = state_copy(state)
    assert copied["kind"] is Table and copied["make"] is make and copied["key"] is state["key"]
    state["named"].add((2, 0))
    state["table"].rows[0].append(3)
    assert copied["named"] == {(1, 0)} and copied["table"].rows == [[1, 2]]
