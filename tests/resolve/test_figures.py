"""The oracle suite: every derived figure (docs/metrics.md) on synthetic traces whose answers are
known exactly, from the fake GPU (spans) and the fake CUPTI source (operations).

The clock only moves when a test moves it (``FakeClock(…, 0)``), so every CPU time is chosen by
the test and every GPU time follows from the fake GPU's rules: in order per stream, an operation
starts ``latency`` after its launch call or when the stream is free, whichever is later.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gputrace
from gputrace import figures
from gputrace.clock import FakeClock
from gputrace.exporters.reader import from_chrome
from gputrace.model import NO_TIME as NO_TIME
from gputrace.render import distinct_names, render
from gputrace.summary import summarize
from tests.builders import T0, cupti_trace


def _by_name(t: gputrace.Trace, values: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i in range(len(t)):
        out.setdefault(t.names[int(t.scopes.name[i])], []).append(int(values[i]))
    return out


def _row(s: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in s["rows"] if r["name"] == name)


def test_operations_busy_self_submission_and_queued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = cupti_trace(tmp_path, monkeypatch)
    assert figures.intervals(t).source == "operations"
    assert _by_name(t, figures.busy_ns(t)) == {"step": [52_700] * 2, "tiny": [1_500] * 2, "big": [51_000] * 2}
    assert _by_name(t, figures.self_gpu_ns(t)) == {
        "step": [200] * 2,
        "tiny": [1_500] * 2,
        "big": [51_000] * 2,
    }
    assert _by_name(t, figures.self_cpu_ns(t)) == {
        "step": [114_000 - 11_000 - 2_000] * 2, "tiny": [11_000] * 2, "big": [2_000] * 2}  # fmt: skip
    # submission: the first operation's launch call, for the step too (entered 1 µs earlier)
    sub = _by_name(t, figures.submission_ns(t) - T0)
    assert sub == {"step": [1_000, 201_000], "tiny": [1_000, 201_000], "big": [113_000, 313_000]}
    assert _by_name(t, figures.queued_ns(t)) == {"step": [2_000] * 2, "tiny": [2_000] * 2, "big": [2_000] * 2}
    # the resolver's submission is that same one: the trace args and the queued bars follow it
    assert np.array_equal(t.scopes.submit_ns, figures.submission_ns(t))
    assert _by_name(t, figures.launches(t)) == {"step": [6] * 2, "tiny": [3] * 2, "big": [2] * 2}
    # host waits closed by each scope's work: k2 (8500), m (100300), and in the warm step the
    # 37000 between the steps (closed by the second k1)
    assert _by_name(t, figures.host_wait_ns(t)) == {
        "step": [108_800, 145_800], "tiny": [8_500, 45_500], "big": [100_300] * 2}  # fmt: skip


def test_operations_idle_share_launch_bound_and_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = cupti_trace(tmp_path, monkeypatch)
    s = summarize(t)
    (q,) = s["idle"]
    # window 3000 … 366000; busy 2 × 52700; gaps: 500 and 1000 queued behind work, the rest host waits
    assert {k: q[k] for k in ("window_ns", "busy_ns", "idle_ns", "waiting_for_host_ns",
                              "between_queued_work_ns", "unknown_ns")} == {
        "window_ns": 363_000, "busy_ns": 105_400, "idle_ns": 257_600,
        "waiting_for_host_ns": 2 * 108_800 + 37_000, "between_queued_work_ns": 2 * 1_500, "unknown_ns": 0,
    }  # fmt: skip
    assert s["gpu_busy_ns"] == 105_400
    step, tiny, big = _row(s, "step"), _row(s, "tiny"), _row(s, "big")
    assert (step["gpu_share"], tiny["gpu_share"], big["gpu_share"]) == (
        1.0,
        3_000 / 105_400,
        102_000 / 105_400,
    )
    assert step["gpu_busy_ns"] == {"median": 52_700.0, "total": 105_400}
    assert step["self_ns"] == {"cpu_median": 101_000.0, "cpu_total": 202_000, "gpu_median": 200.0,
                               "gpu_total": 400}  # fmt: skip
    assert tiny["queue_gap_ns"] == {"median": 2_000.0, "p95": 2_000.0}
    # 500 ns of work per launch against a 5 µs launch, and the GPU waited 45.5 µs for 1.5 µs of work
    assert (tiny["launch_bound"], big["launch_bound"], step["launch_bound"]) == (True, False, False)
    (lb,) = [a for a in s["anomalies"] if a["kind"] == "launch_bound"]
    assert lb["name"] == "tiny" and "CUDA graph" in lb["what_to_do"] and "submit" not in lb["what_to_do"]
    # launches free: busy + one calibrated graph launch, where that beats the measured span
    assert tiny["if_launches_free"]["median_ns"] == 1_500 + 3_000
    assert tiny["if_launches_free"]["span_median_ns"] == 10_500
    assert "one CUDA graph launch" in tiny["if_launches_free"]["assumes"]
    assert step["if_launches_free"]["median_ns"] == 52_700 + 3_000
    assert big["if_launches_free"] is None  # 51 µs of busy + 3 µs is no faster than its 51 µs span
    text = render(s, "table")
    assert "What it would take if launches were free (an estimate)" in text
    assert "tiny (0:stream 7): measured span median 10.5 µs, estimate 4.50 µs" in text


def test_a_file_gives_the_same_figures_and_its_queued_bars_start_at_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.json"
    t = cupti_trace(tmp_path, monkeypatch, path)
    back = gputrace.load(path)
    for f in (figures.busy_ns, figures.self_gpu_ns, figures.self_cpu_ns, figures.queued_ns):
        assert np.array_equal(f(back), f(t))
    doc = json.loads(path.read_text())
    base = t.base_ns
    (step0,) = [sc.index for sc in t.find("step") if sc.cpu_start_ns == T0]
    begins = [e for e in doc["traceEvents"] if e.get("ph") == "b" and e.get("id2", {}).get("local") == step0]
    assert [round(e["ts"] * 1000) for e in begins] == [T0 + 1_000 - base]  # the launch, not the entry
    gpu = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("bind_id") == step0
           and e.get("pid", 0) >= 2**30]  # fmt: skip
    assert [(e["args"]["gpu_busy_us"], e["args"]["gpu_self_us"]) for e in gpu] == [(52.7, 0.2)]
    assert [e["args"]["if_launches_free_us"] for e in gpu] == [55.7]  # 52.7 µs + one graph launch
    (big0,) = [sc.index for sc in t.find("big") if sc.cpu_start_ns == T0 + 112_000]
    big = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("bind_id") == big0
           and e.get("pid", 0) >= 2**30]  # fmt: skip
    assert [("if_launches_free_us" in e["args"]) for e in big] == [False]  # no faster back to back


def test_webgpu_calibration_judges_webgpu_traces_and_gives_webgpu_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = cupti_trace(tmp_path, monkeypatch)
    t.header["backend"] = "wgpu"  # the same work as if a WebGPU queue ran it
    assert summarize(t)["calibration"] is not None
    assert all(r["launch_bound"] is None for r in summarize(t)["rows"])  # a CUDA calibration: no verdict
    t.header["calibration"]["backend"] = "wgpu"
    s = summarize(t)
    (lb,) = [a for a in s["anomalies"] if a["kind"] == "launch_bound"]
    assert "submit" in lb["what_to_do"] and "CUDA" not in lb["what_to_do"]
    est = _row(s, "tiny")["if_launches_free"]
    assert est["median_ns"] == 1_500 + 5_000 and "one submit" in est["assumes"]


def test_spans_busy_idle_share_and_queued() -> None:
    """The fake GPU times whole scopes (as CUDA events and wgpu passes do): a: 5 µs after its
    submission for 20 µs; b: 1 µs after, 10 µs; c: 30 µs after, 5 µs."""
    script = {"a": (5_000, 20_000), "b": (1_000, 10_000), "c": (30_000, 5_000)}
    clock = FakeClock(1_000_000, 0)
    opts = {"script": lambda name, i: script[name]}
    with gputrace.session(backend="fake", clock=clock, quiet=True, backend_options=opts) as s:
        clock.advance(T0 - clock.now_ns)
        for at, name in ((0, "a"), (10_000, "b"), (50_000, "b"), (55_000, "c")):
            clock.advance(T0 + at - clock.now_ns)
            with gputrace.trace(name):
                clock.advance(1_000)
    t = s.trace
    assert t is not None
    # GPU: a 5000–25000, b 25000–35000 (behind a), b 51000–61000, c 85000–90000 (submitted at
    # 55000, while b ran: the gap 61000–85000 is between queued work; 35000–51000 a host wait)
    assert figures.intervals(t).source in ("spans", "scopes")
    assert _by_name(t, figures.busy_ns(t)) == {"a": [20_000], "b": [10_000, 10_000], "c": [5_000]}
    assert _by_name(t, figures.queued_ns(t)) == {"a": [5_000], "b": [15_000, 1_000], "c": [30_000]}
    (q,) = figures.stream_idle(t)
    assert (q["window_ns"], q["busy_ns"], q["waiting_for_host_ns"], q["between_queued_work_ns"]) == (
        85_000, 45_000, 16_000, 24_000)  # fmt: skip
    s2 = summarize(t)
    assert {r["name"]: r["gpu_share"] for r in s2["rows"]} == {"a": 20 / 45, "b": 20 / 45, "c": 5 / 45}
    assert {r["name"]: r["self_ns"]["cpu_total"] for r in s2["rows"]} == {"a": 1_000, "b": 2_000, "c": 1_000}


def test_union_counts_overlapping_work_once() -> None:
    group = np.array([0, 0, 0, 0, 1, 1], np.int64)
    start = np.array([0, 10, 5, 30, 100, 100], np.int64)
    end = np.array([10, 20, 8, 31, 100, 150], np.int64)  # group 1: an empty interval and one of 50
    assert figures.union_by_group(group, start, end, 3).tolist() == [21, 50, 0]


def test_foreign_traces_sort_by_self_cpu_time_as_key_averages() -> None:
    path = Path(__file__).parents[1] / "data" / "pytorch.json"
    t = from_chrome(json.loads(path.read_text()), str(path))
    s = summarize(t)
    assert s["sort"] == "self_cpu_total"
    cpu = {r["name"]: r["self_ns"]["cpu_total"] for r in s["rows"] if r["queue"] is None}
    # aten::mm holds the launches; the kernels are GPU work, not CPU time of the launch call
    assert cpu["cudaLaunchKernel"] == _row(s, "cudaLaunchKernel")["cpu_ns"]["total"]
    assert cpu["aten::mm"] == _row(s, "aten::mm")["cpu_ns"]["total"] - cpu["cudaLaunchKernel"]
    assert summarize(t, sort="self")["sort"] == "self_gpu_total"


def test_distinct_kernels_keep_distinct_names_in_text() -> None:
    a = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma"
    a += "_execute_kernel__5x_cublas"
    b = a.replace("execute_kernel", "execute_split_k_kernel")
    short = distinct_names([a, b, a], 40)
    assert short[0] == short[2] != short[1] and all(len(x) <= 40 for x in short)
    same_tail = distinct_names(["x" * 50 + "1" + "y" * 50, "x" * 50 + "2" + "y" * 50], 20)
    assert same_tail[0] != same_tail[1] and same_tail[0].endswith("#1")


def _spans_session(script: dict[str, tuple[int, int]], body: Any) -> gputrace.Trace:
    """A fake-GPU session (the GPU times whole scopes, as wgpu passes and CUDA events do) whose
    clock only ``body`` moves; ``script``: name -> (delay after submission, GPU duration)."""
    clock = FakeClock(1_000_000, 0)
    opts = {"script": lambda name, i: script[name]}
    with gputrace.session(backend="fake", clock=clock, quiet=True, backend_options=opts) as s:
        clock.advance(T0 - clock.now_ns)
        body(clock)
    assert s.trace is not None
    return s.trace


def test_spans_self_gpu_is_busy_less_the_childrens() -> None:
    def body(clock: FakeClock) -> None:
        with gputrace.trace("outer"):  # 0 … 7000
            clock.advance(5_000)
            with gputrace.trace("inner"):  # 5000 … 6000
                clock.advance(1_000)
            clock.advance(1_000)

    t = _spans_session({"outer": (1_000, 30_000), "inner": (2_000, 10_000)}, body)
    # GPU: inner 7000–17000 (2 µs after its submission), outer behind it 17000–47000
    assert _by_name(t, t.scopes.gpu_start_ns - T0) == {"outer": [17_000], "inner": [7_000]}
    assert _by_name(t, figures.busy_ns(t)) == {"outer": [40_000], "inner": [10_000]}
    assert _by_name(t, figures.self_gpu_ns(t)) == {"outer": [30_000], "inner": [10_000]}
    assert _by_name(t, figures.self_cpu_ns(t)) == {"outer": [6_000], "inner": [1_000]}


def test_spans_launch_bound_only_for_short_work_the_gpu_waited_for_with_webgpu_advice() -> None:
    """Five 1 µs passes 20 µs apart (the GPU waits 19 µs on the host before each), then three
    36 ms passes submitted back to back: only the short ones are launch-bound, and the advice
    is WebGPU's (the issue's 36 ms kernel got CUDA advice)."""

    def body(clock: FakeClock) -> None:
        for i in range(5):
            clock.advance(T0 + i * 20_000 - clock.now_ns)
            with gputrace.trace("tiny"):
                clock.advance(1_000)
        clock.advance(T0 + 200_000 - clock.now_ns)
        for _ in range(3):
            with gputrace.trace("big"):
                clock.advance(1_000)

    t = _spans_session({"tiny": (2_000, 1_000), "big": (3_000, 36_000_000)}, body)
    assert _by_name(t, figures.host_wait_ns(t)) == {"tiny": [0] + [19_000] * 4, "big": [120_000, 0, 0]}
    t.header["backend"] = "wgpu"
    t.header["calibration"] = {"backend": "wgpu", "launch_cpu_ns": 5_000, "launch_gpu_ns": 1_000}
    s = summarize(t)
    tiny, big = _row(s, "tiny"), _row(s, "big")
    assert (tiny["launch_bound"], big["launch_bound"]) == (True, False)
    assert (tiny["host_wait_ns"], big["host_wait_ns"]) == (76_000, 0)  # warm calls
    (lb,) = [a for a in s["anomalies"] if a["kind"] == "launch_bound"]
    assert lb["name"] == "tiny" and lb["what_to_do"] == figures.ADVICE["wgpu"]
    # busy 1 µs + one 5 µs submit is no faster than the 1 µs span: no estimate
    assert tiny["if_launches_free"] is None and big["if_launches_free"] is None


def test_cuda_without_a_graph_launch_calibrated_estimates_with_one_kernel_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = cupti_trace(tmp_path, monkeypatch)
    del t.header["calibration"]["graph_launch_ns"]
    s = summarize(t)
    tiny, step, big = _row(s, "tiny"), _row(s, "step"), _row(s, "big")
    assert tiny["if_launches_free"]["median_ns"] == 1_500 + 5_000
    assert step["if_launches_free"]["median_ns"] == 52_700 + 5_000
    assert "one launch (no graph launch calibrated)" in tiny["if_launches_free"]["assumes"]
    assert big["if_launches_free"] is None  # 51 µs + 5 µs is slower than its 51 µs span


def test_idle_closed_by_work_of_unknown_submission_is_unknown() -> None:
    """Another tool's trace: kernel a (launched at 0, ran 10–20 µs), kernel b (no launch seen,
    30–40 µs), kernel c (launched at 45, ran 50–60 µs): the 10 µs before b are unknown, the
    10 µs before c a host wait."""
    ev: list[dict[str, Any]] = [
        {"ph": "X", "cat": "cuda_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 0.0, "dur": 2.0,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 45.0, "dur": 2.0,
         "args": {"correlation": 3}},
    ]  # fmt: skip
    for name, ts, corr in (("a", 10.0, 1), ("b", 30.0, 2), ("c", 50.0, 3)):
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 10.0,
                   "args": {"correlation": corr, "device": 0, "stream": 7}})  # fmt: skip
    t = from_chrome({"traceEvents": ev}, "other.json")
    (q,) = figures.stream_idle(t)
    assert {k: q[k] for k in ("window_ns", "busy_ns", "idle_ns", "waiting_for_host_ns",
                              "between_queued_work_ns", "unknown_ns")} == {
        "window_ns": 50_000, "busy_ns": 30_000, "idle_ns": 20_000, "waiting_for_host_ns": 10_000,
        "between_queued_work_ns": 0, "unknown_ns": 10_000}  # fmt: skip
    assert _by_name(t, figures.queued_ns(t)) == {"launch": [NO_TIME] * 2, "a": [10_000], "b": [NO_TIME],
                                                 "c": [5_000]}  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 500), st.integers(-20, 80), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_a_streams_gaps_are_its_window_less_the_union_of_its_work(
    work: list[tuple[int, int, int, bool]],
) -> None:
    """Idle = window − busy on every stream, each gap is closed by work starting at its end, and a
    gap is a host wait exactly when that work was submitted after the gap opened."""
    queue, start, length, late = (np.array(x, np.int64) for x in zip(*work, strict=True))
    end = start + length  # a negative length (a flagged bad timestamp) covers nothing
    submit = np.where(late.astype(bool), start - 1, NO_TIME)
    iv = figures.Intervals(np.zeros(len(work), np.int64), queue, start, end, submit, "spans")
    gp = figures.gaps(iv)
    for q in set(queue.tolist()):
        mine, rows = gp.queue == q, queue == q
        window = int(np.maximum(end[rows], start[rows]).max() - start[rows].min())
        busy = figures.union_by_group(np.zeros(int(rows.sum()), np.int64), start[rows], end[rows], 1)[0]
        assert int((gp.end_ns[mine] - gp.start_ns[mine]).sum()) == window - busy
        assert (gp.end_ns[mine] > gp.start_ns[mine]).all()
    assert (iv.start_ns[gp.closer] == gp.end_ns).all() and (iv.queue[gp.closer] == gp.queue).all()
    assert np.array_equal(gp.known, submit[gp.closer] != NO_TIME)
    assert np.array_equal(gp.host, gp.known & (submit[gp.closer] > gp.start_ns))
