"""The CUPTI timing path, exactly, with a scripted activity source and a fake clock (no GPU).

The fake source stamps launch calls with the session clock plus a CLOCK_REALTIME-like offset and
schedules each operation ``latency_ns`` after its call (or after its stream's previous work), so
every aligned time is known to the nanosecond.
"""

from __future__ import annotations

import random
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace
from gputrace.backends.cupti import CuptiBackend
from gputrace.clock import FakeClock
from gputrace.model import NO_TIME, Flag
from gputrace.records import OP_MEMCPY, RawRecording
from gputrace.resolver import resolve
from gputrace.summary import summarize
from tests import perfetto_rules
from tests.builders import launch_blocks
from tests.cupti_fake import FakeActivitySource


def _session(
    path: Path | None = None, flush_s: float = 1.0, **src_opts: object
) -> tuple[gputrace.session, FakeActivitySource, FakeClock]:
    """A session timed by a fake CUPTI source; ``flush_s``: how often its timer writes a chunk."""
    clock = FakeClock(1_000_000, 1_000)
    src = FakeActivitySource(clock, **src_opts)  # type: ignore[arg-type]
    backend = CuptiBackend(clock, source=src)
    return gputrace.session(path, backend=backend, clock=clock, quiet=True, flush_s=flush_s), src, clock


def _ops_named(t: gputrace.Trace, name: str) -> list[int]:
    return np.flatnonzero(t.ops.name == t.names.index(name)).tolist()


def test_times_are_exact_and_the_launch_sits_inside_its_scope() -> None:
    s, src, clock = _session()
    with s:
        with gputrace.trace("step"):
            call_at = clock.now_ns
            src.launch("k", gpu_ns=500)
    t = s.trace
    assert t is not None and len(t.ops) == 1
    (sc,) = t.find("step")
    assert int(t.ops.scope[0]) == sc.index
    assert int(t.ops.call_start_ns[0]) == call_at  # the source clock mapped back exactly
    assert int(t.ops.call_end_ns[0]) == call_at + 1_000
    assert int(t.ops.gpu_start_ns[0]) == call_at + 3_000  # latency_ns after the call started
    assert int(t.ops.gpu_end_ns[0]) == call_at + 3_500
    assert (sc.gpu_start_ns, sc.gpu_end_ns) == (call_at + 3_000, call_at + 3_500)
    assert sc.submit_ns == call_at  # submission: the launch call of the scope's first operation
    assert sc.queue_gap_ns == 3_000  # queued: launch call → GPU start, not scope entry → start
    assert t.names[int(t.ops.call_name[0])] == "cuLaunchKernel"
    assert t.threads[int(t.ops.thread[0])].tid == threading.get_native_id()
    assert t.header["backend_info"]["timing"] == "cupti"
    assert t.header["devices"][0]["timing"] == "cupti"
    assert t.header["ops"] == {"count": 1, "unattributed": 0}
    assert not sc.flags & Flag.EMPTY


def test_nesting_hull_busy_and_empty_by_fact() -> None:
    s, src, clock = _session(latency_ns=0)
    with s:
        with gputrace.trace("outer"):
            for ns in (1_000, 2_000):
                with gputrace.trace("inner"):
                    src.launch("a", gpu_ns=ns)
                    clock.advance(50_000)  # the GPU idles, waiting for the next launch
                    src.launch("b", gpu_ns=ns)
            with gputrace.trace("nothing"):
                pass
    t = s.trace
    assert t is not None
    busy = t.busy_ns()
    inner = t.find("inner")
    assert [int(busy[sc.index]) for sc in inner] == [2_000, 4_000]
    for sc in inner:
        rows = np.flatnonzero(t.ops.scope == sc.index)
        assert len(rows) == 2
        assert sc.gpu_start_ns == int(t.ops.gpu_start_ns[rows].min())
        assert sc.gpu_end_ns == int(t.ops.gpu_end_ns[rows].max())
        assert (sc.gpu_ns or 0) > 50_000 > busy[sc.index]  # span ≫ busy: launch-bound
    (outer,) = t.find("outer")
    assert int(busy[outer.index]) == 6_000
    assert outer.gpu_start_ns == inner[0].gpu_start_ns and outer.gpu_end_ns == inner[1].gpu_end_ns
    (nothing,) = t.find("nothing")
    assert nothing.flags & Flag.EMPTY and nothing.gpu_start_ns is None
    assert not any(sc.flags & Flag.EMPTY for sc in (*inner, outer))


