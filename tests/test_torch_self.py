"""Self (exclusive) CPU time per name against ``torch.profiler``'s ``key_averages`` on the same run.

The test records a small torch program on the CPU with ``torch.profiler``, exports its Chrome
trace, and reads it as another tool's trace. Each name's self CPU total must be within 1 % of what
``key_averages`` reports (its times are µs; the trace keeps them to 3 decimals). Without torch the
test is skipped with the reason; ``tests/setup.sh`` installs the CPU build.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputrace.exporters.foreign import from_chrome
from gputrace.summary import summarize


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
