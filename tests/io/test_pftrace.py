"""The .pftrace export: the JSON file's events as Perfetto's protobuf, checked through Perfetto's
own .proto (the ``perfetto`` package's ``perfetto_trace_pb2``): the same slices, flows, counters
and args on the same tracks, names a person reads, each track's slices nested."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

import gputrace
from gputrace.cli import cli
from tests import perfetto_rules
from tests.builders import ops_trace, record_story

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


def parsed(path: Path) -> dict[str, Any]:
    """Tracks (uuid -> descriptor), and the events with their interned names resolved."""
    msg = pb.Trace()
    msg.ParseFromString(path.read_bytes())
    tracks: dict[int, Any] = {}
    names: dict[tuple[int, int], str] = {}
    events: list[dict[str, Any]] = []
    for p in msg.packet:
        for field, table in ((1, p.interned_data.event_categories), (2, p.interned_data.event_names),
                             (3, p.interned_data.debug_annotation_names)):  # fmt: skip
            for x in table:
                names[(field, x.iid)] = x.name
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        if p.HasField("track_event"):
            te = p.track_event
            args = {names[(3, a.name_iid)]: _value(a) for a in te.debug_annotations}
            events.append({"ts": p.timestamp, "type": te.type, "track": te.track_uuid,
                           "name": names.get((2, te.name_iid)), "cat": names.get((1, te.category_iids[0]))
                           if te.category_iids else None, "args": args, "flow_out": list(te.flow_ids),
                           "flow_in": list(te.terminating_flow_ids), "value": te.counter_value})  # fmt: skip
    return {"tracks": tracks, "events": events}


def _value(a: Any) -> Any:
    if a.array_values:
        return [_value(v) for v in a.array_values]
    if a.dict_entries:
        return {d.name: _value(d) for d in a.dict_entries}
    kind = a.WhichOneof("value")
    if kind == "legacy_json_value":
        return orjson.loads(a.legacy_json_value)
    return getattr(a, kind) if kind else None


def built_slices(got: dict[str, Any]) -> Counter[tuple[Any, int, int]]:
    """The slices an importer builds from the packets in file order (each end closes the slice
    last begun on its track and still open), as (name, start, duration) in ns."""
    open_: dict[int, list[dict[str, Any]]] = {}
    out: Counter[tuple[Any, int, int]] = Counter()
    for e in got["events"]:
        if e["type"] == 1:
            open_.setdefault(e["track"], []).append(e)
        elif e["type"] == 2:
            b = open_[e["track"]].pop()
            out[(b["name"], b["ts"], e["ts"] - b["ts"])] += 1
    assert not any(open_.values()), "slices left open"
    return out


def json_slices(doc: dict[str, Any]) -> Counter[tuple[Any, int, int]]:
    """The JSON file's complete slices and queued waits, as (name, start, duration) in ns."""
    ns = lambda us: round(us * 1000)  # noqa: E731
    out = Counter((e["name"], ns(e["ts"]), ns(e["dur"])) for e in doc["traceEvents"] if e["ph"] == "X")
    begun = {(e["pid"], e["id2"]["local"]): e for e in doc["traceEvents"] if e["ph"] == "b"}
    for e in doc["traceEvents"]:
        if e["ph"] == "e":
            b = begun[(e["pid"], e["id2"]["local"])]
            out[(b["name"], ns(b["ts"]), ns(e["ts"]) - ns(b["ts"]))] += 1
    return out


def track_name(tracks: dict[int, Any], uuid: int) -> str:
    t = tracks[uuid]
    return str(t.thread.thread_name if t.HasField("thread") else t.name)


@pytest.mark.parametrize("kind", ["story", "ops"])
def test_the_export_draws_the_json_files_slices_flows_and_args(tmp_path: Path, kind: str) -> None:
    trace = record_story(tmp_path / "s.json") if kind == "story" else ops_trace(tmp_path)
    js = gputrace.exporters.write(trace, tmp_path / "t.json")
    pf = gputrace.exporters.write(trace, tmp_path / "t.pftrace")
    doc = perfetto_rules.read(js)
    got = parsed(pf)
    x = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    begins = [e for e in got["events"] if e["type"] == 1]
    ends = [e for e in got["events"] if e["type"] == 2]
    waits = [e for e in doc["traceEvents"] if e["ph"] == "b"]
    assert len(begins) == len(ends) == len(x) + len(waits)
    assert built_slices(got) == json_slices(doc)  # each end closes its own slice
    # the same args on every slice, in both formats (keyed by name, start and category)
    key = lambda name, ts_ns, cat: (name, ts_ns, cat)  # noqa: E731
    json_args = Counter(
        (
            key(e["name"], round(e["ts"] * 1000), e.get("cat")),
            orjson.dumps(e.get("args", {}), option=orjson.OPT_SORT_KEYS),
        )
        for e in x
    )
    pf_args = Counter(
        (key(e["name"], e["ts"], e["cat"]), orjson.dumps(e["args"], option=orjson.OPT_SORT_KEYS))
        for e in begins
        if e["cat"] is not None
    )
    assert pf_args == json_args
    # every flow of the JSON, bound at both ends
    outs = sorted(f for e in begins for f in e["flow_out"])
    ins = sorted(f for e in begins for f in e["flow_in"])
    assert outs == ins == sorted(e["bind_id"] + 1 for e in x if e.get("flow_out"))
    # counters: one sample per JSON sample
    assert sum(e["type"] == 4 for e in got["events"]) == sum(
        len(e["args"]) for e in doc["traceEvents"] if e["ph"] == "C"
    )


