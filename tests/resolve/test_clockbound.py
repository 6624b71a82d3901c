"""The feasible-set band (``gputrace.clockbound``), computed exactly, against two independent
references on random windows (fixed seeds): a dense grid over the drift, and every vertex of the
polygon of feasible clocks found by intersecting each pair of its edges."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from gputrace.clockbound import MAX_DRIFT, FeasibleBand
from gputrace.records import CalibrationSample
from gputrace.resolver import fit_clock

GRID = 200_001


def random_samples(seed: int) -> list[CalibrationSample]:
    """Windows around a linear clock (random offset and drift), some lopsided, a few wide."""
    rnd = random.Random(seed)
    n = rnd.randint(1, 24)
    drift = rnd.uniform(-400e-6, 400e-6)
    offset = rnd.randint(-(10**12), 10**12)
    out = []
    g = 10**9 + rnd.randint(0, 10**6)
    for _ in range(n):
        g += rnd.randint(1_000, 4_000_000)
        true = offset + g * (1.0 + drift)
        left, right = rnd.randint(0, 6_000), rnd.randint(0, 6_000)
        if rnd.random() < 0.1:
            right += 40_000  # a preempted thread
        out.append(CalibrationSample(int(np.floor(true)) - left, g, int(np.ceil(true)) + right, 0))
    rnd.shuffle(out)
    return out


def random_band(seed: int) -> tuple[list[CalibrationSample], FeasibleBand]:
    """``random_samples(seed)`` and the band of their fitted clock (a linear clock runs through
    every window, so there always is one)."""
    samples = random_samples(seed)
    fit = fit_clock(samples)
    assert fit is not None
    band = FeasibleBand.build(samples, fit)
    assert band is not None
    return samples, band


def frame(samples: list[CalibrationSample], band: FeasibleBand) -> tuple[np.ndarray, ...]:
    """Every sample's window in the band's frame: lower_i <= a + d·g_i <= upper_i."""
    fit = band.fit
    g = np.array([s.gpu_ns - fit.gpu_ref_ns for s in samples], np.float64)
    lower = np.array([s.cpu_before_ns - band.frame_cpu_ns for s in samples], np.float64) - g
    upper = np.array([s.cpu_after_ns - band.frame_cpu_ns for s in samples], np.float64) - g
    return g, lower, upper


def polygon_vertices(g: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """(d, a) of every vertex of {lower <= a + d·g <= upper, |d| <= MAX_DRIFT}, by brute force."""
    # each edge as  p·d + q·a = r
    edges = [(gi, 1.0, lo) for gi, lo in zip(g, lower, strict=True)]
    edges += [(gi, 1.0, up) for gi, up in zip(g, upper, strict=True)]
    edges += [(1.0, 0.0, -MAX_DRIFT), (1.0, 0.0, MAX_DRIFT)]
    out = []
    for (p1, q1, r1), (p2, q2, r2) in itertools.combinations(edges, 2):
        det = p1 * q2 - p2 * q1
        if det == 0:
            continue
        d = (r1 * q2 - r2 * q1) / det
        a = (p1 * r2 - p2 * r1) / det
        v = a + d * g
        if abs(d) <= MAX_DRIFT * (1 + 1e-12) and (v >= lower - 1e-6).all() and (v <= upper + 1e-6).all():
            out.append((d, a))
    return np.array(out)


SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_band_edges_equal_the_extremes_over_every_vertex(seed: int) -> None:
    samples, band = random_band(seed)
    g, lower, upper = frame(samples, band)
    verts = polygon_vertices(g, lower, upper)
    assert len(verts)
    # the feasible drifts, to float rounding (1e-15 of drift moves a time 1e-6 ns per ms)
    assert band.d_lo == pytest.approx(verts[:, 0].min(), rel=0, abs=1e-15)
    assert band.d_hi == pytest.approx(verts[:, 0].max(), rel=0, abs=1e-15)
    span = g.max() - g.min()
    x = np.concatenate([np.linspace(g.min() - span, g.max() + span, 41), g])
    low, high = band.limits(x)
    values = verts[:, 1][None, :] + verts[:, 0][None, :] * x[:, None]
    scale = 1e-6 * (1.0 + np.abs(x))
    np.testing.assert_array_less(np.abs(high - values.max(axis=1)), scale)
    np.testing.assert_array_less(np.abs(low - values.min(axis=1)), scale)


@pytest.mark.parametrize("seed", SEEDS)
def test_band_matches_a_dense_grid_over_the_drift(seed: int) -> None:
    samples, band = random_band(seed)
    g, lower, upper = frame(samples, band)
    d = np.linspace(-MAX_DRIFT, MAX_DRIFT, GRID)
    step = d[1] - d[0]
    low_d = np.max(lower[None, :] - d[:, None] * g[None, :], axis=1)
    high_d = np.min(upper[None, :] - d[:, None] * g[None, :], axis=1)
    ok = high_d >= low_d
    assert ok.any()
    # every feasible grid drift lies inside the band's drifts, and the band ends within a step
    assert band.d_lo <= d[ok].min() and band.d_hi >= d[ok].max()
    assert band.d_lo >= d[ok].min() - step and band.d_hi <= d[ok].max() + step
    span = g.max() - g.min()
    x = np.linspace(g.min() - span, g.max() + span, 25)
    low, high = band.limits(x)
    grid_high = np.max(high_d[ok][None, :] + d[ok][None, :] * x[:, None], axis=1)
    grid_low = np.min(low_d[ok][None, :] + d[ok][None, :] * x[:, None], axis=1)
    # the grid can only miss the extremes by what a drift step moves them
    tol = step * (np.abs(x)[:, None] + np.abs(g)[None, :]).max(axis=1) + 1e-6 * (1 + np.abs(x))
    assert (high >= grid_high - 1e-6 * (1 + np.abs(x))).all()
    assert (low <= grid_low + 1e-6 * (1 + np.abs(x))).all()
    np.testing.assert_array_less(high - grid_high, tol)
    np.testing.assert_array_less(grid_low - low, tol)
    # the stated error over the span of the samples the fit rests on (those whose windows were
    # not left out as too wide) is the largest on a dense grid of GPU times
    fit = band.fit
    own = np.array(
        [s.cpu_before_ns >= fit.first_cpu_ns and s.cpu_after_ns <= fit.last_cpu_ns for s in samples]
    )
    dense = np.linspace(g[own].min(), g[own].max(), 2001)
    lo2, hi2 = band.limits(dense)
    line = band._line(dense)
    dense_max = float(np.max(np.maximum(line - lo2, hi2 - line))) + 1.5
    assert dense_max - 1e-6 <= band.span_bound() <= dense_max + 1e-6


@pytest.mark.parametrize("seed", SEEDS)
def test_bound_holds_for_every_feasible_clock(seed: int) -> None:
    """``bound`` at a CPU time covers the fitted line's distance to every vertex clock there."""
    samples, band = random_band(seed)
    fit = band.fit
    g, lower, upper = frame(samples, band)
    verts = polygon_vertices(g, lower, upper)
    span = g.max() - g.min()
    x = np.linspace(g.min() - 2 * span, g.max() + 2 * span, 61)
    gpu = np.rint(x).astype(np.int64) + fit.gpu_ref_ns
    est = fit.to_cpu(gpu)
    bound = band.bound(est)
    xg = (gpu - fit.gpu_ref_ns).astype(np.float64)
    truths = band.frame_cpu_ns + xg[:, None] + verts[:, 1][None, :] + verts[:, 0][None, :] * xg[:, None]
    worst = np.max(np.abs(truths - est[:, None]), axis=1)
    assert (worst <= bound + 1e-3).all()


