"""A streamed file written by a writer process (``session(writer="process")``, gputrace.appender)
is the file the program's own process writes, and a killed program leaves what it had sent."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import gputrace
from gputrace.chunks import RawChunk
from gputrace.errors import GputraceError
from gputrace.records import RawRecording, RawSpan, SpanBatch
from tests.builders import cupti_trace, gpu_session, launch_blocks


@pytest.mark.parametrize("ready", [True, False], ids=["child-writes", "ended-before-it-was-ready"])
@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".pftrace"])
def test_a_writer_process_writes_the_same_file(
    suffix: str, ready: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same bytes as the program's own process writes: written by the child once it is
    ready, or by the session itself when it ends before the child started (a short session)."""
    files = {}
    for writer in ("thread", "process"):
        monkeypatch.setenv("GPUTRACE_WRITER", writer)
        path = files[writer] = tmp_path / f"{writer}{suffix}"
        # waited for: the child is ready before the stop (both sessions pause alike)
        cupti_trace(tmp_path, monkeypatch, path, between=(lambda p=path: _pause(p)) if ready else None)
    a, b = (gputrace.load(gputrace.exporters.canonical(files[w])) for w in ("thread", "process"))
    assert len(a) == len(b) > 0 and len(a.ops) == len(b.ops) > 0
    if ready:  # the child wrote the file, and says what it cost (its own peak memory)
        facts = b.header["writer_process"]
        assert facts["peak_rss_mb"] > 0 and facts["ready_ms"] > 0  # (from its spawn to its file open)
    else:  # the session wrote it
        assert "writer_process" not in b.header
    assert "writer_process" not in a.header
    docs = [_document(gputrace.exporters.canonical(files[w])) for w in ("thread", "process")]
    assert docs[0] == docs[1]
    if suffix == ".pftrace":
        assert files["process"].stat().st_size == files["thread"].stat().st_size > 0


def _pause(path: Path) -> None:
    """Wait until the file has its start (a writer process writes it once it is ready), then
    past the streamer's interval (1 s), so its timer collects in both sessions."""
    started = gputrace.exporters.canonical(path)  # (a .pftrace's .json.gz is written first)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (started.exists() and started.stat().st_size):
        time.sleep(0.02)
    assert started.stat().st_size, "the writer process never started"
    time.sleep(1.2)


def _document(path: Path) -> Any:
    """The file's JSON less what two runs differ in (``_without``)."""
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return _without(doc, ("clock_pair", "loadavg_start", "loadavg_end", "samples", "writer_process"))


def _without(doc: Any, keys: tuple[str, ...]) -> Any:
    """``doc`` less the readings of real clocks and load, how many clock samples the streamer's
    timer took (it runs in real time), and the writer process's own facts."""
    if isinstance(doc, dict):
        return {k: _without(v, keys) for k, v in doc.items() if k not in keys}
    return [_without(v, keys) for v in doc] if isinstance(doc, list) else doc


def test_a_killed_program_leaves_what_the_writer_process_had(tmp_path: Path) -> None:
    out = tmp_path / "killed.json.gz"
    program = textwrap.dedent(f"""
        import os, signal, gputrace
        s = gputrace.session({str(out)!r}, backend="fake", writer="process", quiet=True)
        s.start()
        for i in range(30):
            with gputrace.trace("step", i=i):
                pass
            gputrace.sync()
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, timeout=60)
    assert p.returncode == -signal.SIGKILL
    t = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the writer process finishes what it had read, then ends
        with contextlib.suppress(gputrace.GputraceError):
            t = gputrace.load(out)
            if len(t) == 30:
                break
        time.sleep(0.05)
    assert t is not None and len(t) == 30
    assert t.header["truncated"] is True  # no final header: what a crash leaves, said so


def test_a_session_never_waits_for_a_writer_process_still_starting(tmp_path: Path) -> None:
    """Chunks that do not fit the pipe while the child is still starting wait in this process
    (a send never blocks on a child that reads nothing yet), and a session that ends before the
    child was ready writes the file itself, all of it."""
    slow = tmp_path / "slow-python"  # the interpreter the writer process starts with, slowly
    slow.write_text(f'#!/bin/sh\nsleep 60\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    out = tmp_path / "slow.json.gz"
    program = textwrap.dedent(f"""
        import sys
        import gputrace
        sys.executable = {str(slow)!r}
        with gputrace.session({str(out)!r}, backend="fake", writer="process", quiet=True) as s:
            for c in range(40):
                for i in range(2000):
                    with gputrace.trace("step", i=i):
                        pass
                gputrace.sync()
        print(s.scopes_recorded())
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=50)
    assert p.returncode == 0, p.stderr
    t = gputrace.load(out)
    assert len(t) == 80_000 == int(p.stdout.split()[-1])
    assert "writer_process" not in t.header and "truncated" not in t.header  # this process wrote it


