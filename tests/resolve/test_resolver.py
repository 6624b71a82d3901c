"""The resolver: clock fit against known offset/drift, order independence, every anomaly kind."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import gputrace
from gputrace.backends.base import CalibrationSample
from gputrace.backends.fake import FakeBackend
from gputrace.clock import FakeClock
from gputrace.model import Flag
from gputrace.resolver import fit_clock, uncertainty_at


def run_fake(
    script,
    *,
    offset_ns=0,
    drift_ppm=0.0,
    names=("k",),
    calls=10,
    gap_ns=1_000_000,
    step_ns=1_000,
    seed=0,
    in_order=True,
    streams=(None,),
):  # type: ignore[no-untyped-def]
    clock = FakeClock(1_000_000_000, step_ns)
    fb = FakeBackend(
        clock, offset_ns=offset_ns, drift_ppm=drift_ppm, script=script, seed=seed, in_order=in_order
    )
    with gputrace.session(backend=fb, clock=clock, quiet=True) as s:
        for _ in range(calls):
            for name in names:
                for stream in streams:
                    with gputrace.trace(name, stream=stream):
                        pass
            gputrace.sync()
            clock.advance(gap_ns)
    assert s.trace is not None
    return s.trace, fb


def truth_rows(trace, fb):  # type: ignore[no-untyped-def]
    """True (submit, start, end) per scope row: tokens are handed out in start order on one thread."""
    return [fb.truth[tok] for tok in sorted(fb.truth)]


@settings(max_examples=40, deadline=None)
@given(
    offset=st.integers(-(10**12), 10**12),
    drift=st.floats(-200.0, 200.0),
    step=st.integers(100, 5_000),
    seed=st.integers(0, 2**16),
)
def test_fit_recovers_offset_and_drift_within_stated_uncertainty(offset, drift, step, seed):  # type: ignore[no-untyped-def]
    trace, fb = run_fake(
        lambda n, i: (3_000, 7_000), offset_ns=offset, drift_ppm=drift, step_ns=step, seed=seed
    )
    fit = trace.clock_fits[0]
    truth = truth_rows(trace, fb)
    s = trace.scopes
    for row, (submit, start, end) in enumerate(truth):
        unc = int(s.uncertainty_ns[row])
        assert abs(int(s.gpu_start_ns[row]) - start) <= unc, (row, fit)
        assert abs(int(s.gpu_end_ns[row]) - end) <= unc, (row, fit)
        assert int(s.submit_ns[row]) == submit
    # the fit's slope is 1 / (1 + drift) to within what the samples can tell
    span = fit.last_cpu_ns - fit.first_cpu_ns
    assert abs(fit.slope * (1 + drift * 1e-6) - 1) <= 2 * fit.uncertainty_ns / span + 1e-9


def test_fit_is_exact_with_zero_width_windows() -> None:
    samples = [CalibrationSample(c, round((c - 500) * 1.00001), c, 0) for c in range(0, 10**9, 10**8)]
    fit = fit_clock(samples)
    assert fit is not None
    assert abs(fit.slope - 1 / 1.00001) < 1e-12
    assert fit.uncertainty_ns <= 1.5
    got = fit.to_cpu(np.array([round((7 * 10**8 - 500) * 1.00001)], np.int64))
    assert abs(int(got[0]) - 7 * 10**8) <= 1


@given(
    st.lists(
        st.tuples(st.integers(0, 10**12), st.integers(0, 10_000), st.integers(-(10**6), 10**6)),
        min_size=1,
        max_size=30,
    ),
    st.randoms(),
)
def test_fit_ignores_sample_order(raw, rnd) -> None:  # type: ignore[no-untyped-def]
    samples = [CalibrationSample(c, c + off, c + w, 0) for c, w, off in raw]
    shuffled = samples[:]
    rnd.shuffle(shuffled)
    assert fit_clock(samples) == fit_clock(shuffled)


def test_resolve_same_result_for_shuffled_raw_input() -> None:
    from gputrace.resolver import resolve

    clock = FakeClock(0, 100)
    fb = FakeBackend(clock, offset_ns=12345, drift_ppm=3.0, script=lambda n, i: (1000, 5000 + 100 * i))
    s = gputrace.session(backend=fb, clock=clock, quiet=True).start()
    for i in range(20):
        with gputrace.trace("a" if i % 2 else "b"):
            pass
        if i % 5 == 0:
            gputrace.sync()
    a = s.stop()
    raw = s._raw
    raw.spans = raw.spans.take(np.arange(len(raw.spans))[::-1])
    raw.samples.reverse()
    random.Random(1).shuffle(raw.threads)
    b = resolve(raw)
    for col in a.scopes.COLUMNS:
        assert np.array_equal(getattr(a.scopes, col), getattr(b.scopes, col)), col
    assert a.names == b.names and a.clock_fits == b.clock_fits


def test_single_sample_extrapolates_with_assumed_drift() -> None:
    fit = fit_clock([CalibrationSample(1000, 5000, 1200, 0)])
    assert fit is not None and fit.slope == 1.0 and fit.uncertainty_ns == 100.5
    unc = uncertainty_at(fit, np.array([1100, 1_000_001_200], np.int64))
    assert unc.tolist() == [101, 101 + 50_000]  # 50 ppm of 1 s


# --- anomalies --------------------------------------------------------------------------------


def flags_of(trace, name):  # type: ignore[no-untyped-def]
    return [sc.flag_names for sc in trace.find(name)]


def test_cold_first_call_per_name() -> None:
    trace, _ = run_fake(lambda n, i: (1000, 5000), names=("a", "b"), calls=3)
    assert flags_of(trace, "a") == [["cold"], [], []]
    assert flags_of(trace, "b") == [["cold"], [], []]


def test_empty_gpu_span() -> None:
    trace, _ = run_fake(lambda n, i: (1000, 0 if n == "empty" else 5000), names=("empty", "full"), calls=2)
    assert flags_of(trace, "empty") == [["cold", "empty_gpu_span"], ["empty_gpu_span"]]
    assert flags_of(trace, "full") == [["cold"], []]
    # the empty span's zero is kept as measured, not turned into a missing value
    assert trace.find("empty")[1].gpu_ns == 0


def test_gpu_longer_than_wall_window() -> None:
    # the fake GPU "runs" 50 ms but the sync (clock not advanced by an out-of-order fake) comes sooner
    clock = FakeClock(0, 1000)
    fb = FakeBackend(clock, script=lambda n, i: (1000, 50_000_000))
    fb.sync = lambda: None  # type: ignore[method-assign]  # a broken GPU clock: completion seen early
    with gputrace.session(backend=fb, clock=clock, quiet=True) as s:
        with gputrace.trace("long"):
            pass
    assert s.trace is not None
    sc = s.trace.find("long")[0]
    assert "gpu_exceeds_wall" in sc.flag_names
    assert sc.gpu_ns == 50_000_000  # kept as measured


def test_start_before_submit() -> None:
    trace, _ = run_fake(lambda n, i: (-500_000 if i == 1 else 1000, 5000), calls=3, in_order=False)
    assert flags_of(trace, "k") == [["cold"], ["start_before_submit"], []]
    sc = trace.find("k")[1]
    assert sc.queue_gap_ns is not None and sc.queue_gap_ns < -sc.uncertainty_ns


def test_overlap_on_one_queue() -> None:
    # out of order on one in-order queue: the second span starts inside the first and ends after it
    def script(n: str, i: int) -> tuple[int, int]:
        return (1000, 100_000) if n == "first" else (-50_000, 100_000)

    clock = FakeClock(0, 1000)
    fb = FakeBackend(clock, script=script, in_order=False)
    with gputrace.session(backend=fb, clock=clock, quiet=True) as s:
        with gputrace.trace("first"):
            pass
        clock.advance(60_000)
        with gputrace.trace("second"):
            pass
    assert s.trace is not None
    assert "overlap" in s.trace.find("first")[0].flag_names
    assert "overlap" in s.trace.find("second")[0].flag_names


def test_outlier_by_robust_rule() -> None:
    trace, _ = run_fake(lambda n, i: (1000, 90_000 if i == 6 else 10_000 + 10 * (i % 3)), calls=10)
    flags = flags_of(trace, "k")
    assert [i for i, f in enumerate(flags) if "outlier" in f] == [6]


def test_untimed_scopes_are_flagged_not_faked() -> None:
    trace, _ = run_fake(lambda n, i: (1000, None), calls=2)
    for sc in trace.find("k"):
        assert "untimed" in sc.flag_names and sc.gpu_start_ns is None
        assert "empty_gpu_span" not in sc.flag_names


def test_anomaly_report_in_header() -> None:
    trace, _ = run_fake(lambda n, i: (1000, 0), calls=2)
    report = trace.header["anomalies"]
    assert report["counts"] == {"cold": 1, "empty_gpu_span": 2}
    assert [it["kinds"] for it in report["items"]] == [["empty_gpu_span"], ["empty_gpu_span"]]
    assert report["items"][0]["explain"][0].startswith("no GPU work ran")


def test_streams_become_queues() -> None:
    trace, _ = run_fake(lambda n, i: (1000, 5000), streams=("s1", "s2"), calls=2)
    assert sorted({sc.queue.label for sc in trace if sc.queue}) == ["stream s1", "stream s2"]
    assert not any("overlap" in sc.flag_names for sc in trace)


def test_spans_cover_children_hull() -> None:
    clock = FakeClock(0, 1000)
    fb = FakeBackend(
        clock, script=lambda n, i: (1000, 0 if n == "parent" else 5000), spans_cover_children=True
    )
    with gputrace.session(backend=fb, clock=clock, quiet=True) as s:
        with gputrace.trace("parent"):
            with gputrace.trace("child"):
                pass
    assert s.trace is not None
    parent, child = s.trace.find("parent")[0], s.trace.find("child")[0]
    assert parent.gpu_start_ns is not None and child.gpu_start_ns is not None
    assert parent.gpu_start_ns <= child.gpu_start_ns and parent.gpu_end_ns >= child.gpu_end_ns  # type: ignore[operator]
    assert "empty_gpu_span" not in parent.flag_names
    assert not (parent.flags & Flag.OVERLAP)


# --- the feasible-set bound (gputrace.clockbound) ----------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    offset=st.integers(-(10**12), 10**12),
    drift_ppm=st.floats(-500.0, 500.0),
    n=st.integers(1, 40),
    spacing=st.integers(1_000, 10**9),
    widths=st.lists(st.tuples(st.integers(0, 50_000), st.integers(0, 50_000)), min_size=40, max_size=40),
    queries=st.lists(st.floats(-0.5, 1.5), min_size=1, max_size=5),
)
def test_feasible_band_always_contains_the_truth(offset, drift_ppm, n, spacing, widths, queries):  # type: ignore[no-untyped-def]
    from gputrace.clockbound import FeasibleBand

    slope = 1.0 / (1.0 + drift_ppm * 1e-6)

    def truth(g: float) -> float:  # the CPU time of GPU time g
        return offset + g * slope

    samples = []
    for k in range(n):
        g = 10**9 + k * spacing
        c = truth(g)
        left, right = widths[k]
        samples.append(CalibrationSample(int(np.floor(c)) - left, g, int(np.ceil(c)) + right, 0))
    fit = fit_clock(samples)
    assert fit is not None
    band = FeasibleBand.build(samples, fit)
    assert band is not None  # the truth is a linear clock inside every window
    span = max(spacing * (n - 1), 1)
    for q in queries:
        g = int(10**9 + q * span)
        est = int(fit.to_cpu(np.array([g], np.int64))[0])
        bound = float(band.bound(np.array([est]))[0])
        assert abs(est - truth(g)) <= bound + 1, (q, est - truth(g), bound)


def test_feasible_band_is_far_tighter_than_any_window() -> None:
    from gputrace.clockbound import FeasibleBand

    rnd = random.Random(3)
    samples = []
    for k in range(300):
        true = 10**9 + k * 3_000_000
        samples.append(
            CalibrationSample(true - rnd.randint(0, 20_000), true - 777, true + rnd.randint(0, 20_000))
        )
    fit = fit_clock(samples)
    assert fit is not None
    band = FeasibleBand.build(samples, fit)
    assert band is not None
    assert band.span_bound() < 1_000 < 15_000 < fit.uncertainty_ns


def test_windows_no_linear_clock_fits_keep_the_residual_bound() -> None:
    from gputrace.clockbound import FeasibleBand

    # the middle sample's window lies 10 µs off the line through the other two
    samples = [
        CalibrationSample(0, 0, 100, 0),
        CalibrationSample(1_010_000, 1_000_000, 1_010_100, 0),
        CalibrationSample(2_000_000, 2_000_000, 2_000_100, 0),
    ]
    fit = fit_clock(samples)
    assert fit is not None and FeasibleBand.build(samples, fit) is None


def test_resolver_states_the_tighter_bound_in_the_header() -> None:
    trace, fb = run_fake(lambda n, i: (3_000, 7_000), calls=40, step_ns=5_000, seed=7)
    (clock,) = trace.header["clock"]
    assert clock["bound"] == "feasible set" and clock["uncertainty_ns"] < 2_500  # windows: 5 µs
    s = trace.scopes
    for row, (_submit, start, end) in enumerate(truth_rows(trace, fb)):
        assert abs(int(s.gpu_start_ns[row]) - start) <= int(s.uncertainty_ns[row])
        assert abs(int(s.gpu_end_ns[row]) - end) <= int(s.uncertainty_ns[row])


def test_the_cpu_only_fallback_orders_scopes_as_every_trace_is_ordered() -> None:
    """When resolving fails, the CPU scopes are kept in the model's order: (start, thread, -end),
    not thread by thread, so two threads' scopes interleave in time as they do in a resolved trace."""
    from gputrace.fallback import cpu_scopes
    from gputrace.records import RawThread

    def thread(tid: int, *spans: tuple[int, int]) -> RawThread:
        times = np.array([[a, b, 0, 0] for a, b in spans], np.int64)
        return RawThread(tid, f"t{tid}", [f"s{tid}.{i}" for i in range(len(spans))], times, {})

    # thread 1: 10-40 holding 10-20; thread 2: 5-15 and 30-35
    got = cpu_scopes({}, [thread(1, (10, 40), (10, 20)), thread(2, (5, 15), (30, 35))], "resolving failed")
    s = got.scopes
    assert [got.names[n] for n in s.name] == ["s2.0", "s1.0", "s1.1", "s2.1"]
    assert s.cpu_start_ns.tolist() == [5, 10, 10, 30]
    assert s.thread.tolist() == [1, 0, 0, 1]
    assert s.depth.tolist() == [0, 0, 1, 0]  # nesting still per thread
    assert all(int(f) & int(Flag.DEGRADED) for f in s.flags)