def test_threads_and_streams_each_operation_once() -> None:
    s, src, _ = _session()
    per_thread = 60

    def work(k: int) -> None:
        for i in range(per_thread):
            with gputrace.trace("tagged", thread=k, i=i):
                src.launch("tagged", stream=100 + 2 * k + i % 2, grid=(i + 1, k + 1, 1))

    with s:
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    t = s.trace
    assert t is not None and len(t) == 4 * per_thread
    rows = _ops_named(t, "tagged")
    assert len(rows) == 4 * per_thread
    owners = t.ops.scope[rows].tolist()
    assert len(set(owners)) == len(owners) and min(owners) >= 0
    for r, o in zip(rows, owners, strict=True):
        sc = t.scope(o)
        assert t.ops.grid[r].tolist() == [sc.args["i"] + 1, sc.args["thread"] + 1, 1]
        assert t.threads[int(t.ops.thread[r])] == sc.thread
    assert len({int(q) for q in t.ops.queue[rows]}) == 8
    assert sorted(q.label for q in t.queues) == sorted(f"stream {100 + n}" for n in range(8))


def test_graph_replays_belong_to_the_scope_around_the_launch() -> None:
    s, src, _ = _session()
    with s:
        for _ in range(3):
            with gputrace.trace("replay"):
                src.launch_graph(42, [("g1", 1_000), ("g2", 2_000), ("g3", 500)])
    t = s.trace
    assert t is not None
    busy = t.busy_ns()
    for sc in t.find("replay"):
        rows = np.flatnonzero(t.ops.scope == sc.index)
        assert [t.names[int(t.ops.name[r])] for r in rows] == ["g1", "g2", "g3"]
        assert t.ops.graph_id[rows].tolist() == [42, 42, 42]
        assert t.ops.graph_node_id[rows].tolist() == [1, 2, 3]
        assert len(set(t.ops.correlation[rows].tolist())) == 1  # one launch call
        assert int(busy[sc.index]) == 3_500 == sc.gpu_ns


def test_work_launched_outside_every_scope_is_kept() -> None:
    s, src, _ = _session()
    with s:
        src.launch("loose", gpu_ns=700)
        with gputrace.trace("step"):
            src.launch("Memcpy DtoH", kind=OP_MEMCPY, nbytes=4096)
    t = s.trace
    assert t is not None
    (loose,) = _ops_named(t, "loose")
    assert int(t.ops.scope[loose]) == -1
    assert t.header["ops"] == {"count": 2, "unattributed": 1}
    (cp,) = _ops_named(t, "Memcpy DtoH")
    assert int(t.ops.kind[cp]) == OP_MEMCPY and int(t.ops.bytes[cp]) == 4096


