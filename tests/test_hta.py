"""Holistic Trace Analysis (HTA 0.5.0) reads a CUDA trace gputrace recorded on an H200.

``tests/data/cuda_h200.json.gz`` was written by ``benchmarks/bench_cuda.py --sample-trace`` with
CUPTI timing: 40 steps of an upload, a matmul, four tiny kernels, a graph replay and a memset on
a second stream, and a download. HTA's kernel breakdown, temporal breakdown, idle time and CUDA
launch statistics must all give numbers on it. ``tests/setup.sh`` installs HTA; without it the
test is skipped with the reason.
"""

from __future__ import annotations

import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace
from gputrace import figures
from gputrace.render import render
from gputrace.summary import summarize
from tests import perfetto_rules

TRACE = Path(__file__).parent / "data" / "cuda_h200.json.gz"


def _hta_reason() -> str | None:
    try:
        import hta.trace_analysis  # noqa: F401
    except Exception as exc:  # not installed, or broken by its own dependencies
        why = f"{type(exc).__name__}: {exc}"
        return f"holistictraceanalysis is not importable ({why}); tests/setup.sh installs it"
    return None


def test_the_kept_h200_trace_is_a_valid_gputrace_cuda_trace() -> None:
    doc = perfetto_rules.read(TRACE)
    assert perfetto_rules.check(doc) == []
    t = gputrace.load(TRACE)
    assert t.header["backend_info"]["timing"] == "cupti"
    assert "H200" in t.queues[0].device_name
    kinds = np.bincount(t.ops.kind, minlength=3).tolist()
    assert kinds[0] >= 200 and kinds[1] >= 40 and kinds[2] >= 40  # kernels, memcpys, memsets
    assert (t.ops.scope >= 0).all()  # every operation under its scope
    assert int(np.count_nonzero(t.ops.graph_id)) >= 40  # graph replays recorded
    busy = t.busy_ns()
    timed = t.scopes.gpu_start_ns != gputrace.model.NO_TIME
    span = t.scopes.gpu_end_ns - t.scopes.gpu_start_ns
    assert (busy[timed] > 0).all() and (busy[timed] <= span[timed] * 2).all()


@pytest.mark.skipif(_hta_reason() is not None, reason=str(_hta_reason()))
@pytest.mark.filterwarnings("ignore")  # HTA's and pandas' own warnings are not ours to fix
def test_hta_analyses_give_numbers(tmp_path: Path) -> None:
    from hta.trace_analysis import TraceAnalysis

    shutil.copy(TRACE, tmp_path / TRACE.name)
    ta = TraceAnalysis(trace_dir=str(tmp_path))

    kernel_types, kernels = ta.get_gpu_kernel_breakdown(visualize=False)
    by_type = dict(zip(kernel_types["kernel_type"], kernel_types["sum"], strict=True))
    assert by_type["COMPUTATION"] > 0 and by_type["MEMORY"] > 0
    assert len(kernels) > 0

    temporal = ta.get_temporal_breakdown(visualize=False)
    assert len(temporal) == 1
    row = temporal.iloc[0]
    assert row["idle_time(us)"] > 0 and row["compute_time(us)"] > 0

    idle = ta.get_idle_time_breakdown(visualize=False)
    idle_df = idle[0] if isinstance(idle, tuple) else idle
    assert set(idle_df["stream"]) >= {7, 13}
    assert (idle_df["idle_time"] >= 0).all()

    launches = ta.get_cuda_kernel_launch_stats(visualize=False)
    stats = launches[0]
    assert len(stats) > 0  # runtime launches (cuBLAS gemm, memcpy, memset) joined to their kernels
    assert {"cpu_duration", "gpu_duration", "launch_delay"} <= set(stats.columns)


def _hta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from hta.trace_analysis import TraceAnalysis

    # HTA rounds ns times down to whole µs unless told not to; the rounding alone moves stream
    # 13's idle time by 1.6 % (≈1 µs on each of its ~120 gaps), so compare with HTA at full precision
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    shutil.copy(TRACE, tmp_path / TRACE.name)
    return TraceAnalysis(trace_dir=str(tmp_path))


