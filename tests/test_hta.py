"""Holistic Trace Analysis (HTA 0.5.0) reads a CUDA trace gputrace recorded on an H200.

``tests/data/cuda_h200.json.gz`` was written by ``benchmarks/bench_cuda.py --sample-trace`` with
CUPTI timing: 40 steps of an upload, a matmul, four tiny kernels, a graph replay and a memset on
a second stream, and a download. HTA's kernel breakdown, temporal breakdown, idle time and CUDA
launch statistics must all give numbers on it. ``tests/data/cuda_h200_cold.json.gz``
(``tests/data/record_cuda_cold.py``, CUPTI) has cold calls: a 180 ms first matmul whose kernel
ran 57 µs, and a first elementwise "scale" that compiled for 0.7 s. On both, gputrace's idle time
per stream and per-kernel totals must be HTA's. ``tests/setup.sh`` installs HTA; without it the
test is skipped with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace
from gputrace import exporters, figures
from gputrace.render import render
from gputrace.summary import summarize
from tests import perfetto_rules

TRACE = Path(__file__).parent / "data" / "cuda_h200.json.gz"
COLD = Path(__file__).parent / "data" / "cuda_h200_cold.json.gz"
BOTH = pytest.mark.parametrize("trace", [TRACE, COLD], ids=["steps", "cold"])


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


def _hta(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: Path) -> Any:
    from hta.trace_analysis import TraceAnalysis

    # HTA rounds ns times down to whole µs unless told not to; the rounding alone moves stream
    # 13's idle time by 1.6 % (≈1 µs on each of its ~120 gaps), so compare with HTA at full precision
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    shutil.copy(trace, tmp_path / trace.name)
    return TraceAnalysis(trace_dir=str(tmp_path))


@pytest.mark.skipif(_hta_reason() is not None, reason=str(_hta_reason()))
@pytest.mark.filterwarnings("ignore")
@BOTH
def test_idle_per_stream_matches_htas_idle_time_analysis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: Path
) -> None:
    idle, _ = _hta(tmp_path, monkeypatch, trace).get_idle_time_breakdown(visualize=False)
    ours = {int(q["queue"].split()[-1]): q for q in summarize(gputrace.load(trace))["idle"]}
    assert set(ours) == set(idle["stream"]) == ({7, 13} if trace == TRACE else {7})
    for stream, q in ours.items():
        hta = idle[idle["stream"] == stream].set_index("idle_category")["idle_time"]  # µs
        assert q["idle_ns"] / 1e3 == pytest.approx(hta.sum(), rel=0.01)
        # the split too: HTA's host wait is ours; its kernel wait and other are between queued work
        assert q["waiting_for_host_ns"] / 1e3 == pytest.approx(hta["host_wait"], rel=0.01)
        assert q["between_queued_work_ns"] / 1e3 == pytest.approx(
            hta.get("kernel_wait", 0.0) + hta["other"], rel=0.01, abs=0.02
        )
    assert ours[7]["idle_ns"] / ours[7]["window_ns"] > 0.99  # the GPU idled ~99 % on stream 7


@pytest.mark.skipif(_hta_reason() is not None, reason=str(_hta_reason()))
@pytest.mark.filterwarnings("ignore")
@BOTH
def test_per_kernel_totals_equal_htas_kernel_breakdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trace: Path
) -> None:
    _, kernels = _hta(tmp_path, monkeypatch, trace).get_gpu_kernel_breakdown(
        visualize=False, duration_ratio=1.0, num_kernels=10_000
    )
    totals: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for r in summarize(gputrace.load(trace))["rows"]:
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


def test_the_kept_cold_trace_holds_what_its_program_ran() -> None:
    doc = perfetto_rules.read(COLD)
    assert perfetto_rules.check(doc) == []
    t = gputrace.load(COLD)
    assert t.header["backend_info"]["timing"] == "cupti" and "H200" in t.queues[0].device_name
    assert [sc.name for sc in t if sc.depth == 0] == ["setup", "cold matmul"] + ["step"] * 5 + ["tail"]
    assert len(t.ops) == 22 and (t.ops.kind == 0).all()  # kernels only
    assert (t.ops.call_start_ns != gputrace.model.NO_TIME).all()  # each with its launch call
    assert sum(e.get("cat") == "sync" for e in doc["traceEvents"]) == 7


def _cold(t: gputrace.Trace, name: str) -> tuple[int, int]:
    """(scope row, launch call → kernel start in ns) of the cold call of ``name``."""
    (cold,) = [sc.index for sc in t.find(name) if sc.flags & gputrace.model.Flag.COLD]
    mine = np.flatnonzero(t.ops.scope == cold)
    first = mine[np.argmin(t.ops.gpu_start_ns[mine])]
    return cold, int(t.ops.gpu_start_ns[first] - t.ops.call_start_ns[first])


def test_cold_calls_are_queued_from_their_launch_call_in_summarize_and_in_the_file(tmp_path: Path) -> None:
    """The cold matmul spent 180.7 ms on the CPU (cuBLAS set-up) before its one launch; its kernel
    started 38.758 µs after that launch call. The file was written when a scope's submission was
    its entry, so its own queued slice spans the 180 ms; gputrace reads it, and writes it again,
    from the launch call."""
    out = subprocess.run(
        [sys.executable, "-m", "gputrace", "summarize", "--format", "json", str(COLD)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rows = {r["name"]: r for r in json.loads(out.stdout)["rows"]}
    t = gputrace.load(COLD)
    cold, launch_to_start = _cold(t, "cold matmul")
    assert launch_to_start == 38_758
    assert rows["cold matmul"]["cold"] == {"cpu_ns": 180_708_331, "gpu_ns": 56_607, "queue_gap_ns": 38_758}
    scale, scale_wait = _cold(t, "scale")  # compiled for 0.7 s before its first launch
    assert rows["scale"]["cold"]["queue_gap_ns"] == scale_wait == 45_077
    assert rows["scale"]["cold"]["cpu_ns"] > 600_000_000
    # loaded and written again: the queued slice starts at the launch call, not at the entry
    again = tmp_path / "again.json"
    exporters.write(t, again)
    doc = json.loads(again.read_text())
    for sc, wait in ((cold, 38.758), (scale, 45.077)):
        (begin,) = [e for e in doc["traceEvents"] if e["ph"] == "b" and e["id2"]["local"] == sc]
        (gpu,) = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("bind_id") == sc
                  and e["pid"] >= 2**30]  # fmt: skip
        ops = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["args"]["scope"] == sc]
        first_op = min(ops, key=lambda e: e["ts"])
        assert begin["ts"] == first_op["args"]["call_ts"]
        assert round(gpu["ts"] - begin["ts"], 3) == wait
    assert np.array_equal(gputrace.load(again).scopes.submit_ns, t.scopes.submit_ns)
