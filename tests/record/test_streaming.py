"""Streaming sessions: chunks appended as the program runs, files cut by a crash still load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from click.testing import CliRunner

import gputrace
from gputrace.backends.fake import FakeBackend
from gputrace.cli import cli
from gputrace.clock import FakeClock
from gputrace.exporters import json as json_format
from gputrace.exporters.opener import read_trace
from gputrace.model import FORMAT_VERSION
from tests import perfetto_rules
from tests.builders import T0, child_env, cupti_trace

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def run_killed(path: Path, how: str, seconds: float = 2.0) -> int:
    env = child_env()
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "killed.py"), str(path), how, str(seconds)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert out.returncode == (-signal.SIGKILL if how == "kill" else 3), out.stderr
    return int(out.stdout.split()[-1])


@pytest.mark.parametrize(
    ("how", "name"), [("kill", "t.json"), ("exit", "t.json"), ("kill", "t.json.gz"), ("exit", "t.pftrace")]
)
def test_a_killed_program_leaves_a_file_that_loads(tmp_path: Path, how: str, name: str) -> None:
    synced = run_killed(tmp_path / name, how)
    assert synced >= 1000
    path = gputrace.exporters.canonical(tmp_path / name)  # a .pftrace session streams its .json.gz
    with pytest.raises(orjson.JSONDecodeError):  # really cut: not a complete JSON document
        orjson.loads(read_trace(path)[0])
    trace = gputrace.load(path)
    assert trace.header["truncated"] is True
    # every scope recorded before the last sync is there, in order, with its args
    assert len(trace) >= synced
    assert trace.names[0] == "step" and int(np.count_nonzero(trace.scopes.name == 0)) >= synced
    starts = trace.scopes.cpu_start_ns
    assert (np.diff(starts) >= 0).all()
    assert [trace.scopes.args[r]["i"] for r in sorted(trace.scopes.args)][: synced // 100] == list(
        range(0, synced, 100)
    )
    res = CliRunner().invoke(cli, ["summarize", str(path)])
    assert res.exit_code == 0, res.output
    assert f"{len(trace)} scopes" in res.output
    assert "ends early" in res.output
    # what gputrace view serves (to the viewer and to Perfetto) is complete
    doc = orjson.loads(json_format.repair(read_trace(path)[0]) or b"")
    assert perfetto_rules.check(doc) == [] and doc["gputrace"]["truncated"] is True


def test_chunks_reach_the_file_while_the_program_runs(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with gputrace.session(path, backend="cpu", quiet=True, flush_s=0.05):
        for _ in range(10):
            with gputrace.trace("early"):
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the timer appends without any sync
            time.sleep(0.05)
            try:
                t = gputrace.load(path)
            except gputrace.GputraceError:
                continue
            if len(t) == 10:
                break
        assert len(t) == 10 and t.header["truncated"] is True
        gputrace.sync()
        with gputrace.trace("late"):
            pass
    final = gputrace.load(path)
    assert "truncated" not in final.header and [s.name for s in final][-1] == "late"
    assert final.header["streamed"]["chunks"] >= 2


def test_after_sync_everything_before_it_is_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    clock = FakeClock(1_000_000, 0)
    with gputrace.session(path, backend=FakeBackend(clock), clock=clock, quiet=True, flush_s=3600):
        for _ in range(5):
            with gputrace.trace("k"):
                clock.advance(1000)
            clock.advance(1000)
        gputrace.sync()
        t = gputrace.load(path)  # before the session stops
        assert len(t) == 5 and t.header["truncated"] is True
        assert (t.scopes.gpu_start_ns != gputrace.model.NO_TIME).all()  # GPU times are in
        assert [s.flag_names for s in t][:2] == [["cold"], []]


def _gpu_story(path: Path, stream: bool) -> gputrace.Trace:
    clock = FakeClock(1_000_000, 0)
    backend = FakeBackend(clock, script=lambda name, i: (2_000 + 10 * i, 5_000 if name == "a" else 1_000))
    s = gputrace.session(path, backend=backend, clock=clock, quiet=True, stream=stream, flush_s=3600)
    with s:
        for step in range(6):
            with gputrace.trace("outer", step=step):
                clock.advance(500)
                for name in ("a", "b"):
                    with gputrace.trace(name):
                        clock.advance(300)
                    clock.advance(200)
            clock.advance(20_000)
            if step % 2:
                gputrace.sync()
    assert s.trace is not None
    return s.trace


def test_a_streamed_trace_matches_one_written_at_stop(tmp_path: Path) -> None:
    whole = _gpu_story(tmp_path / "whole.json", stream=False)
    streamed = _gpu_story(tmp_path / "streamed.json", stream=True)
    assert streamed.header["streamed"]["chunks"] == 4  # 3 syncs + the end
    assert whole.names == streamed.names and whole.threads == streamed.threads
    for col in ("name", "thread", "parent", "depth", "cpu_start_ns", "cpu_end_ns", "submit_ns",
                "gpu_start_ns", "gpu_end_ns", "queue"):  # fmt: skip
        assert np.array_equal(getattr(whole.scopes, col), getattr(streamed.scopes, col)), col
    assert whole.scopes.args == streamed.scopes.args
    # "cold" is the first call in the session, not in the chunk
    assert [s.name for s in streamed if "cold" in s.flag_names] == ["outer", "a", "b"]
    assert perfetto_rules.check(perfetto_rules.read(tmp_path / "streamed.json")) == []


def test_buffers_are_emptied_at_each_sync(tmp_path: Path) -> None:
    with gputrace.session(tmp_path / "t.json", backend="cpu", quiet=True, flush_s=3600) as s:
        for _ in range(3):
            for i in range(500):
                with gputrace.trace("x", i=i) if i % 7 == 0 else gputrace.trace("y"):
                    pass
            gputrace.sync()
            rec = s._recorder
            assert rec is not None
            assert all(not b.log and not b.rich for b in rec.buffers)  # memory stays flat
    assert s.trace is not None and len(s.trace) == 1500


def test_scopes_recorded_by_other_threads_while_flushing(tmp_path: Path) -> None:
    import threading

    stop = threading.Event()
    counts = [0, 0]

    def work(k: int) -> None:
        while not stop.is_set():
            with gputrace.trace(f"t{k}", n=counts[k]) if counts[k] % 3 == 0 else gputrace.trace(f"t{k}"):
                pass
            counts[k] += 1

    path = tmp_path / "t.json"
    with gputrace.session(path, backend="cpu", quiet=True, flush_s=0.01):
        threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join()
    trace = gputrace.load(path)
    assert trace.header["streamed"]["chunks"] >= 2  # at least one chunk while the threads ran
    for k in range(2):
        rows = np.flatnonzero(trace.scopes.name == trace.names.index(f"t{k}"))
        assert len(rows) == counts[k]
        args = [trace.scopes.args[r]["n"] for r in rows.tolist() if r in trace.scopes.args]
        assert args == list(range(0, counts[k], 3))  # every arg stayed with its own scope


@pytest.mark.parametrize("name", ["t.json", "t.json.gz", "t.pftrace"])
def test_every_format_streams_and_reads_back_through_the_registry(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    reference = _gpu_story(tmp_path / "whole.json", stream=False)
    streamed = _gpu_story(path, stream=True)
    assert streamed.header["streamed"]["chunks"] == 4 and "truncated" not in streamed.header
    assert len(streamed) == len(reference)
    for col in ("cpu_start_ns", "cpu_end_ns", "gpu_start_ns", "gpu_end_ns", "submit_ns"):
        assert np.array_equal(getattr(reference.scopes, col), getattr(streamed.scopes, col)), col
    assert gputrace.exporters.format_for(path).__name__.split(".")[-1] == (
        "pftrace" if "pf" in name else "json"
    )


def test_view_serves_a_cut_file_closed(tmp_path: Path) -> None:
    import urllib.request

    from gputrace.viewer_server import ViewerServer

    path = tmp_path / "t.json"
    with gputrace.session(path, backend="cpu", quiet=True, flush_s=3600):
        for _ in range(3):
            with gputrace.trace("s"):
                pass
            gputrace.sync()
        cut = path.read_bytes()  # as a killed program would leave it
    assert cut.count(b'"ph":"X"') == 3
    for end in (len(cut) - 7, cut.rindex(b"}}") + 2):  # cut inside a line, even right after "}}"
        path.write_bytes(cut[:end])
        with ViewerServer(path) as server:
            server.start_background()
            doc = orjson.loads(urllib.request.urlopen(server.trace_url).read())
        whole_lines = cut[: max(cut.rfind(b",\n", 0, end), 0)]  # what the complete chunks hold
        assert len([e for e in doc["traceEvents"] if e["ph"] == "X"]) == whole_lines.count(b'"ph":"X"')
        assert doc["gputrace"]["truncated"] is True
    assert doc["gputrace"]["format_version"] == FORMAT_VERSION and doc["gputrace"]["truncated"] is True
    assert "gputrace_stream" in doc["metadata"]


def test_merge_writes_any_format(tmp_path: Path) -> None:
    data = Path(__file__).resolve().parents[1] / "data"
    for name in ("all.pftrace", "all.json.gz"):
        out = tmp_path / name
        res = CliRunner().invoke(cli, ["merge", str(out), str(data / "rank0.json"), str(data / "rank1.json")])
        assert res.exit_code == 0, res.output
        if name.endswith(".pftrace"):  # an export: Perfetto reads it, gputrace says what to read
            assert out.read_bytes()[:1] == b"\n"  # a Trace.packet
            with pytest.raises(gputrace.GputraceError, match="an export for Perfetto"):
                gputrace.load(out)
            continue
        back = gputrace.load(out)
        assert len(back) == 2 and [p["label"] for p in back.header["processes"]] == ["rank 0", "rank 1"]


def test_a_large_chunk_is_written_in_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrace import streaming

    monkeypatch.setattr(streaming, "PIECE", 100)
    path = tmp_path / "t.json"
    with gputrace.session(path, backend="cpu", quiet=True, flush_s=3600):
        with gputrace.trace("outer"):
            for i in range(450):
                with gputrace.trace("inner", i=i) if i % 2 else gputrace.trace("inner"):
                    pass
            gputrace.mark("m")
        gputrace.sync()
    t = gputrace.load(path)
    assert t.header["streamed"]["chunks"] >= 5  # 225 plain + 225 with args, in pieces of 100
    assert [sc.name for sc in t][:2] == ["outer", "inner"] and len(t) == 451
    assert [sc.depth for sc in t][1:] == [1] * 450  # nesting rebuilt across pieces
    assert [t.scopes.args[r]["i"] for r in sorted(t.scopes.args)] == list(range(1, 450, 2))
    assert [m.name for m in t.marks] == ["m", "sync"]


def test_syncs_from_another_thread_while_the_timer_flushes(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "t.json"
    stop = threading.Event()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch all the time: a race between takers shows
    try:
        n = _record_while_syncing(path, stop)
    finally:
        sys.setswitchinterval(switch)
    t = gputrace.load(path)
    got = sorted(t.scopes.args[r]["n"] for r in np.flatnonzero(t.scopes.name == t.names.index("x")).tolist())
    assert got == list(range(n))  # none lost, none twice


def _record_while_syncing(path: Path, stop: Any) -> int:
    import threading

    with gputrace.session(path, backend="cpu", quiet=True, flush_s=0.001):

        def syncer() -> None:
            while not stop.is_set():
                gputrace.sync()

        th = threading.Thread(target=syncer)
        th.start()
        n = 0
        t_end = time.monotonic() + 0.5
        while time.monotonic() < t_end:
            with gputrace.trace("x", n=n):
                pass
            n += 1
        stop.set()
        th.join()
    return n


def test_a_streamed_pftrace_session_keeps_its_json_gz_and_view_names_it(tmp_path: Path) -> None:
    path = tmp_path / "t.pftrace"
    traced = _gpu_story(path, stream=True)
    assert path.read_bytes()[:1] == b"\n" and len(gputrace.load(tmp_path / "t.json.gz")) == len(traced) == 18
    for cmd in (["view", "--check", str(path)], ["summarize", str(path)]):
        res = CliRunner().invoke(cli, cmd)
        assert res.exit_code == 2 and "t.json.gz" in res.output and len(res.output.strip().splitlines()) == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_never_writes_to_its_parents_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with gputrace.session(path, backend="cpu", quiet=True, flush_s=3600):
        with gputrace.trace("parent"):
            pass
        gputrace.sync()
        before = path.read_bytes()
        pid = os.fork()
        if pid == 0:  # the child records and syncs, then exits without cleanup
            try:
                with gputrace.trace("child"):
                    pass
                gputrace.sync()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert path.read_bytes() == before
    assert [sc.name for sc in gputrace.load(path)] == ["parent"]


def test_a_backlog_makes_recording_threads_wait_and_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without syncs, threads recording faster than the stream writes wait for it past a backlog
    (memory stays bounded), and every scope is written exactly once, in order."""
    from gputrace import streaming

    monkeypatch.setattr(streaming, "BACKLOG_SCOPES", 3_000)
    monkeypatch.setattr(streaming, "BACKLOG_CHECK_S", 0.005)
    n, threads = 40_000, 3
    path = tmp_path / "t.json"
    seen_waiting: list[bool] = []

    def work(k: int) -> None:
        tr = gputrace.trace(f"t{k}")
        for i in range(n):
            with tr:
                pass
            if i % 5_000 == 0:
                seen_waiting.append(type(gputrace.recorder._tls.buf.log).__name__ == "ThrottledLog")

    import threading

    with gputrace.session(path, backend="cpu", quiet=True, flush_s=0.01) as s:
        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        st = s._streamer
        assert st is not None
        throttled = st.throttled
    assert throttled >= 1, "the backlog never made anyone wait"
    t = gputrace.load(path)
    for k in range(threads):
        scopes = t.find(f"t{k}")
        assert len(scopes) == n
        starts = [sc.cpu_start_ns for sc in scopes]
        assert starts == sorted(starts) and len(set(starts)) == n