@pytest.mark.skipif(_hta_reason() is not None, reason=str(_hta_reason()))
@pytest.mark.filterwarnings("ignore")
def test_idle_per_stream_matches_htas_idle_time_analysis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    idle, _ = _hta(tmp_path, monkeypatch).get_idle_time_breakdown(visualize=False)
    ours = {int(q["queue"].split()[-1]): q for q in summarize(gputrace.load(TRACE))["idle"]}
    assert set(ours) == set(idle["stream"]) == {7, 13}
    for stream, q in ours.items():
        hta = idle[idle["stream"] == stream].set_index("idle_category")["idle_time"]  # µs
        assert q["idle_ns"] / 1e3 == pytest.approx(hta.sum(), rel=0.01)
        # the split too: HTA's host wait is ours; its kernel wait and other are between queued work
        assert q["waiting_for_host_ns"] / 1e3 == pytest.approx(hta["host_wait"], rel=0.01)
        assert q["between_queued_work_ns"] / 1e3 == pytest.approx(
            hta["kernel_wait"] + hta["other"], rel=0.01, abs=0.02
        )
    assert ours[7]["idle_ns"] / ours[7]["window_ns"] > 0.99  # the GPU idled ~99 % on stream 7


@pytest.mark.skipif(_hta_reason() is not None, reason=str(_hta_reason()))
@pytest.mark.filterwarnings("ignore")
def test_per_kernel_totals_equal_htas_kernel_breakdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, kernels = _hta(tmp_path, monkeypatch).get_gpu_kernel_breakdown(
        visualize=False, duration_ratio=1.0, num_kernels=10_000
    )
    totals: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for r in summarize(gputrace.load(TRACE))["rows"]:
        for o in r.get("ops", []):
            totals[o["name"]] += o["gpu_ns"]["total"]
            counts[o["name"]] += o["calls"]
    hta = dict(zip(kernels["name"], kernels["sum (us)"], strict=True))
    assert set(hta) == set(totals)
    for name, total_ns in totals.items():  # the file holds µs with 3 decimals: ≤ 0.5 ns each
        assert abs(total_ns / 1e3 - hta[name]) <= 0.0005 * counts[name] + 1e-6, name


def test_figures_on_the_kept_h200_trace() -> None:
    t = gputrace.load(TRACE)
    s = summarize(t)
    step = next(r for r in s["rows"] if r["name"] == "step")
    stream7 = next(q for q in s["idle"] if q["queue"] == "stream 7")
    # step's share is its busy time on stream 7 over that stream's busy time, not its 151 ms span
    assert step["gpu_share"] == pytest.approx(1.0)
    assert step["gpu_busy_ns"]["total"] < 2_000_000 < step["gpu_ns"]["total"]
    assert stream7["busy_ns"] == pytest.approx(1.06e6, rel=0.01)
    # the cold matmul waited µs between its launch call and its kernel, not the 150 ms of
    # compilation between entering the scope and launching
    (cold,) = [sc for sc in t.find("matmul") if sc.flags & gputrace.model.Flag.COLD]
    first = np.flatnonzero(t.ops.scope == cold.index)
    first = first[np.argmin(t.ops.gpu_start_ns[first])]
    queued = figures.queued_ns(t)[cold.index]
    assert queued == t.ops.gpu_start_ns[first] - t.ops.call_start_ns[first]
    assert 0 < queued < 100_000
    assert (cold.cpu_ns or 0) > 100_000_000  # the scope itself lasted 150 ms
    matmul = next(r for r in s["rows"] if r["name"] == "matmul")
    assert matmul["cold"]["queue_gap_ns"] == queued
    assert (
        "matmul (0:stream 7): busy median 12.6 µs of span median 13.6 µs (92.7%); cold call queued 29.3 µs"
        in (render(s, "table"))
    )