def test_no_linear_clock_fits_gives_no_band() -> None:
    samples = [
        CalibrationSample(0, 0, 100, 0),
        CalibrationSample(1_010_000, 1_000_000, 1_010_100, 0),
        CalibrationSample(2_000_000, 2_000_000, 2_000_100, 0),
    ]
    fit = fit_clock(samples)
    assert fit is not None and FeasibleBand.build(samples, fit) is None


def test_one_sample_gives_its_half_width_and_grows_with_the_drift_range() -> None:
    samples = [CalibrationSample(1_000, 5_000, 1_200, 0)]
    fit = fit_clock(samples)
    assert fit is not None
    band = FeasibleBand.build(samples, fit)
    assert band is not None
    assert band.d_lo == -MAX_DRIFT and band.d_hi == MAX_DRIFT
    assert band.span_bound() == 100 + 1.5  # half the window, + 1 ns integer windows, + rounding
    # 1 s away from the sample any drift up to MAX_DRIFT is possible
    far = band.bound(np.array([fit.cpu_ref_ns + 10**9]))[0]
    assert far == np.ceil(100 + MAX_DRIFT * 10**9 + 1.5)


@pytest.mark.parametrize("seed", range(10))
def test_many_vertices_in_blocks_give_the_same_edges(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows that widen away from the middle (parabolas) put every sample on both hulls."""
    rnd = random.Random(seed)
    samples = []
    for k in range(60):
        g = 10**9 + k * 1_000_000
        sag = (k - 30) ** 2 * 3 + rnd.randint(0, 2)
        samples.append(CalibrationSample(g - 5_000 - sag, g, g + 5_000 + sag, 0))
    fit = fit_clock(samples)
    assert fit is not None
    band = FeasibleBand.build(samples, fit)
    assert band is not None and len(band._drift) > 16
    x = np.linspace(-1e8, 2e8, 1001)
    one_by_one = band.limits(x)
    import gputrace.clockbound as cb

    monkeypatch.setattr(cb, "_FEW", 0)
    monkeypatch.setattr(cb, "_CHUNK", 4096)  # several blocks
    blocks = band.limits(x)
    np.testing.assert_allclose(blocks[0], one_by_one[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(blocks[1], one_by_one[1], rtol=0, atol=1e-6)


@pytest.mark.parametrize("seed", range(12))
def test_many_samples_refined_hull_gives_the_band_of_the_full_scan(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past a few dozen samples only the hull points a drift within range can touch are looked
    for (by refinement); the band must be the one a scan of every sample gives."""
    import gputrace.clockbound as cb

    rnd = random.Random(seed)
    n = rnd.choice([64, 200, 1500, 5000])
    drift = rnd.uniform(-60e-6, 60e-6)
    spacing = rnd.choice([1_000, 50_000, 5_000_000])
    samples = []
    for k in range(n):
        g = 10**12 + k * spacing + rnd.randint(0, spacing // 2)
        true = g * (1 + drift) - 1_100_000
        wide = 40_000 if rnd.random() < 0.01 else 0
        samples.append(
            CalibrationSample(
                int(true) - rnd.randint(0, 4_000), g, int(true) + rnd.randint(0, 4_000) + wide, 0
            )
        )
    fit = fit_clock(samples)
    assert fit is not None
    refined = FeasibleBand.build(samples, fit)
    monkeypatch.setattr(cb, "_SCAN_FROM", 10**9)
    scanned = FeasibleBand.build(samples, fit)
    assert refined is not None and scanned is not None
    assert refined.d_lo == scanned.d_lo and refined.d_hi == scanned.d_hi
    np.testing.assert_array_equal(refined._drift, scanned._drift)
    x = np.linspace(-2e9, 2e12, 301)
    for a, b in zip(refined.limits(x), scanned.limits(x), strict=True):
        np.testing.assert_array_equal(a, b)
    assert refined.span_bound() == scanned.span_bound()
    assert refined.centre_offset() == scanned.centre_offset()