def test_another_client_taking_cupti_flags_untimed_and_is_taken_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    s, src, _ = _session()
    with s:
        with gputrace.trace("before"):
            src.launch("k")
        gputrace.sync()
        src.take_over()  # torch.profiler starts, records go to it ...
        with gputrace.trace("during"):
            src.launch("k")
        with gputrace.trace("idle"):
            pass
        src.release()  # ... and stops
        gputrace.sync()  # the canary is missing: blind stretch, CUPTI taken back
        with gputrace.trace("after"):
            src.launch("k")
    t = s.trace
    assert t is not None
    assert t.find("before")[0].gpu_start_ns is not None
    for name in ("during", "idle"):
        (sc,) = t.find(name)
        assert sc.flags & Flag.UNTIMED and not sc.flags & Flag.EMPTY and sc.gpu_start_ns is None
    assert t.find("after")[0].gpu_start_ns is not None
    assert src.started == 2 and src.lost == 3  # the kernel, its launch call, the sync's call
    assert len(t.header["backend_info"]["blind"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUPTI records stopped arriving" in err[0] and "took CUPTI back" in err[0]


def test_launch_calls_whose_operations_never_arrive_make_their_scopes_untimed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    s, src, _ = _session()
    with s:
        with gputrace.trace("seen"):
            src.launch("k")
        gputrace.sync()
        src.lose_ops = True  # the calls arrive, their kernels never do
        for _ in range(3):
            with gputrace.trace("lost"):
                src.launch("k")
        gputrace.sync()
        src.lose_ops = False
        with gputrace.trace("idle"):
            pass
        gputrace.sync()
        with gputrace.trace("after"):
            src.launch("k")
    t = s.trace
    assert t is not None
    assert t.find("seen")[0].gpu_start_ns is not None and t.find("after")[0].gpu_start_ns is not None
    for sc in t.find("lost"):
        assert sc.flags & Flag.UNTIMED and not sc.flags & Flag.EMPTY and sc.gpu_start_ns is None
    (idle,) = t.find("idle")  # launched nothing, outside the lost stretch: empty by fact
    assert idle.flags & Flag.EMPTY and not idle.flags & Flag.UNTIMED
    info = t.header["backend_info"]
    assert info["launch_calls_without_operations"] == 3 and len(info["blind"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not the GPU operations they launched" in err[0]


@pytest.mark.parametrize("rate", [1.0, 2.1, 0.5])
def test_a_source_clock_not_in_ns_is_converted(rate: float, capsys: pytest.CaptureFixture[str]) -> None:
    """After torch.profiler ran, CUPTI counts Kineto's TSC ticks (2.1 per ns on the H200)."""
    clock = FakeClock(0, 1_000)
    src = FakeActivitySource(clock, ticks_per_ns=rate)
    with gputrace.session(backend=CuptiBackend(clock, source=src), clock=clock, quiet=True) as s:
        for i in range(5):
            with gputrace.trace("work"):
                src.launch("k", gpu_ns=700 + i)
            gputrace.sync()
    t = s.trace
    assert t is not None
    assert t.header["ops"] == {"count": 5, "unattributed": 0}
    for i, sc in enumerate(t.find("work")):
        (r,) = np.flatnonzero(t.ops.scope == sc.index)
        assert abs(int(t.ops.gpu_end_ns[r] - t.ops.gpu_start_ns[r]) - (700 + i)) <= 2
        assert sc.flags & (Flag.EMPTY | Flag.UNTIMED) == 0
    info = t.header["backend_info"]
    assert abs(info["source_ticks_per_ns"] - rate) < 1e-3 * rate
    err = capsys.readouterr().err
    assert err.count("ticks per ns") == (0 if rate == 1.0 else 1)


def test_operations_of_the_last_collect_before_a_sync_are_not_taken_for_lost() -> None:
    s, src, _ = _session()
    with s:
        for _ in range(3):
            with gputrace.trace("k"):
                src.launch("k")
            gputrace.sync()
    t = s.trace
    assert t is not None
    assert t.header["backend_info"]["launch_calls_without_operations"] == 0
    assert all(sc.gpu_start_ns is not None for sc in t.find("k"))


def test_a_client_still_active_is_left_alone_and_noticed_once(capsys: pytest.CaptureFixture[str]) -> None:
    s, src, _ = _session()
    with s:
        gputrace.sync()
        src.take_over("torch.profiler is recording and holds CUPTI")
        for _ in range(2):
            with gputrace.trace("during"):
                src.launch("k")
            gputrace.sync()
    t = s.trace
    assert t is not None
    assert src.started == 1  # never re-registered while the other tool records
    assert all(sc.flags & Flag.UNTIMED for sc in t.find("during"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "torch.profiler is recording" in err[0]


def test_resolve_is_pure_over_record_order() -> None:
    s, src, _ = _session()
    with s:
        for i in range(20):
            with gputrace.trace("k"):
                src.launch(f"op{i % 3}", stream=i % 2, gpu_ns=100 * (i + 1))
    raw: RawRecording = s._raw
    a = resolve(raw)
    assert sum(len(batch) for batch in raw.batches) == 20
    rng = random.Random(1)
    for batch in raw.batches:  # the operations in another order, within and across batches
        order = list(range(len(batch)))
        rng.shuffle(order)
        batch.rows = batch.rows[order]
    rng.shuffle(raw.batches)
    b = resolve(raw)
    assert a.names == b.names
    for col in a.ops.COLUMNS:
        assert np.array_equal(getattr(a.ops, col), getattr(b.ops, col)), col


def test_round_trip_layout_and_hta_fields(tmp_path: Path) -> None:
    path = tmp_path / "cupti.json"
    s, src, _ = _session(path)
    with s:
        with gputrace.trace("step"):
            src.launch("k", gpu_ns=2_000)
            src.launch("Memcpy HtoD", kind=OP_MEMCPY, nbytes=1 << 20)
        src.launch("loose")
    t = s.trace
    assert t is not None
    back = gputrace.load(path)
    assert back.names == t.names
    for col in t.ops.COLUMNS:
        assert np.array_equal(getattr(t.ops, col), getattr(back.ops, col)), col
    assert np.array_equal(back.busy_ns(), t.busy_ns())
    doc = perfetto_rules.read(path)
    assert perfetto_rules.check(doc) == []
    assert doc["distributedInfo"] == {"rank": 0}
    ev = doc["traceEvents"]
    kern = [e for e in ev if e.get("cat") == "kernel"]
    memcpy = [e for e in ev if e.get("cat") == "gpu_memcpy"]
    calls = [e for e in ev if e.get("cat") == "cuda_driver"]
    assert len(kern) == 2 and len(memcpy) == 1 and len(calls) == 3
    for e in kern + memcpy:
        assert {"device", "stream", "correlation", "External id"} <= set(e["args"])
    by_corr = {c["args"]["correlation"]: c for c in calls}
    for e in kern + memcpy:
        c = by_corr[e["args"]["correlation"]]
        assert c["ts"] <= e["ts"]  # launch before execution
    for e in kern + memcpy:  # a flow (v2) from each launch call to its operation, bound at both ends
        c = by_corr[e["args"]["correlation"]]
        assert e["flow_in"] is True and c["flow_out"] is True and c["bind_id"] == e["bind_id"]
    assert not [e for e in ev if e.get("ph") in ("s", "f")]  # flow v2 only: never mixed with v1


def test_summary_per_kernel_rows_busy_and_timing_source() -> None:
    s, src, clock = _session(latency_ns=0)
    with s:
        for _ in range(4):
            with gputrace.trace("step"):
                src.launch("gemm", gpu_ns=3_000)
                clock.advance(10_000)
                src.launch("relu", gpu_ns=1_000)
    t = s.trace
    assert t is not None
    out = summarize(t)
    (row,) = [r for r in out["rows"] if r["name"] == "step"]
    kernels = {k["name"]: k for k in row["ops"]}
    assert set(kernels) == {"gemm", "relu"}
    assert kernels["gemm"]["calls"] == 4 and kernels["gemm"]["gpu_ns"]["median"] == 3_000
    assert kernels["relu"]["gpu_ns"]["median"] == 1_000
    assert kernels["gemm"]["launch_to_start_ns"]["median"] == 0
    assert row["gpu_busy_ns"]["median"] == 4_000
    assert row["gpu_busy_ns"]["median"] < row["gpu_ns"]["median"]
    assert out["timing"] == [{"device": 0, "timing": "cupti"}]
    assert out["cupti_dropped_records"] == 0
    from gputrace.render import to_table

    text = to_table(out)
    assert "gemm" in text and "busy" in text and "cupti" in text


def test_no_ops_in_a_cpu_only_trace_changes_nothing() -> None:
    with gputrace.session(backend="cpu", quiet=True) as s:
        with gputrace.trace("x"):
            pass
    t = s.trace
    assert t is not None and len(t.ops) == 0
    assert t.busy_ns().tolist() == [0]
    assert t.scopes.gpu_start_ns[0] == NO_TIME


def test_os_thread_ids_are_used_as_they_come() -> None:
    """A tool may switch CUPTI to OS thread ids: those are attributed directly."""
    s, src, _ = _session(pthread_ids=False)
    with s:
        with gputrace.trace("step"):
            src.launch("k")
    t = s.trace
    assert t is not None and t.ops.scope.tolist() == [0]


def test_a_reused_pthread_id_still_finds_its_thread() -> None:
    """Threads run one after another often get the same pthread id: each launch still lands in
    the scope of the thread that made it."""
    s, src, _ = _session()

    def work(k: int) -> None:
        with gputrace.trace("t", k=k):
            src.launch("k")

    with s:
        for k in range(4):
            th = threading.Thread(target=work, args=(k,))
            th.start()
            th.join()
    t = s.trace
    assert t is not None
    owners = t.ops.scope.tolist()
    assert sorted(t.scope(o).args["k"] for o in owners) == [0, 1, 2, 3]
    for o, th in zip(owners, t.ops.thread.tolist(), strict=True):
        assert t.scope(o).thread == t.threads[th]


def test_scope_gpu_slices_carry_busy_time_and_timing_source(tmp_path: Path) -> None:
    path = tmp_path / "busy.json"
    s, src, clock = _session(path, latency_ns=0)
    with s:
        with gputrace.trace("step"):
            src.launch("a", gpu_ns=1_000)
            clock.advance(20_000)
            src.launch("b", gpu_ns=2_000)
    doc = perfetto_rules.read(path)
    # a scope's GPU slice (cat "gpu"), in a GPU process (gputrace.exporters.json)
    (gpu,) = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "gpu"]
    assert gpu["args"]["gpu_busy_us"] == 3.0 and gpu["args"]["timing"] == "cupti"
    assert gpu["dur"] > 20.0  # the span: the GPU waited for the second launch


def test_a_streamed_file_numbers_operations_and_flows_across_chunks(tmp_path: Path) -> None:
    """Chunks written at each sync: operation numbers and flow ids never repeat, every operation
    reads back under its scope, and an operation launched in a scope still open at a sync waits
    for that scope's chunk."""
    path = tmp_path / "chunks.json"
    s, src, clock = _session(path)
    with s:
        with gputrace.trace("outer"):
            src.launch("before", gpu_ns=1_000)
            for i in range(3):
                with gputrace.trace("step", i=i):
                    src.launch("k", gpu_ns=2_000)
                    src.launch("k2", gpu_ns=1_000)
                clock.advance(5_000)
                gputrace.sync()  # the open "outer" scope keeps its own operation for later
    back = gputrace.load(path)
    assert len(back.ops) == 7 and (back.ops.scope >= 0).all()
    assert back.header["ops"] == {"count": 7, "unattributed": 0}  # as a file written at once says
    outer = back.find("outer")[0].index
    before = _ops_named(back, "before")
    assert [int(back.ops.scope[k]) for k in before] == [outer]
    for st in back.find("step"):
        mine = np.flatnonzero(back.ops.scope == st.index)
        assert sorted(back.names[int(back.ops.name[k])] for k in mine) == ["k", "k2"]
    doc = perfetto_rules.read(path)
    ops = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert sorted(e["args"]["op"] for e in ops) == list(range(7))
    flows = [e["bind_id"] for e in ops if "bind_id" in e]
    assert len(flows) == len(set(flows)) == 7


@pytest.mark.parametrize("method", ["queues", "calibrate"])
def test_a_backend_method_failing_every_time_still_leaves_a_valid_file(tmp_path: Path, method: str) -> None:
    """No queue names, or no clock fit: operations still land on listed tracks, and none is drawn
    off the time line (the header counts what could not be placed)."""
    from tests.faults import inject

    path = tmp_path / "faulty.json"
    with inject(CuptiBackend, method, "every"), warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        s, src, _ = _session(path)
        with s:
            for _ in range(3):
                with gputrace.trace("step"):
                    src.launch("k", gpu_ns=1_000)
                gputrace.sync()
    back = gputrace.load(path)  # loads; the autouse fixture checks the Perfetto rules
    assert len(back.find("step")) == 3
    assert back.header.get("problems")
    if method == "calibrate":  # no fit: the CUPTI clock cannot be placed on the session's
        assert back.header.get("ops_not_drawn", 0) + len(back.ops) == 3


def test_stated_uncertainty_includes_the_sources_own_error() -> None:
    """CUPTI maps GPU timestamps onto its CPU clock itself; that error is stated too."""

    def run(source_error_ns: int) -> list[int]:
        clock = FakeClock(0, 1_000)
        src = FakeActivitySource(clock)
        backend = CuptiBackend(clock, source=src)
        backend.source_error_ns = source_error_ns
        with gputrace.session(backend=backend, clock=clock, quiet=True) as s:
            for _ in range(3):
                with gputrace.trace("work"):
                    src.launch("k", gpu_ns=800)
            with gputrace.trace("nothing"):
                pass
        t = s.trace
        assert t is not None
        assert t.find("nothing")[0].uncertainty_ns == 0  # no GPU time, nothing stated
        return [sc.uncertainty_ns for sc in t.find("work")]

    with_error, without = run(1_000), run(0)
    assert [u - w for u, w in zip(with_error, without, strict=True)] == [1_000] * 3
    assert CuptiBackend.source_error_ns == 1_000


def test_operations_find_their_scopes_across_the_pieces_of_one_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of many scopes goes out in pieces; a kernel whose scope is in a later piece waits
    for it (at 100k scopes, half of the kernels were written without their scope)."""
    from gputrace import streaming

    monkeypatch.setattr(streaming, "PIECE", 7)
    path = tmp_path / "pieces.json"
    s, src, _ = _session(path)
    with s:
        for i in range(30):
            with gputrace.trace("tiny", i=i):
                src.launch("k", gpu_ns=100)
        src.launch("loose")
    back = gputrace.load(path)
    assert len(back) == 30 and len(back.ops) == 31
    (loose,) = _ops_named(back, "loose")
    assert int(back.ops.scope[loose]) == -1
    owners = [int(back.ops.scope[r]) for r in _ops_named(back, "k")]
    assert sorted(owners) == sorted(sc.index for sc in back.find("tiny"))


def test_cupti_streams_without_syncs_and_no_kernel_loses_its_scope(tmp_path: Path) -> None:
    """No sync at all: the streamer's timer collects what CUPTI delivered and writes the scopes
    that ended before every launch still waiting for its kernel; one scope whose kernel has not
    arrived (held back by the fake, like a kernel still queued) waits, and is written with it."""
    path = tmp_path / "bg.json"
    s, src, _ = _session(path, flush_s=0.05)
    with s:
        for i in range(20):
            with gputrace.trace("early", i=i):
                src.launch("k", gpu_ns=100)
        with gputrace.trace("late"):
            src.launch("slow", gpu_ns=100)
            held = src._ops.pop()  # its kernel has not finished: not delivered yet
        for i in range(5):
            with gputrace.trace("after", i=i):
                src.launch("k", gpu_ns=100)
        deadline = time.monotonic() + 10
        early: list[int] = []
        while len(early) < 10 and time.monotonic() < deadline:
            time.sleep(0.02)
            got = gputrace.load(path)  # the file as it stands while the program runs
            early = [int(got.ops.scope[r]) for r in _ops_named(got, "k")] if "k" in got.names else []
        # written in the background (all but the last few, within the horizon's margin), each
        # kernel under its scope
        assert len(early) >= 10 and min(early) >= 0
        assert not got.find("late")  # its kernel has not arrived: it waits
        src._ops.append(held)  # the kernel finishes
    back = gputrace.load(path)
    assert len(back) == 26 and len(back.ops) == 26
    assert int((back.ops.scope < 0).sum()) == 0  # every kernel under its scope
    (slow,) = _ops_named(back, "slow")
    assert back.scope(int(back.ops.scope[slow])).name == "late"


def test_a_cupti_run_without_any_scope_streams_and_keeps_every_operation(tmp_path: Path) -> None:
    """Kernels launched outside every scope, no sync: the timer writes them as they come (scope
    −1), nothing piles up in the program. (Before: a chunk with no scope was never written, so the
    operations collected piled up, each collect went over all of them, the timer spun throttling a
    program that had no scope exit to wait at (35.7 s for a 1.4 s loop of 100k kernels on the
    H200), and the stop dropped them all: 0 operations in the file.)"""
    path = tmp_path / "loose.json"
    s, src, _ = _session(path, flush_s=0.05)
    with s:
        for _ in range(30):
            src.launch("loose", gpu_ns=100)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "loose" not in gputrace.load(path).names:
            time.sleep(0.02)
        assert len(gputrace.load(path).ops) == 30  # written while the program runs
        for _ in range(5):
            src.launch("loose", gpu_ns=100)
    back = gputrace.load(path)
    assert len(back) == 0 and len(back.ops) == 35
    assert back.header["ops"] == {"count": 35, "unattributed": 35}


def test_a_long_cupti_run_without_syncs_holds_a_bounded_number_of_operations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory stays flat over a run of any length: no sync, so only the streamer's timer collects;
    it collects as soon as a few buffers' worth of records wait, and while the operations outrun
    the writer the program waits at its scope exits. What is held (records waiting in the source,
    operations collected and not written) stays a small fraction of the run, and nothing is lost.
    (Before: collected once a second, the records waiting grew with the run.)"""
    from gputrace import streaming

    monkeypatch.setattr(streaming, "COLLECT_BYTES", 1 << 20)  # ~3,500 kernels with their calls
    monkeypatch.setattr(streaming, "OPS_BACKLOG", 5_000)
    monkeypatch.setattr(streaming, "BACKLOG_CHECK_S", 0.01)
    total, per = 400_000, 100
    path = tmp_path / "long.json.gz"
    from gputrace.clock import session_clock

    src = FakeActivitySource(session_clock, latency_ns=500)
    backend = CuptiBackend(session_clock, source=src)
    s = gputrace.session(path, backend=backend, quiet=True)
    with s:
        peak_waiting = launch_blocks(src, backend, total, per)
    bytes_per_op = streaming.COLLECT_BYTES / 3_500
    # (unbounded: nearly all of it by the end; bounded: 2-40k ops seen on a loaded 2-core machine)
    assert peak_waiting / bytes_per_op < total / 2
    back = gputrace.load(path)
    assert len(back) == total // per and len(back.ops) == total
    assert int((back.ops.scope < 0).sum()) == 0
    assert back.header["streamed"]["chunks"] >= 10


def test_the_start_up_self_check_accepts_a_known_memset_and_refuses_one_decoded_wrong() -> None:
    """At start, one memset of a known odd size is launched and its records must decode to what
    was launched; a layout read wrong (a field at the wrong offset) fails the check, and the cuda
    backend then falls back to events."""
    import threading as th

    from gputrace.backends.cupti import SELF_CHECK_BYTES, self_check_problem
    from gputrace.records import OP_MEMSET

    clock = FakeClock(0, 1_000)
    src = FakeActivitySource(clock)
    src.launch("k", gpu_ns=100)  # other work before it is no concern
    t0 = src.timestamp()
    src.launch("Memset", kind=OP_MEMSET, nbytes=SELF_CHECK_BYTES, gpu_ns=300)
    src.sync()
    t1 = src.timestamp() + 10_000
    ops, calls = src.drain()
    tids = (th.get_ident(), th.get_native_id())

    def check(o: np.ndarray, c: np.ndarray, **kw: Any) -> str | None:
        args: dict[str, Any] = dict(nbytes=SELF_CHECK_BYTES, device=0, tids=tids, t0=t0, t1=t1)
        return self_check_problem(o, c, **{**args, **kw})

    assert check(ops, calls) is None
    assert "0 memset records" in str(check(ops, calls, nbytes=SELF_CHECK_BYTES + 1))
    assert "device" in str(check(ops, calls, device=1))
    assert "thread" in str(check(ops, calls, tids=(12345,)))
    shifted = ops.copy()
    shifted["correlation"] += 1_000  # the correlation field read at the wrong offset
    assert "without its launch call" in str(check(shifted, calls))
    late = ops.copy()
    late["start"], late["end"] = ops["end"], ops["start"]  # start and end swapped
    assert "times" in str(check(late, calls))
    assert "another API call" in str(check(ops, calls, call_name=src.call_name))  # cuLaunchKernel
    # a first memset in the process returns late (lazy loading), long after its memset ran: fine
    slow = calls.copy()
    slow["end"] = int(ops["end"].max()) + 5_000_000
    assert check(ops, slow, t1=int(slow["end"].max()) + 1) is None
    early = calls.copy()
    early["start"] = int(ops["start"].max()) + 1  # a call starting after its memset: read wrong
    assert "times" in str(check(ops, early))


def test_records_of_work_still_running_are_left_out_and_counted(tmp_path: Path) -> None:
    """No sync while kernels run for a long time: the streamer's drains force CUPTI's buffers
    out, and records of work still running come with zero timestamps. They still match their
    launch calls (so later scopes are not held back), then are left out and counted, never
    written at time 0 (they were, at absurd times, before)."""
    from gputrace.backends.cupti_records import unfinished
    from gputrace.clock import session_clock

    clock = FakeClock(0, 1_000)
    src = FakeActivitySource(clock)
    src.unfinished_at_drain = True
    src.launch("done", gpu_ns=100)
    clock.advance(1_000_000)
    src.launch("running", gpu_ns=10**12)
    ops, calls = src.drain()
    assert unfinished(ops).tolist() == [False, True] and len(calls) == 2

    path = tmp_path / "running.json"
    src = FakeActivitySource(session_clock)
    src.unfinished_at_drain = True
    s = gputrace.session(path, backend=CuptiBackend(session_clock, source=src), quiet=True, flush_s=0.01)
    with s:
        for i in range(20):
            with gputrace.trace("step", i=i):
                src.launch("k", gpu_ns=5_000_000)  # queued one after the other: 100 ms of work
            time.sleep(0.002)  # the timer collects while kernels still run
        time.sleep(0.15)  # all done before the stop
    back = gputrace.load(path)
    lost = back.header["backend_info"]["cupti_incomplete_records"]
    assert lost > 0 and len(back.ops) + lost == 20 and int((back.ops.scope < 0).sum()) == 0
    took = back.ops.gpu_end_ns - back.ops.gpu_start_ns  # (the real clock's fit: a few ns of slope)
    assert np.abs(took - 5_000_000).max() < 100
    assert back.header["streamed"]["chunks"] >= 2


def test_a_launch_after_a_child_ended_belongs_to_the_open_ancestor_at_any_depth() -> None:
    """The innermost scope still open at the launch call, found for every call at once: after a
    child ended its parent, after a grandchild ended its grandparent's child, after all ended none."""
    s, src, _ = _session()
    with s:
        with gputrace.trace("outer"):
            with gputrace.trace("inner"):
                src.launch("k1")
            src.launch("k2")
            with gputrace.trace("inner2"):
                with gputrace.trace("deep"):
                    with gputrace.trace("deeper"):
                        src.launch("k3")
                src.launch("k4")
            src.launch("k5")
        src.launch("k6")
    t = s.trace
    assert t is not None
    got = {}
    for k in ("k1", "k2", "k3", "k4", "k5", "k6"):
        (row,) = _ops_named(t, k)
        scope = int(t.ops.scope[row])
        got[k] = t.scope(scope).name if scope >= 0 else None
    assert got == {"k1": "inner", "k2": "outer", "k3": "deeper", "k4": "inner2", "k5": "outer", "k6": None}
