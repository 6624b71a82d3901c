"""What the writers leave out and the readers put back: passes folded into their scope's GPU slice,
user arguments as columns, submissions implied by the wait slices, explanations of anomaly
examples. Every case round-trips exactly through .json and .json.gz."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace
from gputrace.model import NO_TIME, Flag, QueueInfo, ScopeTable, SpanTable, ThreadInfo, Trace, nest
from tests import perfetto_rules
from tests.test_exporter import assert_same

DATA = Path(__file__).parent / "data"
FORMATS = ("t.json", "t.json.gz")


def wgpu_like(n: int, *, seed: int = 0) -> Trace:
    """``n`` scopes on one queue, each with a submission and a pass as long as its GPU slice
    (the wgpu case), and the exceptions: a scope with two passes, a pass submitted apart from its
    scope, a pass with another label, a scope with no pass, one with no submission, two scopes
    starting on the GPU at the same time, one starting before its submission."""
    rng = np.random.default_rng(seed)
    s = ScopeTable.empty(n)
    t0 = 10**9 + np.cumsum(rng.integers(50_000, 90_000, n))
    s.cpu_start_ns = t0
    s.cpu_end_ns = t0 + rng.integers(1_000, 40_000, n)
    s.name = (np.arange(n) % 2).astype(np.int32)
    s.queue = np.zeros(n, np.int32)
    s.submit_ns = s.cpu_end_ns - 500
    s.gpu_start_ns = s.submit_ns + rng.integers(0, 30_000, n)
    s.gpu_end_ns = s.gpu_start_ns + rng.integers(0, 20_000, n)
    s.uncertainty_ns = 40_000 + np.arange(n) // 3
    s.flags[3] = Flag.OUTLIER
    s.flags[0] = Flag.COLD
    s.submit_ns[7] = NO_TIME  # no submission: no wait, nothing implied
    s.gpu_start_ns[9] = s.gpu_start_ns[8]  # two GPU starts at one time on one queue
    s.gpu_end_ns[9] = s.gpu_end_ns[8] = s.gpu_start_ns[8] + 10_000
    s.gpu_start_ns[8] = s.gpu_start_ns[9]
    s.submit_ns[11] = s.gpu_start_ns[11] + 700  # started before its submission (flagged)
    s.flags[11] = Flag.START_BEFORE_SUBMIT
    nest(s)
    spans: list[tuple[int, int, int, int, int]] = []  # scope, label, submit, start, end
    for i in range(n):
        g0, g1, sub = int(s.gpu_start_ns[i]), int(s.gpu_end_ns[i]), int(s.submit_ns[i])
        if i == 4:  # two passes
            mid = (g0 + g1) // 2
            spans += [(i, 2, sub, g0, mid), (i, 2, sub, mid, g1)]
        elif i == 5:  # submitted apart from its scope
            spans.append((i, 2, sub + 1, g0, g1))
        elif i == 6:
            spans.append((i, 3, sub, g0, g1))
        elif i != 10:
            spans.append((i, 2, sub, g0, g1))
    sp = SpanTable.empty(len(spans))
    sp.scope = np.array([x[0] for x in spans], np.int64)
    sp.label = np.array([x[1] for x in spans], np.int32)
    sp.submit_ns = np.array([x[2] for x in spans], np.int64)
    sp.gpu_start_ns = np.array([x[3] for x in spans], np.int64)
    sp.gpu_end_ns = np.array([x[4] for x in spans], np.int64)
    for i in range(0, n, 3):
        s.args[i] = {"n": 256 * i, "scope": -i, "ok": i % 2 == 0, "kind": f"k{i % 5}"}
    s.args[1] = {"x": 0.5, "nested": {"a": [1, None]}}  # not columns: written one by one
    s.args[2] = {"big": 1 << 70, "long": "y" * 300}
    header = gputrace.load(DATA / "story.json").header
    header = {**header, "base_ns": 10**9, "start_ns": 10**9, "pid": 4242, "spans_cover_children": True}
    queues = [QueueInfo(0, "llvmpipe", "wgpu", "queue")]
    names = ["tiny", "large", "compute pass #1", "render pass"]
    return Trace(header, names, [ThreadInfo(4242, "MainThread")], queues, s, sp, [], {})


def _canonical(trace: Trace, tmp_path: Path) -> Trace:
    path = tmp_path / "canon.json"
    gputrace.exporters.write(trace, path)
    return gputrace.load(path)


@pytest.mark.parametrize("name", FORMATS)
def test_folded_passes_args_and_submissions_round_trip(tmp_path: Path, name: str) -> None:
    trace = _canonical(wgpu_like(40), tmp_path)
    assert len(trace.spans) == 40 and trace.scopes.args[2]["big"] == float(1 << 70)
    path = gputrace.exporters.write(trace, tmp_path / name)
    back = gputrace.load(path)
    assert_same(trace, back)
    assert "truncated" not in back.header


def test_the_json_writes_a_pass_as_long_as_its_scope_as_an_argument(tmp_path: Path) -> None:
    path = gputrace.exporters.write(wgpu_like(40), tmp_path / "t.json")
    doc = perfetto_rules.read(path)
    assert perfetto_rules.check(doc) == []
    ev = doc["traceEvents"]
    passes = [e for e in ev if e.get("cat") == "gpu.pass"]
    assert sorted(e["args"]["scope"] for e in passes) == [4, 4, 5]  # two passes; a submission apart
    gpu = {e["bind_id"]: e for e in ev if e["ph"] == "X" and e.get("cat") == "gpu"}
    assert gpu[0]["args"]["pass"] == "compute pass #1" and gpu[6]["args"]["pass"] == "render pass"
    assert "pass" not in gpu[10].get("args", {}) and "pass" not in gpu[4].get("args", {})


def test_op_events_keep_what_hta_and_the_reader_need(tmp_path: Path) -> None:
    from tests.builders import ops_trace

    trace = ops_trace(tmp_path)
    path = gputrace.exporters.write(trace, tmp_path / "ops.json")
    doc: dict[str, Any] = perfetto_rules.read(path)
    assert perfetto_rules.check(doc) == []
    ops = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert ops
    for e in ops:
        assert {"op", "scope", "queue", "device", "stream", "correlation", "External id"} <= set(e["args"])
    assert_same(trace, gputrace.load(path))


def _hta_numbers(folder: Path) -> tuple[Any, ...]:
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(folder))
    kinds, _ = ta.get_gpu_kernel_breakdown(visualize=False)
    temporal = ta.get_temporal_breakdown(visualize=False).iloc[0].to_dict()
    idle = ta.get_idle_time_breakdown(visualize=False)
    idle_df = idle[0] if isinstance(idle, tuple) else idle
    launches = ta.get_cuda_kernel_launch_stats(visualize=False)[0]
    cols = ["cpu_duration", "gpu_duration", "launch_delay"]
    return (
        dict(zip(kinds["kernel_type"], kinds["sum"], strict=True)),
        temporal,
        sorted(idle_df["idle_time"].tolist()),
        len(launches),
        launches[cols].sum().to_dict(),
    )


@pytest.mark.filterwarnings("ignore")  # HTA's and pandas' own warnings are not ours to fix
def test_hta_reads_the_same_numbers_from_a_rewritten_h200_trace(tmp_path: Path) -> None:
    """The kept H200 trace, written again by this writer (lean per-operation args): HTA's
    analyses give the numbers they give on the trace as recorded."""
    pytest.importorskip("hta.trace_analysis", reason="holistictraceanalysis is not installed")
    kept = DATA / "cuda_h200.json.gz"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / kept.name).write_bytes(kept.read_bytes())
    gputrace.exporters.write(gputrace.load(kept), tmp_path / "b" / kept.name)
    assert _hta_numbers(tmp_path / "a") == _hta_numbers(tmp_path / "b")