def test_tracks_read_as_a_person_names_them_and_each_stream_keeps_its_tracks_together(tmp_path: Path) -> None:
    """What Perfetto's UI shows (its real importer, where it runs here): the GPU process's tracks
    in the order it draws them (by name), each stream's tracks together, no track numbering."""
    from tests import perfetto_ui

    trace = ops_trace(tmp_path)
    path = gputrace.exporters.write(trace, tmp_path / "t.pftrace")
    tracks = parsed(path)["tracks"]
    gpu = next(t for t in tracks.values() if t.HasField("process") and t.process.pid >= 1 << 30)
    names = sorted(t.name for t in tracks.values() if t.parent_uuid == gpu.uuid)
    if perfetto_ui.skip_reason() is None:
        ui = perfetto_ui.PerfettoUI()
        try:
            shown = ui.report(path)["layout"]
        finally:
            ui.close()
        assert [n for n in shown[0]["tracks"]] == names and shown[0]["name"].startswith("GPU 0")
    assert not [n for n in names if str(1 << 20) in n or str(1 << 24) in n]  # no track numbering shown
    for q in trace.queues:  # its execution track first, then its counter, operations and waits
        mine = [i for i, n in enumerate(names) if n == q.label or n.startswith(q.label + " ")]
        assert mine == list(range(mine[0], mine[0] + len(mine))), names
        assert names[mine[0]] == q.label and {f"{q.label} · queued", f"{q.label} · operations"} <= set(names)


def test_each_tracks_slices_nest_even_when_thousands_of_waits_overlap(tmp_path: Path) -> None:
    from gputrace.backends.fake import FakeBackend
    from gputrace.clock import FakeClock

    clock = FakeClock(1_000_000, 0)
    be = FakeBackend(clock, script=lambda n, i: (1_000, 50_000))  # the GPU falls far behind
    with gputrace.session(backend=be, clock=clock, quiet=True) as s:
        for _ in range(2_000):
            with gputrace.trace("k"):
                clock.advance(1_000)
    assert s.trace is not None
    got = parsed(gputrace.exporters.write(s.trace, tmp_path / "t.pftrace"))
    assert built_slices(got) == json_slices(
        perfetto_rules.read(gputrace.exporters.write(s.trace, tmp_path / "t.json"))
    )
    depth: Counter[int] = Counter()
    lanes = set()
    for e in got["events"]:  # in file order: a track's begins and ends nest
        if e["type"] == 1:
            depth[e["track"]] += 1
        elif e["type"] == 2:
            depth[e["track"]] -= 1
            assert depth[e["track"]] >= 0
        if e["name"] and e["name"].startswith("queued"):
            lanes.add(e["track"])
    assert not +depth and len(lanes) > 100  # waits overlap: many lanes, each of disjoint waits


def test_gputrace_reads_the_json_gz_and_says_so_for_a_pftrace(tmp_path: Path) -> None:
    pf = gputrace.exporters.write(record_story(tmp_path / "s.json"), tmp_path / "t.pftrace")
    doubled = tmp_path / "twice.pftrace"  # concatenated with itself: still refused, not counted twice
    doubled.write_bytes(pf.read_bytes() * 2)
    for path in (pf, doubled):
        with pytest.raises(gputrace.GputraceError, match=r"an export for Perfetto.*\.json\.gz"):
            gputrace.load(path)
        res = CliRunner().invoke(cli, ["summarize", str(path)])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1


def test_convert_writes_the_format_the_name_asks_for_with_the_same_numbers(tmp_path: Path) -> None:
    src = Path(__file__).parents[1] / "data" / "story.json"
    for out in (tmp_path / "s.json.gz", tmp_path / "s.pftrace"):
        res = CliRunner().invoke(cli, ["convert", str(src), str(out)])
        assert res.exit_code == 0 and "wrote" in res.output, res.output
    a = CliRunner().invoke(cli, ["summarize", str(src)]).output
    b = CliRunner().invoke(cli, ["summarize", str(tmp_path / "s.json.gz")]).output
    assert a.replace(str(src), "X") == b.replace(str(tmp_path / "s.json.gz"), "X")
    assert perfetto_rules.check_file(tmp_path / "s.pftrace") == []
    same = CliRunner().invoke(cli, ["convert", str(src), str(src)])
    assert same.exit_code == 2 and len(same.output.strip().splitlines()) == 1
    for name in ("s.pb", "s.json.gzip", "s"):  # a name that picks no format: one sentence, nothing written
        res = CliRunner().invoke(cli, ["convert", str(src), str(tmp_path / name)])
        assert res.exit_code == 2 and res.output.count("\n") == 1 and ".pftrace" in res.output, res.output
        assert not (tmp_path / name).exists()