def test_logs_swapped_out_by_backpressure_are_read_first(tmp_path: Path) -> None:
    """A scope that left during a swap lands in the old log: taken before the new one, at a
    chunk or at stop alike."""
    import gputrace.recorder

    with gputrace.session(tmp_path / "t.json", backend="cpu", quiet=True) as s:
        with gputrace.trace("a"):
            pass
        buf = gputrace.recorder._tls.buf
        old = buf.log
        buf.log = []
        buf.old_logs = [old]
        with gputrace.trace("b"):
            pass
        now = time.perf_counter_ns()  # the session clock
        old.extend(("late", now, now + 10))  # as a scope leaving at the swap would
    t = s.trace
    assert t is not None
    assert sorted(sc.name for sc in t) == ["a", "b", "late"]
    with gputrace.session(backend="cpu", quiet=True) as s2:  # no stream: drained at stop
        with gputrace.trace("a"):
            pass
        buf = gputrace.recorder._tls.buf
        old, buf.log = buf.log, []
        buf.old_logs = [old]
        now = time.perf_counter_ns()
        old.extend(("late", now, now + 10))
    assert s2.trace is not None and sorted(sc.name for sc in s2.trace) == ["a", "late"]


def test_a_chunk_cut_at_the_cupti_horizon_keeps_a_parent_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timer chunk between two steps (fake CUPTI, no sync): the first step ended after the
    horizon (its last launches' records may still come), so it waits for the next chunk, and its
    child "tiny", which ended before the horizon, waits with it. Written apart, the step's GPU
    span started at its own operation (14.5 µs in) instead of its child's first kernel (3 µs)."""
    monkeypatch.setenv("GPUTRACE_WRITER", "thread")
    whole = cupti_trace(tmp_path, monkeypatch, tmp_path / "whole.json")
    cut = cupti_trace(tmp_path, monkeypatch, tmp_path / "cut.json", between=lambda: time.sleep(1.2))
    for t in (whole, cut):
        assert [t.names[i] for i in t.scopes.name] == ["step", "tiny", "big"] * 2
    assert (cut.scopes.gpu_start_ns - T0).tolist() == [3_000, 3_000, 115_000, 203_000, 203_000, 315_000]
    assert np.array_equal(cut.scopes.gpu_start_ns, whole.scopes.gpu_start_ns)
    assert np.array_equal(cut.ops.scope, whole.ops.scope)


def _recorded(path: Path, n: int, sync_every: int = 0) -> gputrace.session:
    """A started streamed session (fake backend) that recorded ``n`` scopes "step" with ``i``."""
    s = gputrace.session(path, backend="fake", quiet=True)
    s.start()
    for i in range(n):
        with gputrace.trace("step", i=i):
            pass
        if sync_every and i % sync_every == sync_every - 1:
            gputrace.sync()
    return s


def test_a_stop_never_fails_reading_back_a_file_past_the_read_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stop()``'s trace (``session.trace``) of a streamed file is read back when first used; one
    past the read limit (a long run's) is a trace of its header, with one warning, and the file
    is complete."""
    path = tmp_path / "long.json.gz"
    s = _recorded(path, 300, sync_every=100)
    monkeypatch.setenv("GPUTRACE_MAX_TRACE_BYTES", "1K")
    t = s.stop()
    assert s.trace is t
    with pytest.warns(gputrace.GputraceWarning, match="the trace is written, but reading it back failed"):
        assert len(t) == 0
    assert t.header["pid"] == os.getpid()  # the header, no scopes
    monkeypatch.delenv("GPUTRACE_MAX_TRACE_BYTES")
    assert len(gputrace.load(path).find("step")) == 300


def test_a_streamed_stop_reads_its_file_back_only_when_the_trace_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a file back costs far more than the stop (20 µs a scope): ``stop()`` returns the
    trace unread, and the first use of it reads the file once."""
    from gputrace import exporters

    reads = []
    real = exporters.load
    monkeypatch.setattr(exporters, "load", lambda path, *a, **k: reads.append(path) or real(path, *a, **k))
    path = tmp_path / "t.json.gz"
    t = (s := _recorded(path, 50)).stop()
    assert reads == [] and isinstance(t, gputrace.Trace)
    assert [t.scope(i).args["i"] for i in range(3)] == [0, 1, 2] and len(t.find("step")) == 50
    assert len(s.trace) == 50 and s.trace is t and s.stop() is t
    assert reads == [path]  # once


def test_a_stream_that_fails_after_opening_is_given_up_and_written_at_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step after the stream opened raises: the stream is given up whole (no half-kept
    streamer for the stop to trip on), the fault is reported once, and the file is written at stop."""
    import gputrace.streaming as streaming

    class Exploding:
        def __init__(self, out: Any) -> None:
            self._out = out

        def __getattr__(self, name: str) -> Any:
            if name == "proc":
                raise RuntimeError("broken after opening")
            return getattr(self._out, name)

    class Broken(streaming.Streamer):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            self.out = Exploding(self.out)  # type: ignore[assignment]

    monkeypatch.setattr(streaming, "Streamer", Broken)
    path = tmp_path / "t.json"
    with pytest.warns(gputrace.GputraceWarning, match="opening the streamed trace failed"):
        with gputrace.session(path, backend=FakeBackend(FakeClock()), quiet=True) as s:
            with gputrace.trace("kept"):
                pass
    assert [sc.name for sc in s.trace] == ["kept"]
    assert [sc.name for sc in gputrace.load(path)] == ["kept"]
