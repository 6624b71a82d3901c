"""Self (exclusive) CPU time per name against ``torch.profiler``'s ``key_averages`` on the same run.

The test records a small torch program on the CPU with ``torch.profiler``, exports its Chrome
trace, and reads it as another tool's trace. Each name's self CPU total must be within 1 % of what
``key_averages`` reports (its times are µs; the trace keeps them to 3 decimals). Without torch the
test is skipped with the reason; ``tests/setup.sh`` installs the CPU build.

``tests/data/torch_h200.json.gz`` and ``torch_h200_key_averages.json`` are one CUDA run on the
H200 (torch 2.11, ``tests/data/record_torch_h200.py``): the same check on CPU times, and on device
times where torch and gputrace define them alike (kernels), with no torch needed.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest

from gputrace import figures
from gputrace.exporters.reader import from_chrome
from gputrace.summary import summarize

DATA = Path(__file__).parents[1] / "data"


def _torch_reason() -> str | None:
    try:
        import torch.profiler  # noqa: F401
    except Exception as exc:
        return f"torch is not importable ({type(exc).__name__}: {exc}); tests/setup.sh installs it"
    return None


@pytest.mark.skipif(_torch_reason() is not None, reason=str(_torch_reason()))
@pytest.mark.filterwarnings("ignore")  # torch's own warnings are not ours to fix
def test_self_cpu_time_matches_key_averages(tmp_path: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.randn(128, 128)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            with record_function("step"):
                with record_function("layer"):
                    y = torch.relu(x @ x) + 1
                y.sum()
    path = tmp_path / "torch.json"
    prof.export_chrome_trace(str(path))
    theirs = {e.key: e.self_cpu_time_total for e in prof.key_averages()}  # µs

    s = summarize(from_chrome(json.loads(path.read_text()), str(path)))
    assert s["sort"] == "self_cpu_total"  # key_averages' order by default
    ours = {r["name"]: r["self_ns"]["cpu_total"] / 1e3 for r in s["rows"]}
    assert {"aten::mm", "step", "layer", "aten::relu"} <= set(theirs)
    for name, self_us in theirs.items():
        assert name in ours, name
        assert ours[name] == pytest.approx(self_us, rel=0.01, abs=0.01), name
    # the top rows are the ones key_averages puts first (ties aside)
    top = max(theirs, key=theirs.__getitem__)
    assert s["rows"][0]["name"] == top or ours[s["rows"][0]["name"]] == pytest.approx(theirs[top], rel=0.01)


def _kept_h200() -> tuple[dict[str, dict[str, float]], dict[str, object]]:
    """key_averages of the kept H200 run summed per name (a record_function name has a CPU row
    and a GPU-range row), and ``summarize`` of its Chrome trace."""
    ka = json.loads((DATA / "torch_h200_key_averages.json").read_text())
    assert ka["device"] == "NVIDIA H200" and ka["torch"].startswith("2.11")
    theirs: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in ka["rows"]:
        for k in ("self_cpu_time_total_us", "self_device_time_total_us", "count"):
            theirs[r["key"]][k] += r[k]
    path = DATA / "torch_h200.json.gz"
    return theirs, summarize(from_chrome(json.loads(gzip.decompress(path.read_bytes())), str(path)))


def test_self_cpu_time_matches_key_averages_on_a_cuda_run() -> None:
    theirs, s = _kept_h200()
    ours: dict[str, float] = defaultdict(float)
    for r in s["rows"]:  # type: ignore[attr-defined]
        ours[r["name"]] += r["self_ns"]["cpu_total"] / 1e3
    assert set(ours) == set(theirs)
    for name, t in theirs.items():
        assert ours[name] == pytest.approx(t["self_cpu_time_total_us"], rel=0.01, abs=0.01), name
    # Kineto's own overhead inside aten::mm (CUPTI asking for a buffer, 2.86 ms) is not aten::mm's
    assert ours["aten::mm"] == pytest.approx(410.706) and ours["Activity Buffer Request"] == pytest.approx(
        2863.483
    )
    # the GPU-side spans of the record_function ranges are not CPU time, nor work
    assert "10 GPU spans of record_function ranges" in s["note"]  # type: ignore[index]


def test_kernel_device_times_equal_key_averages_on_a_cuda_run() -> None:
    """torch's self device time of a kernel is its own time, as gputrace's GPU total of it; of a
    record_function range it is the range's GPU span (docs/metrics.md says how they differ)."""
    theirs, s = _kept_h200()
    kernels = {r["name"]: r for r in s["rows"] if r["queue"] is not None}  # type: ignore[attr-defined]
    assert len(kernels) == 5  # two gemms, a relu, a sum, a memset
    for name, r in kernels.items():
        assert r["calls"] == theirs[name]["count"] == 5
        assert r["gpu_ns"]["total"] / 1e3 == pytest.approx(
            theirs[name]["self_device_time_total_us"], abs=0.0005 * 5
        )
        assert r["self_ns"]["gpu_total"] == r["gpu_ns"]["total"]
    # a range: torch's self device is its span on the stream, gputrace's busy is its kernels' union
    assert theirs["act"]["self_device_time_total_us"] == pytest.approx(540.059)
    path = DATA / "torch_h200.json.gz"
    t = from_chrome(json.loads(gzip.decompress(path.read_bytes())), str(path))
    busy = figures.busy_ns(t)
    act = sum(int(busy[sc.index]) for sc in t.find("act"))
    relu_sum = sum(kernels[k]["gpu_ns"]["total"] for k in kernels if "gemm" not in k)  # + the memset
    assert act == relu_sum == 34_947