def test_a_streamed_session_writes_the_pftrace_chunk_by_chunk_with_the_exports_events(tmp_path: Path) -> None:
    from tests.builders import gpu_session

    # "run" waits until the middle of the second step's wait: the two waits partly overlap
    s, _clock = gpu_session(
        tmp_path / "s.pftrace",
        lambda n, i: (40_000 if n == "run" else 2_000 + 500 * i, 30_000),
        in_order=False,
    )
    with s:
        with gputrace.trace("run"):  # open across every sync: it reaches the file in the last chunk
            for i in range(6):
                with gputrace.trace("step", i=i):
                    with gputrace.trace("matmul", stream="a"):
                        pass
                gputrace.sync()
    assert s.trace is not None and s.trace.header["streamed"]["chunks"] >= 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json.gz", "s.pftrace"]
    whole = gputrace.exporters.write(gputrace.load(tmp_path / "s.json.gz"), tmp_path / "whole.pftrace")
    assert perfetto_rules.check_file(tmp_path / "s.pftrace") == []
    streamed, converted = parsed(tmp_path / "s.pftrace"), parsed(whole)
    base = min(e["ts"] for e in streamed["events"]) - min(e["ts"] for e in converted["events"])
    assert base % 1000 == 0  # (the two files count from different bases)

    def slices(got: dict[str, Any], shift: int = 0) -> Counter[Any]:
        """Each scope's slices with their args and flows (waits and queue depth are drawn per
        chunk: their lanes and samples may differ from a whole file's, as may which overlap track
        of a stream a slice takes); times from the first."""

        def args(a: dict[str, Any]) -> bytes:
            if "submit_ts" in a:
                a = {**a, "submit_ts": round(a["submit_ts"] * 1000) - shift}
            return orjson.dumps(a, option=orjson.OPT_SORT_KEYS)

        return Counter(
            (track_name(got["tracks"], e["track"]).split(" (overlap")[0], e["name"], e["ts"] - shift,
             e["cat"], args(e["args"]), len(e["flow_out"]), len(e["flow_in"]))
            for e in got["events"] if e["type"] == 1 and e["cat"] is not None
        )  # fmt: skip

    assert slices(streamed, base) == slices(converted, 0)
    assert sum(e["name"] == "run" for e in streamed["events"]) == 2  # its CPU and GPU slices
    waits = lambda got: sum(e["type"] == 1 and e["cat"] is None for e in got["events"])  # noqa: E731
    assert waits(streamed) == waits(converted) == 13  # "run", and its 6 steps' and matmuls'
    # on every track, slices nest or are apart, though chunks overlap in time
    spans: dict[int, list[tuple[int, int]]] = {}
    stack: dict[int, list[int]] = {}
    for e in streamed["events"]:
        if e["type"] == 1:
            stack.setdefault(e["track"], []).append(e["ts"])
        elif e["type"] == 2:
            spans.setdefault(e["track"], []).append((stack[e["track"]].pop(), e["ts"]))
    for track in spans.values():
        for a0, a1 in track:
            assert not [(b0, b1) for b0, b1 in track if a0 < b0 < a1 < b1]
    # interned names and tracks are written once, as each chunk first needs them
    msg = pb.Trace()
    msg.ParseFromString((tmp_path / "s.pftrace").read_bytes())
    names = [x.name for p in msg.packet for x in p.interned_data.event_names]
    assert len(names) == len(set(names)) and {"run", "step", "matmul"} <= set(names)
    uuids = [p.track_descriptor.uuid for p in msg.packet if p.HasField("track_descriptor")]
    assert len(uuids) == len(set(uuids))
    assert sum(p.sequence_flags & 1 for p in msg.packet) == 1  # the state is cleared once, first


def test_a_chunk_whose_packets_fail_is_undone_in_both_files_and_written_with_cpu_times(
    tmp_path: Path,
) -> None:
    import warnings

    from gputrace.exporters import pftrace
    from tests.builders import gpu_session
    from tests.faults import inject

    s, _clock = gpu_session(tmp_path / "s.pftrace", lambda n, i: (2_000, 30_000))
    with warnings.catch_warnings(record=True), inject(pftrace._Packets, "encode", "nth") as fault:
        warnings.simplefilter("always")
        with s:
            for i in range(6):
                with gputrace.trace("step", i=i):
                    pass
                gputrace.sync()
    assert fault.fired == 1
    back = gputrace.load(tmp_path / "s.json.gz")
    steps = back.find("step")
    assert len(steps) == 6 and sum(bool(sc.flags & gputrace.Flag.DEGRADED) for sc in steps) >= 1
    assert perfetto_rules.check_file(tmp_path / "s.pftrace") == []
    got = parsed(tmp_path / "s.pftrace")
    cpu = [e for e in got["events"] if e["type"] == 1 and e["cat"] == "cpu"]
    gpu = [e for e in got["events"] if e["type"] == 1 and e["cat"] == "gpu"]
    timed = sum(sc.gpu_start_ns is not None for sc in steps)
    assert len(cpu) == 6 and len(gpu) == timed < 6  # as in the .json.gz
