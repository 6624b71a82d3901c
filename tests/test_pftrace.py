"""The Perfetto protobuf format (.pftrace): exact round trip, truncation, streaming, Perfetto's view."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace
from gputrace import figures
from gputrace.exporters import chrome, pftrace
from gputrace.loader import TraceFileError
from gputrace.model import (
    NO_TIME,
    Flag,
    Mark,
    QueueInfo,
    ScopeTable,
    SpanTable,
    ThreadInfo,
    Trace,
    canonical_names,
    nest,
)
from tests import perfetto_tp
from tests.test_exporter import assert_same, record_story

DATA = Path(__file__).parent / "data"
GOLDEN = sorted(
    p
    for p in DATA.glob("*.json")
    if p.name not in ("pytorch.json", "durations.json", "torch_h200_key_averages.json")
)  # traces only


def synthetic(n_top: int, seed: int) -> Trace:
    """A trace with everything the format carries, on a coarse clock so times often tie:
    two threads (one with partially overlapping coroutine scopes), nesting, two streams (with
    overlapping GPU work and waits), passes, negative gaps, flags, args of every JSON type, marks."""
    rng = random.Random(seed)
    threads = [ThreadInfo(100, "MainThread"), ThreadInfo(101, "worker")]
    queues = [QueueInfo(0, "Fake GPU", "fake", "stream 0"), QueueInfo(0, "Fake GPU", "fake", "stream 1")]
    names = ["step", "matmul", "copy", "idle", "pass a", "pass b"]
    rows: list[dict[str, Any]] = []
    passes: list[tuple[int, int, int, int, int]] = []  # row, label, submit, start, end
    marks: list[Mark] = []
    for th in range(2):
        t = 0
        for i in range(n_top):
            t += rng.choice([0, 1000, 2000])
            top_end = t + rng.choice([0, 2000, 5000, 9000])
            rows.append({"name": 0, "thread": th, "s": t, "e": top_end})
            c = t
            for _k in range(rng.choice([0, 1, 2])):
                if c >= top_end:
                    break
                ce = min(top_end, c + rng.choice([0, 1000, 2000]))
                rows.append({"name": rng.choice([1, 2, 3]), "thread": th, "s": c, "e": ce})
                c = ce
            if th == 1 and i % 7 == 3:  # a coroutine scope that partially overlaps the next
                rows.append(
                    {
                        "name": 3,
                        "thread": th,
                        "s": top_end - 1000 if top_end >= 1000 else 0,
                        "e": top_end + 3000,
                    }
                )
            if rng.random() < 0.2:
                args = {"i": i} if rng.random() < 0.5 else {}
                marks.append(Mark("tick", t, th, rng.choice(["mark", "sync"]), args))
            t = top_end
    # the reader refuses a CPU slice repeated exactly (a concatenated file): keep each once
    rows = list({(r["name"], r["thread"], r["s"], r["e"]): r for r in rows}.values())
    rows.sort(key=lambda r: (r["s"], r["thread"], -r["e"]))
    n = len(rows)
    s = ScopeTable.empty(n)
    s.name = np.array([r["name"] for r in rows], np.int32)
    s.thread = np.array([r["thread"] for r in rows], np.int32)
    s.cpu_start_ns = np.array([r["s"] for r in rows], np.int64) + 10**9
    s.cpu_end_ns = np.array([r["e"] for r in rows], np.int64) + 10**9
    for i in range(n):
        if s.name[i] in (1, 2) or rng.random() < 0.1:
            q = rng.choice([0, 1])
            sub = int(s.cpu_start_ns[i]) + rng.choice([0, 1000])
            if sub > s.cpu_end_ns[i]:
                sub = int(s.cpu_end_ns[i])
            g0 = sub + rng.choice([-1000, 0, 1000, 3000, 6000])
            g1 = g0 + rng.choice([0, 1000, 4000, -1000 if rng.random() < 0.05 else 2000])
            s.queue[i] = q
            s.submit_ns[i] = sub if rng.random() < 0.9 else NO_TIME
            s.gpu_start_ns[i], s.gpu_end_ns[i] = g0, g1
            s.uncertainty_ns[i] = rng.choice([0, 32, 4600])
        if rng.random() < 0.15:
            s.flags[i] = rng.choice([Flag.COLD, Flag.OUTLIER, Flag.COLD | Flag.OVERLAP, Flag.ERROR])
        if s.gpu_end_ns[i] < s.gpu_start_ns[i]:  # a broken timer's span is flagged, never silent
            s.flags[i] |= Flag.DEGRADED
        if rng.random() < 0.2:
            s.args[i] = rng.choice(
                [
                    {"i": i},
                    {"x": 0.1 * i, "s": 'é"x'},
                    {"l": [1, "a", None], "d": {"k": 1}, "b": True, "z": None},
                ]
            )
    nest(s)
    for i in np.flatnonzero(s.gpu_start_ns != NO_TIME).tolist():  # passes where no other GPU work overlaps
        g0, g1, q = int(s.gpu_start_ns[i]), int(s.gpu_end_ns[i]), s.queue[i]
        others = (s.queue == q) & (s.gpu_start_ns < g1) & (s.gpu_end_ns > g0) & (s.gpu_start_ns != NO_TIME)
        if g1 > g0 and others.sum() == 1 and rng.random() < 0.5:
            a = rng.randrange(g0, g1)
            passes.append((i, 4, int(s.submit_ns[i]), g0, a))
            passes.append((i, 5, NO_TIME, a, g1))
    sp = SpanTable.empty(len(passes))
    if passes:
        sp.scope = np.array([p[0] for p in passes], np.int64)
        sp.label = np.array([p[1] for p in passes], np.int32)
        sp.queue = s.queue[sp.scope].astype(np.int32)
        sp.submit_ns = np.array([p[2] for p in passes], np.int64)
        sp.gpu_start_ns = np.array([p[3] for p in passes], np.int64)
        sp.gpu_end_ns = np.array([p[4] for p in passes], np.int64)
    names = canonical_names(names, s, sp)
    for m in range(len(marks)):
        marks[m] = Mark(marks[m].name, marks[m].ts_ns + 10**9, marks[m].thread, marks[m].kind, marks[m].args)
    marks.sort(key=lambda m: m.ts_ns)
    header = gputrace.load(DATA / "story.json").header
    header = {**header, "base_ns": 10**9, "start_ns": 10**9, "pid": 4242}
    return Trace(header, names, threads, queues, s, sp, marks, {})


def through_json(trace: Trace, tmp_path: Path) -> Trace:
    """The trace as the JSON path gives it back (its canonical form)."""
    path = tmp_path / "canon.json"
    chrome.write(trace, path)
    return gputrace.load(path)


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.name)
def test_golden_traces_round_trip_exactly(tmp_path: Path, golden: Path) -> None:
    trace = gputrace.load(golden)
    path = pftrace.write(trace, tmp_path / "t.pftrace")
    back = pftrace.read(path)
    assert_same(trace, back)
    assert back.header == {k: v for k, v in pftrace._file_header(trace).items()}
    assert "truncated" not in back.header


def test_session_trace_round_trips(tmp_path: Path) -> None:
    trace = record_story(tmp_path / "t.json")
    assert_same(trace, pftrace.read(pftrace.write(trace, tmp_path / "t.pftrace")))


@pytest.mark.parametrize("seed", range(6))
def test_everything_round_trips_with_ties_overlaps_and_passes(tmp_path: Path, seed: int) -> None:
    trace = through_json(synthetic(40, seed), tmp_path)
    assert len(trace.spans) and trace.scopes.args and trace.marks
    back = pftrace.read(pftrace.write(trace, tmp_path / "t.pftrace"))
    assert_same(trace, back)


def test_empty_trace(tmp_path: Path) -> None:
    trace = through_json(synthetic(0, 0), tmp_path)
    assert len(trace) == 0
    assert_same(trace, pftrace.read(pftrace.write(trace, tmp_path / "t.pftrace")))


_slice = pftrace.slice_rows


def _stream(trace: Trace, path: Path, cuts: list[int]) -> pftrace.StreamWriter:
    header = pftrace._file_header(trace)
    w = pftrace.StreamWriter(path, {k: v for k, v in header.items() if k not in ("threads", "queues")})
    bounds = [0, *cuts, len(trace)]
    starts = trace.scopes.cpu_start_ns
    for a, b in itertools.pairwise(bounds):
        t0 = int(starts[a]) if a else -(2**62)
        t1 = int(starts[b]) if b < len(trace) else 2**62
        w.append(_slice(trace, a, b, t0, t1))
        assert w.rows == b
    return w


@pytest.mark.parametrize("seed", range(3))
def test_streaming_appends_equal_the_whole_write(tmp_path: Path, seed: int) -> None:
    trace = through_json(synthetic(60, seed), tmp_path)
    n = len(trace)
    w = _stream(trace, tmp_path / "s.pftrace", [n // 5, n // 5, n // 2, n - 3])
    w.close(pftrace._file_header(trace))
    streamed = pftrace.read(tmp_path / "s.pftrace")
    whole = pftrace.read(pftrace.write(trace, tmp_path / "w.pftrace"))
    assert_same(whole, streamed)
    assert_same(trace, streamed)
    assert streamed.header["threads"] == whole.header["threads"]


def test_nesting_read_back_is_the_models_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deeply nested scopes with distinct times, parents resolved in a later chunk than their
    children: parent and depth read back are what ``model.nest`` gives."""
    rng = random.Random(7)
    rows: list[tuple[int, int, int]] = []

    def tree(start: int, end: int, depth: int) -> None:
        rows.append((start, end, depth))
        t = start + 1 + rng.randrange(3)
        for _ in range(rng.randrange(1, 4)):
            if depth >= 6 or t + 10 >= end:
                break
            e = t + rng.randrange(4, max(5, (end - t) // 2))
            tree(t, e, depth + 1)
            t = e + 1 + rng.randrange(3)

    tree(10**9, 10**9 + 100_000, 0)
    rows.sort(key=lambda r: (r[0], -r[1]))
    n = len(rows)
    s = ScopeTable.empty(n)
    s.cpu_start_ns = np.array([r[0] for r in rows], np.int64)
    s.cpu_end_ns = np.array([r[1] for r in rows], np.int64)
    nest(s)
    assert s.depth.max() >= 4
    header = {**gputrace.load(DATA / "story.json").header, "base_ns": 10**9, "start_ns": 10**9, "clock": []}
    trace = Trace(header, ["x"], [ThreadInfo(1, "main")], [], s, SpanTable.empty(), [], {})
    # the chunks in reverse: every parent arrives after its children
    path = tmp_path / "r.pftrace"
    w = pftrace.StreamWriter(path, pftrace._file_header(trace))
    cuts = [0, n // 3, 2 * n // 3, n]
    for a, b in reversed(list(itertools.pairwise(cuts))):
        w.append(_slice(trace, a, b, 0, 0))
    w.close(pftrace._file_header(trace))

    def no_slow_path(_s: ScopeTable) -> None:
        raise AssertionError("model.nest called: the depths Perfetto gives were not used")

    monkeypatch.setattr(pftrace, "nest", no_slow_path)
    back = pftrace.read(path)
    assert_same(trace, back)


@pytest.mark.parametrize("seed", range(3))
def test_chunks_out_of_time_order_read_back_in_the_models_order(tmp_path: Path, seed: int) -> None:
    """A session may append a scope after scopes that started later (an outer scope ends last):
    rows come back in start order, and what the file refers to by row (a GPU slice's scope, a
    pass's scope, the uncertainty carried forward) follows them."""
    trace = through_json(synthetic(50, seed), tmp_path)
    n = len(trace)
    path = tmp_path / "r.pftrace"
    w = pftrace.StreamWriter(path, pftrace._file_header(trace))
    starts = trace.scopes.cpu_start_ns
    # (cut where the start time changes: scopes tied in every key keep their order only inside a chunk)
    cuts = [
        0,
        *(int(np.searchsorted(starts, starts[k], side="right")) for k in (n // 4, n // 2, 3 * n // 4)),
        n,
    ]
    for a, b in reversed(list(itertools.pairwise(cuts))):
        t0 = int(starts[a]) if a else -(2**62)
        t1 = int(starts[b]) if b < n else 2**62
        w.append(_slice(trace, a, b, t0, t1))
    w.close(pftrace._file_header(trace))
    assert_same(trace, pftrace.read(path))


def test_a_cut_file_loads_every_whole_chunk_and_says_it_ends_early(tmp_path: Path) -> None:
    trace = through_json(synthetic(60, 1), tmp_path)
    n = len(trace)
    cuts = [n // 4, n // 2, 3 * n // 4]
    path = tmp_path / "s.pftrace"
    sizes = []
    w = pftrace.StreamWriter(path, pftrace._file_header(trace))
    bounds = [0, *cuts, n]
    for a, b in itertools.pairwise(bounds):
        w.append(_slice(trace, a, b, -(2**62) if a == 0 else 2**62, 2**62))  # marks only in chunk 1
        sizes.append(path.stat().st_size)
    w.abandon()  # killed: no final header
    raw = path.read_bytes()
    back = pftrace.read(path)
    assert back.header["truncated"] is True and len(back) == n
    for k, size in enumerate(sizes):
        for cut in (size, size + 1, size + 7, (size + sizes[k + 1]) // 2 if k + 1 < len(sizes) else size):
            (tmp_path / "cut.pftrace").write_bytes(raw[:cut])
            got = pftrace.read(tmp_path / "cut.pftrace")
            assert got.header["truncated"] is True
            assert len(got) == bounds[k + 1], (k, cut)
            want = _slice(trace, 0, bounds[k + 1], -(2**62), 2**62)
            want_t = through_json(want, tmp_path)
            assert_same(want_t, got)
    (tmp_path / "cut.pftrace").write_bytes(raw[: sizes[0] - 3])  # inside the first chunk
    got = pftrace.read(tmp_path / "cut.pftrace")
    assert got.header["truncated"] is True and len(got) == 0


def test_a_closed_stream_is_not_truncated_and_keeps_the_final_header(tmp_path: Path) -> None:
    trace = through_json(synthetic(10, 2), tmp_path)
    w = _stream(trace, tmp_path / "s.pftrace", [])
    w.close({**pftrace._file_header(trace), "end_ns": 123})
    back = pftrace.read(tmp_path / "s.pftrace")
    assert back.header["end_ns"] == 123 and "truncated" not in back.header


@pytest.mark.parametrize(
    ("content", "expected"),
    [(None, "no such file"), (b"", "empty"), (b"{not a pftrace", "not a Perfetto trace"),
     (b"\x0a\x02\x08\x01", "no gputrace header"), (b"\x0a\x03\x08\x01\x10", "not a Perfetto trace")],
)  # fmt: skip
def test_bad_input_is_one_sentence(tmp_path: Path, content: bytes | None, expected: str) -> None:
    path = tmp_path / "bad.pftrace"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(TraceFileError, match=expected):
        pftrace.read(path)


def ops_trace(tmp_path: Path) -> Trace:
    """The session story with per-operation records (where the model has them): kernels and a
    copy per GPU scope, launch calls seen or not, a graph launch running two kernels, a call
    outside every scope, another thread's launch."""
    from gputrace import model

    table = getattr(model, "OpTable", None)
    if table is None:
        pytest.skip("this gputrace has no per-operation records (model.OpTable)")
    base = record_story(tmp_path / "story.json")
    s = base.scopes
    rows = np.flatnonzero(s.has_gpu())
    names = [*list(base.names), "k_add", "k_mul", "cudaLaunchKernel", "cuGraphLaunch", "memcpy"]
    idx = {n: i for i, n in enumerate(names)}
    if "" not in idx:
        names.append("")
        idx[""] = len(names) - 1
    recs = []
    for j, r in enumerate(rows.tolist()):
        g0, g1 = int(s.gpu_start_ns[r]), int(s.gpu_end_ns[r])
        c0 = int(s.cpu_start_ns[r]) + 100
        kind = 1 if j % 4 == 3 else 0
        seen = j % 5 != 4
        recs.append((r, kind, idx["memcpy" if kind else "k_add"], int(s.queue[r]), int(s.thread[r]), 1000 + j,
                     c0 if seen else NO_TIME, c0 + 50 if seen else NO_TIME, g0, g1 if j % 7 else g0,
                     4096 * kind, (0, 0, 0) if kind else (256, 1, 1), (0, 0, 0) if kind else (128, 1, 1),
                     0, 0,
                     idx["cudaLaunchKernel"] if seen else idx[""]))  # fmt: skip
        if j == 2:  # a graph launch: two kernels from one call
            for node in (1, 2):
                recs.append((r, 0, idx["k_mul"], int(s.queue[r]), int(s.thread[r]), 5000, c0, c0 + 80,
                             g1 + 10 * node, g1 + 10 * node + 5, 0, (8, 2, 1), (32, 1, 1), 7, node,
                             idx["cuGraphLaunch"]))  # fmt: skip
    r0 = int(rows[0])
    recs.append((-1, 0, idx["k_add"], int(s.queue[r0]), 0, 9000, 10, 20, 30, 40, 0, (1, 1, 1), (1, 1, 1),
                 0, 0, idx["cudaLaunchKernel"]))  # fmt: skip
    recs.sort(key=lambda x: x[8])
    n = len(recs)
    ops = table.empty(n)
    for col, k in (("scope", 0), ("kind", 1), ("name", 2), ("queue", 3), ("thread", 4), ("correlation", 5),
                   ("call_start_ns", 6), ("call_end_ns", 7), ("gpu_start_ns", 8), ("gpu_end_ns", 9),
                   ("bytes", 10), ("graph_id", 13), ("graph_node_id", 14), ("call_name", 15)):  # fmt: skip
        setattr(ops, col, np.array([x[k] for x in recs], getattr(ops, col).dtype))
    ops.grid = np.array([x[11] for x in recs], np.int64)
    ops.block = np.array([x[12] for x in recs], np.int64)
    spans = base.spans
    names = canonical_names(names, s, spans, ops)  # type: ignore[call-arg]
    trace = Trace(base.header, names, base.threads, base.queues, s, spans, base.marks, base.clock_fits, ops)  # type: ignore[call-arg]
    # each scope submitted at its first launch call, as the resolver (and every reader) sets it;
    # a pass submitted with its scope moves with it (the file says nothing of its own submission)
    before = s.submit_ns.copy()
    figures.with_launch_submissions(trace)
    along = spans.submit_ns == before[spans.scope]
    spans.submit_ns[along] = s.submit_ns[spans.scope[along]]
    return trace


def test_per_operation_records_round_trip(tmp_path: Path) -> None:
    trace = ops_trace(tmp_path)
    back = pftrace.read(pftrace.write(trace, tmp_path / "ops.pftrace"))
    assert_same(trace, back)
    a, b = trace.ops, back.ops  # type: ignore[attr-defined]
    for col in a.COLUMNS:
        assert np.array_equal(getattr(a, col), getattr(b, col)), col


def test_per_operation_records_in_perfettos_terms(tmp_path: Path) -> None:
    """Each operation a slice on its stream's operations track, each seen launch call inside its
    scope once (a graph launch runs two kernels), a flow from call to operation."""
    pb = _perfetto_protos()
    trace = ops_trace(tmp_path)
    ops = trace.ops  # type: ignore[attr-defined]
    msg = pb.Trace()
    msg.ParseFromString(pftrace.dumps(trace))
    tracks = {
        p.track_descriptor.uuid: p.track_descriptor for p in msg.packet if p.HasField("track_descriptor")
    }
    op_tracks = {u for u, d in tracks.items() if d.HasField("thread") and d.thread.tid >= pftrace.OP_TID_BASE}
    used = {trace.queues[q].label + " · operations" for q in set(ops.queue.tolist())}
    assert {tracks[u].thread.thread_name.split(" (overlap")[0] for u in op_tracks} == used
    begins = [p.track_event for p in msg.packet if p.track_event.type == pb.TrackEvent.TYPE_SLICE_BEGIN]
    on_ops = [e for e in begins if e.track_uuid in op_tracks]
    assert len(on_ops) == len(ops)
    calls = [e for e in begins if e.flow_ids_old and e.flow_ids_old[0] >= pftrace.OP_FLOW_BASE]
    drawn = ops.call_start_ns != NO_TIME
    drawn &= ops.scope >= 0
    assert len(calls) == len(set(ops.correlation[drawn].tolist()))
    ends = sorted(f for e in on_ops for f in e.terminating_flow_ids_old)
    assert sorted(f for e in calls for f in e.flow_ids_old) == ends


def test_damaged_files_load_or_say_why(tmp_path: Path) -> None:
    """Bytes changed or cut anywhere: the file loads, or one TraceFileError says why."""
    raw = pftrace.dumps(through_json(synthetic(15, 1), tmp_path))
    rng = random.Random(5)
    path = tmp_path / "bad.pftrace"
    for _ in range(300):
        b = bytearray(raw)
        for _k in range(rng.choice([1, 3])):
            b[rng.randrange(len(b))] = rng.randrange(256)
        path.write_bytes(bytes(b[: rng.randrange(len(b))] if rng.random() < 0.3 else b))
        try:
            pftrace.read(path)
        except TraceFileError as exc:
            assert str(exc).startswith(str(path))


# -- Perfetto's own definitions of the format -------------------------------------------------------


def _perfetto_protos() -> Any:
    return pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


def test_perfetto_protos_read_what_we_mean(tmp_path: Path) -> None:
    """Parsed with Perfetto's own .proto definitions: fields land where intended, and the packets
    describe the same slices, flows, waits and counters as the JSON."""
    pb = _perfetto_protos()
    trace = through_json(synthetic(30, 3), tmp_path)
    msg = pb.Trace()
    msg.ParseFromString(pftrace.dumps(trace))
    names: dict[int, str] = {}
    tracks: dict[int, Any] = {}
    begins: dict[int, int] = {}
    ends: dict[int, int] = {}
    flows_out, flows_in, counters, instants = [], [], 0, 0
    te_type = pb.TrackEvent
    for p in msg.packet:
        assert p.trusted_packet_sequence_id == 1
        for e in p.interned_data.event_names:
            names[e.iid] = e.name
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = p.track_descriptor
        if p.HasField("track_event"):
            e = p.track_event
            assert e.track_uuid in tracks
            if e.type == te_type.TYPE_SLICE_BEGIN:
                assert e.name_iid in names
                begins[e.track_uuid] = begins.get(e.track_uuid, 0) + 1
            elif e.type == te_type.TYPE_SLICE_END:
                ends[e.track_uuid] = ends.get(e.track_uuid, 0) + 1
            elif e.type == te_type.TYPE_COUNTER:
                counters += 1
                assert tracks[e.track_uuid].HasField("counter")
            elif e.type == te_type.TYPE_INSTANT:
                instants += 1
            counters += len(e.extra_counter_values)
            assert all(tracks[u].HasField("counter") for u in e.extra_counter_track_uuids)
            flows_out += list(e.flow_ids_old)
            flows_in += list(e.terminating_flow_ids_old)
    assert begins == ends
    s = trace.scopes
    has_gpu = s.has_gpu()
    thread_slices = sum(
        n for u, n in begins.items() if tracks[u].HasField("thread") and tracks[u].thread.pid == 4242
    )
    assert thread_slices == len(s)
    gpu_pid = chrome.GPU_PID_BASE
    labelled = (
        int((trace.spans.label != trace.names.index("")).sum()) if "" in trace.names else len(trace.spans)
    )
    gpu_slices = sum(
        n for u, n in begins.items() if tracks[u].HasField("thread") and tracks[u].thread.pid == gpu_pid
    )
    assert gpu_slices == int(has_gpu.sum()) + labelled
    assert sorted(flows_out) == sorted(flows_in) == sorted((np.flatnonzero(has_gpu) + 1).tolist())
    waits = sum(n for u, n in begins.items() if tracks[u].name.startswith("queued · "))
    gap_ok = has_gpu & (s.submit_ns != NO_TIME) & (s.gpu_start_ns >= s.submit_ns)
    assert waits == int(gap_ok.sum())
    # the same picture as the JSON: slices, flows, async waits, counter samples, instants
    events, _ = chrome.to_events(trace)
    assert thread_slices + gpu_slices == sum(1 for e in events if e["ph"] == "X")
    # (flows in the JSON: v1 "s" events, or v2 "flow_out" on the CPU slice)
    assert len(flows_out) == sum(1 for e in events if e["ph"] == "s" or e.get("flow_out"))
    assert waits == sum(1 for e in events if e["ph"] == "b")
    # queue depth: two samples per scope with a submission (a nested scope's work counts in its parent's)
    par = np.maximum(s.parent, 0)
    nested = (s.parent >= 0) & has_gpu[par] & (s.queue[par] == s.queue)
    counted = has_gpu & (s.submit_ns != NO_TIME) & (s.queue >= 0) & ~nested
    assert counters == 2 * int(counted.sum())
    json_counters = sum(1 for e in events if e["ph"] == "C")
    assert json_counters in (0, counters)  # (a lean JSON leaves them to the viewer)
    assert instants == sum(1 for e in events if e["ph"] == "i")
    for d in tracks.values():
        if d.HasField("process") and d.process.pid >= gpu_pid:
            assert d.process.process_name.startswith("GPU 0")


def test_clock_snapshots_tie_the_clocks_to_monotonic(tmp_path: Path) -> None:
    pb = _perfetto_protos()
    trace = gputrace.load(DATA / "story.json")
    msg = pb.Trace()
    msg.ParseFromString(pftrace.dumps(trace))
    snaps = [p.clock_snapshot for p in msg.packet if p.HasField("clock_snapshot")]
    first = snaps[0]
    assert first.primary_trace_clock == 3  # CLOCK_MONOTONIC, the session clock
    assert {c.clock_id: c.is_incremental for c in first.clocks} == {3: False, pftrace.CLK: True}
    fit = trace.clock_fits[0]
    gpu = [s for s in snaps[1:] if any(c.clock_id == pftrace.GPU_CLOCK for c in s.clocks)]
    assert len(gpu) == 2
    for snap in gpu:
        cpu = next(c.timestamp for c in snap.clocks if c.clock_id == 3)
        g = next(c.timestamp for c in snap.clocks if c.clock_id == pftrace.GPU_CLOCK)
        assert int(fit.to_cpu(np.array([g], np.int64))[0]) == pytest.approx(cpu, abs=1)


# -- Perfetto's importer (where a trace_processor binary is installed) -----------------------------


def test_perfetto_imports_it_like_the_json(tmp_path: Path) -> None:
    reason = perfetto_tp.skip_reason()
    if reason:
        pytest.skip(reason)
    trace = through_json(synthetic(30, 4), tmp_path)
    pf = perfetto_tp.import_report(pftrace.write(trace, tmp_path / "t.pftrace"))
    js = perfetto_tp.import_report(tmp_path / "canon.json")
    assert pf["errors"] == [] and js["errors"] == []
    for key in ("slices", "flows", "async_total", "slices_per_process"):
        assert pf[key] == js[key], key
