"""Holistic Trace Analysis (HTA 0.5.0) reads a CUDA trace gputrace recorded on an H200.

``tests/data/cuda_h200.json.gz`` was written by ``benchmarks/bench_cuda.py --sample-trace`` with
CUPTI timing: 40 steps of an upload, a matmul, four tiny kernels, a graph replay and a memset on
a second stream, and a download. HTA's kernel breakdown, temporal breakdown, idle time and CUDA
launch statistics must all give numbers on it. ``tests/setup.sh`` installs HTA; without it the
test is skipped with the reason.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import gputrace
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