def test_chunks_sent_while_the_writer_process_started_are_written_by_it(tmp_path: Path) -> None:
    """CUPTI timing: the streamer's timer sends every chunk before the child is ready, and none
    comes after; once the child is ready, the session's end hands it the close (it has every
    chunk) instead of writing the file itself again."""
    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep 0.5\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    out = tmp_path / "late.json.gz"
    program = textwrap.dedent(f"""
        import os, sys, time
        import gputrace
        from gputrace.backends.cupti import CuptiBackend
        from gputrace.clock import session_clock
        from tests.cupti_fake import FakeActivitySource
        sys.executable = {str(slow)!r}
        src = FakeActivitySource(session_clock)
        backend = CuptiBackend(session_clock, source=src)
        with gputrace.session({str(out)!r}, backend=backend, writer="process", quiet=True):
            for i in range(60):
                with gputrace.trace("step", i=i):
                    src.launch("k", gpu_ns=1_000)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (os.path.exists({str(out)!r})
                                                       and os.path.getsize({str(out)!r})):
                time.sleep(0.02)  # until the child has the file open (the timer has sent all)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr
    t = gputrace.load(out)
    assert len(t) == 60 and len(t.ops) == 60 and "truncated" not in t.header
    assert t.header["writer_process"]["peak_rss_mb"] > 0  # the child wrote it


def test_an_unknown_writer_is_one_sentence() -> None:
    with pytest.raises(GputraceError, match="writer='disk' is not one of auto, process, thread"):
        gputrace.session("x.json", writer="disk")


def test_the_writer_process_starts_while_the_backend_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child is started before the backend (CUPTI's start takes 18-28 ms on the H200, the
    child's 0.1-0.2 s), and writes the file; one never given a file is ended."""
    from gputrace import appender
    from gputrace.backends import create

    session_mod = sys.modules["gputrace.session"]
    started: list[subprocess.Popen[bytes]] = []
    seen = []
    real_spawn = appender.spawn
    monkeypatch.setattr(appender, "spawn", lambda: started.append(real_spawn()) or started[-1])
    monkeypatch.setattr(session_mod, "create", lambda *a, **k: seen.append(len(started)) or create(*a, **k))
    path = tmp_path / "run.json"
    with gputrace.session(path, backend="fake", writer="process", quiet=True):
        _pause(path)
        with gputrace.trace("step"):
            pass
    assert seen == [1] and len(started) == 1  # started before the backend, and used
    assert gputrace.load(path).header["writer_process"]["peak_rss_mb"] > 0

    def refuse(*a: Any, **k: Any) -> Any:
        seen.append(len(started))
        raise GputraceError("no such GPU here.")

    monkeypatch.setattr(session_mod, "create", refuse)
    with pytest.raises(GputraceError, match="no such GPU"):
        gputrace.session(tmp_path / "never.json", backend="fake", writer="process", quiet=True).start()
    assert seen == [1, 2] and started[1].wait(10) is not None  # started, then ended
    assert not (tmp_path / "never.json").exists()


def test_a_writer_process_that_falls_behind_makes_the_program_wait(tmp_path: Path) -> None:
    """A child that reads nothing for a while (stopped here; on a busy machine, slow): the chunk
    for it waits for room in its pipe, and once CUPTI records pile up meanwhile the program waits
    at its scope exits, so they stay bounded. Without that the program recorded on, and the next
    chunk held everything recorded meanwhile. Nothing is lost."""
    import threading

    from gputrace.backends.cupti import CuptiBackend
    from gputrace.clock import session_clock
    from tests.cupti_fake import FakeActivitySource

    src = FakeActivitySource(session_clock, latency_ns=500)
    backend = CuptiBackend(session_clock, source=src)
    path = tmp_path / "behind.json.gz"
    total, per = 300_000, 100
    with gputrace.session(path, backend=backend, writer="process", quiet=True):
        _pause(path)  # the child is ready; now it stops reading for 1.5 s
        pid = os.getpid()
        child = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        os.kill(child, signal.SIGSTOP)
        threading.Timer(1.5, os.kill, (child, signal.SIGCONT)).start()
        peak = launch_blocks(src, backend, total, per)
    t = gputrace.load(path)
    assert len(t) == total // per and len(t.ops) == total and int((t.ops.scope < 0).sum()) == 0
    # the fake's records: about 300 B a kernel with its launch call (2 cores: 50-95k operations
    # waiting at most, 53-56k with no stop; 267k without the program waiting)
    assert peak / 300 < total / 2, peak


def test_the_writer_process_resolves_the_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolving a chunk is about as much work as rendering it: once the writer process is
    ready, the program's process resolves none of the chunks (it only cuts and sends them)."""
    import gputrace.chunks

    here: list[int] = []
    real = gputrace.chunks.resolve
    monkeypatch.setattr(gputrace.chunks, "resolve", lambda raw, **kw: here.append(1) or real(raw, **kw))
    path = tmp_path / "run.json"
    with gputrace.session(path, backend="fake", writer="process", quiet=True):
        _pause(path)  # the child has the file open
        for i in range(30):
            with gputrace.trace("step", i=i):
                pass
            if i % 10 == 9:
                gputrace.sync()  # a chunk
    t = gputrace.load(path)
    assert len(t.find("step")) == 30 and t.header["streamed"]["chunks"] >= 3
    assert t.header["writer_process"]["peak_rss_mb"] > 0 and here == []


def test_a_cupti_session_sends_its_chunks_while_the_program_runs(tmp_path: Path) -> None:
    """With a writer process, CUPTI's records are collected and sent several times a second
    (the child renders the run as it goes, so the stop is left little of it), even without a
    sync; every scope and kernel still reaches the file."""
    from gputrace.backends.cupti import CuptiBackend
    from gputrace.clock import session_clock
    from tests.cupti_fake import FakeActivitySource

    src = FakeActivitySource(session_clock)
    path = tmp_path / "run.json.gz"
    n, backend = 0, CuptiBackend(session_clock, source=src)
    with gputrace.session(path, backend=backend, writer="process", quiet=True):
        tr = gputrace.trace("tiny")
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            with tr:
                src.launch("k", gpu_ns=900)
            n += 1
            time.sleep(0.0002)
    t = gputrace.load(path)
    assert len(t) == n == len(t.ops)
    # one chunk a second at most if records were collected only at the session's flush_s (1 s)
    assert t.header["streamed"]["chunks"] >= 4, t.header["streamed"]


def test_gpu_spans_reach_the_writer_process_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scopes' GPU spans go down the pipe as columns (not an object each): the child places them as
    the program's own process does, and a chunk read back has every span and its label."""
    placed = []
    for writer in ("thread", "process"):
        monkeypatch.setenv("GPUTRACE_WRITER", writer)
        path = tmp_path / f"{writer}.json"
        s, clock = gpu_session(path, lambda n, i: (2_000 + 500 * i, 30_000 + 100 * i))
        with s:
            _pause(path)  # (the child is ready: it resolves every chunk)
            for i in range(30):
                with gputrace.trace("step"):
                    clock.advance(10_000)
                if i % 10 == 9:
                    gputrace.sync()
        t = gputrace.load(path)
        assert ("writer_process" in t.header) == (writer == "process")
        sc = t.scopes
        placed.append(
            ((sc.gpu_start_ns - sc.cpu_start_ns).tolist(), (sc.gpu_end_ns - sc.gpu_start_ns).tolist())
        )
    assert placed[0] == placed[1]
    assert [round(d, -2) for d in placed[1][1]] == [30_000 + 100 * i for i in range(30)]  # (4 ppm drift)
    spans = [RawSpan(7, 1, 10**15, 10**15 + 9, 3, 4, "pass: shadow"), RawSpan(8, 0, -1, 2, 3, 4)]
    sent = RawRecording(header={}, threads=[], spans=SpanBatch.of(spans))
    back = pickle.loads(pickle.dumps(RawChunk(sent), protocol=5))
    assert list(back.raw.spans) == spans
    assert [type(v) for v in next(iter(back.raw.spans))] == [int] * 6 + [str]
