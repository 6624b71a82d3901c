"""Builders of traces shared by test modules (so no test module imports another)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace
from gputrace import figures
from gputrace.backends.cupti import CuptiBackend
from gputrace.backends.fake import FakeBackend
from gputrace.calstore import save
from gputrace.clock import FakeClock
from gputrace.model import NO_TIME, OpTable, Trace, canonical_names
from tests.cupti_fake import FakeActivitySource

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that imports gputrace from this checkout: the checkout
    first on ``PYTHONPATH``, whatever else was on it kept (the device image puts dependencies there)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def gputrace_run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = child_env()
    return subprocess.run(
        [sys.executable, "-m", "gputrace", "run", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


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


LATENCY = 2_000


CAL = {"launch_cpu_ns": 5_000, "launch_gpu_ns": 1_000, "graph_launch_ns": 3_000}


def step_kernels(src: FakeActivitySource, clock: FakeClock) -> None:
    """One step; times relative to its entry (0). GPU (stream 7): k1 3000–3500, k1b 4000–4500,
    k2 13000–13500, u 14500–14700, m 115000–165000, m2 165000–166000."""
    with gputrace.trace("step"):  # 0 … 114000
        clock.advance(1_000)
        with gputrace.trace("tiny"):  # 1000 … 12000
            src.launch("k1", gpu_ns=500)  # call 1000
            clock.advance(1_000)
            src.launch("k1b", gpu_ns=500)  # call 2000, queued behind k1: a gap between queued work
            clock.advance(9_000)
            src.launch("k2", gpu_ns=500)  # call 11000, after k1b ended: the GPU waited for the host
            clock.advance(1_000)
        clock.advance(500)
        src.launch("u", gpu_ns=200)  # call 12500, the step's own operation
        clock.advance(99_500)  # CPU work between launches (a compile, say)
        with gputrace.trace("big"):  # 112000 … 114000
            clock.advance(1_000)
            src.launch("m", gpu_ns=50_000)  # call 113000
            src.launch("m2", gpu_ns=1_000)  # call 113000, runs right after m
            clock.advance(1_000)


T0 = 100_000_000  # where the first step starts, on the fake clock


def launch_blocks(src: FakeActivitySource, backend: CuptiBackend, total: int, per: int) -> int:
    """``total`` fake kernels, ``per`` to a scope "block", no sync (inside an active session);
    returns the most bytes of CUPTI records that waited in the source at once."""
    import time

    peak = 0
    tr = gputrace.trace("block")
    for _ in range(total // per):
        with tr:
            for _ in range(per):
                src.launch("k", gpu_ns=200)
        peak = max(peak, backend.waiting_bytes())
        # a real launch takes microseconds in the driver; the fake's take nanoseconds of
        # Python, so the timer thread is let in between blocks as a busy 2-core CI host would
        time.sleep(0)
    return peak


def cupti_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: Path | None = None, between: Any = None
) -> gputrace.Trace:
    """Two steps of ``step_kernels`` (cold, then warm) with fake CUPTI; ``between()`` runs
    between them (the fake clock stands still meanwhile)."""
    cal = tmp_path / "cal.json"
    save({"backend": "cuda", "summary": CAL}, cal)
    monkeypatch.setenv("GPUTRACE_CALIBRATION", str(cal))
    clock = FakeClock(1_000_000, 1_000)  # moving while the backend measures its clock's rate
    src = FakeActivitySource(clock, latency_ns=LATENCY)
    backend = CuptiBackend(clock, source=src)
    clock.step_ns = 0  # from here on, only the test moves it
    with gputrace.session(path, backend=backend, clock=clock, quiet=True) as s:
        clock.advance(T0 - clock.now_ns)
        step_kernels(src, clock)  # cold: starts at T0
        if between is not None:
            between()
        clock.advance(T0 + 200_000 - clock.now_ns)
        step_kernels(src, clock)  # warm: starts at T0 + 200000
    assert s.trace is not None
    return s.trace


def gpu_session(path: Path, script, *, in_order: bool = True, **kw):  # type: ignore[no-untyped-def]
    clock = FakeClock(5_000_000_000, 1_000)
    fb = FakeBackend(clock, offset_ns=-7_654_321, drift_ppm=4.0, script=script, in_order=in_order, **kw)
    return gputrace.session(path, backend=fb, clock=clock, quiet=True), clock


def record_story(path: Path) -> gputrace.Trace:
    s, _clock = gpu_session(path, lambda n, i: (2_000 + 500 * i, 0 if n == "noop" else 30_000))
    with s:
        for i in range(5):
            with gputrace.trace("step", i=i):
                with gputrace.trace("matmul", stream="a"):
                    pass
                with gputrace.trace("copy", stream="b"):
                    pass
            gputrace.mark("tick", i=i)
            if i % 2:
                gputrace.sync()
        with gputrace.trace("noop"):
            pass
    assert s.trace is not None
    return s.trace


def assert_same(a: gputrace.Trace, b: gputrace.Trace) -> None:
    assert a.names == b.names and a.threads == b.threads and a.queues == b.queues
    for col in a.scopes.COLUMNS:
        assert np.array_equal(getattr(a.scopes, col), getattr(b.scopes, col)), col
    assert a.scopes.args == b.scopes.args
    for col in ("scope", "label", "queue", "submit_ns", "gpu_start_ns", "gpu_end_ns"):
        assert np.array_equal(getattr(a.spans, col), getattr(b.spans, col)), col
    assert a.marks == b.marks and a.clock_fits == b.clock_fits


TIGHT = (25_000, 60_000)  # the GPU read 25 µs after the first clock read, 60 µs before the second


WIDE = (2_000_000, 60_000)  # a worker thread woken 2 ms late


SAMPLES = 4  # per calibration


def record(windows, delay_ns: int = 50_000, scopes: int = 100):  # type: ignore[no-untyped-def]
    clock = FakeClock(start_ns=10**9, step_ns=1_000)
    backend = FakeBackend(
        clock, samples_per_calibration=SAMPLES, windows=windows, script=lambda name, i: (delay_ns, 20_000)
    )
    with gputrace.session(backend=backend, clock=clock, quiet=True) as s:
        for _ in range(scopes):
            with gputrace.trace("frame"):
                pass
            clock.advance(23_000_000)
    assert s.trace is not None
    return s.trace, backend


def ops_trace(tmp_path: Path) -> Trace:
    """The session story with per-operation records (where the model has them): kernels and a
    copy per GPU scope, launch calls seen or not, a graph launch running two kernels, a call
    outside every scope, another thread's launch."""
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
    ops = OpTable.empty(n)
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


def wgpu_adapter() -> Any:
    """A real WebGPU adapter (lavapipe in CI), or a skip that says how to get one."""
    try:
        import wgpu
    except ImportError as exc:
        pytest.skip(f"wgpu-py is not installed ({exc})")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:
        pytest.skip(f"no WebGPU adapter here ({exc}); install mesa-vulkan-drivers for lavapipe")
    if adapter is None:
        pytest.skip("no WebGPU adapter here; install mesa-vulkan-drivers for lavapipe")
    return adapter
