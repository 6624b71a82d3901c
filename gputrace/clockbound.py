"""A tighter, still rigorous alignment bound: the set of linear clocks that fit every window.

A linear clock ``cpu = cpu_ref + x + a + δ·x`` (``x = g − gpu_ref``) fits sample ``i`` when
``before_i ≤ cpu_ref + x_i + a + δ·x_i ≤ after_i``; the 2n half-planes cut out a convex polygon of
``(a, δ)``. At any ``x`` the truth lies between the least and the greatest ``a + δ·x`` over it, so
the fitted line's error there is at most its larger distance to those (docs/accuracy.md). An empty
polygon (no linear clock fits every window) leaves the resolver its residual bound alone. The drift
is searched within ±``MAX_DRIFT`` (1000 ppm, 20× any clock measured), so one sample gives a finite
bound away from it.

Exact, with no search: ``L(δ) = max_i(lower_i − δ·g_i)`` and ``U(δ) = min_i(upper_i − δ·g_i)``
bend only at slopes between neighbouring hull points of ``(g_i, lower_i)`` and ``(g_i, upper_i)``,
so the feasible drifts (``U − L ≥ 0``) and the extremes of ``a + δ·x`` lie on those breakpoints or
the drift range's ends: the band is kept as those few vertices.

>>> from gputrace.backends.base import CalibrationSample
>>> from gputrace.resolver import fit_clock
>>> import numpy as np
>>> samples = [CalibrationSample(t, t + 10 + (t // 7) % 90, t + 100, 0) for t in range(0, 10**6, 997)]
>>> fit = fit_clock(samples)
>>> band = FeasibleBand.build(samples, fit)
>>> bound = band.bound(np.array([500_000]))[0]
>>> bool(bound < 10), fit.uncertainty_ns > 50   # the windows are 100 ns wide
(True, True)
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gputrace.model import I64, ClockFit
from gputrace.npstats import distinct
from gputrace.records import CalibrationSample

F64 = npt.NDArray[np.float64]

MAX_DRIFT = 1e-3
_CHUNK = 1 << 20  # elements per (queries × vertices) block when evaluating the band's edges
_FEW = 16  # up to this many vertices, the edges are evaluated one line at a time


class FeasibleBand:
    """The polygon of linear clocks consistent with every calibration window."""

    def __init__(
        self, fit: ClockFit, x: F64, lower: F64, upper: F64, drift: F64, span: tuple[float, float]
    ) -> None:
        self.fit = fit  # the line whose error is bounded; its cpu_ref may move (see centre_offset)
        self.frame_cpu_ns = fit.cpu_ref_ns  # lower/upper are relative to this
        self.x = x  # the hull points' GPU times
        self.span = span  # GPU times of the first and the last sample the fit rests on (frame of x)
        self._drift = drift  # the polygon's vertices' drifts, sorted: from d_lo to d_hi
        self.d_lo, self.d_hi = float(drift[0]), float(drift[-1])
        self._low_at = _edge_low(x, lower, drift)  # L(δ) at each vertex drift
        self._high_at = _edge_high(x, upper, drift)  # U(δ) at each vertex drift

    @classmethod
    def build(cls, samples: Sequence[CalibrationSample], fit: ClockFit) -> FeasibleBand | None:
        """The band, or None when no linear clock fits every window."""
        cols = sample_columns(samples)
        return cls.from_columns(cols[:, 0], cols[:, 1], cols[:, 2], fit)

    @classmethod
    def from_columns(cls, before: I64, gpu: I64, after: I64, fit: ClockFit) -> FeasibleBand | None:
        """``build`` from the samples' columns: CPU before, GPU, CPU after (integer ns)."""
        if not len(gpu):
            return None
        g = (gpu - fit.gpu_ref_ns).astype(np.float64)
        lower = (before - fit.cpu_ref_ns).astype(np.float64) - g
        upper = (after - fit.cpu_ref_ns).astype(np.float64) - g
        # Centre and bound the line over the samples the fit rests on: those it left out (too wide)
        # still narrow the band, but centring over their stretch moved a fit 1 ms off where its own
        # samples were tight (a session whose stop windows were 2 ms wide).
        own = (before >= fit.first_cpu_ns) & (after <= fit.last_cpu_ns)
        g_own = g[own] if own.any() else g
        span = (float(g_own.min()), float(g_own.max()))
        # Only hull points can bind (L: the upper hull of (g, lower); U: the lower hull of
        # (g, upper)), and only those a drift within ±MAX_DRIFT touches.
        lo, up = _upper_hull_in_range(g, lower), _upper_hull_in_range(g, -upper)
        lower = np.concatenate([lower[lo], np.full(len(up), -np.inf)])
        upper = np.concatenate([np.full(len(lo), np.inf), upper[up]])
        g = np.concatenate([g[lo], g[up]])

        # U − L is concave and linear between neighbouring bends: its values there decide it all.
        bends = _bends(g, lower, upper)
        d = distinct(np.concatenate([[-MAX_DRIFT, MAX_DRIFT], bends[np.abs(bends) < MAX_DRIFT]]))
        gap = _edge_high(g, upper, d) - _edge_low(g, lower, d)
        best = int(np.argmax(gap))
        if gap[best] < -1.0:  # 1 ns: the windows are integers, the fit is rounded
            return None
        if gap[best] < 0:  # feasible only within rounding: the best drift alone
            return cls(fit, g, lower, upper, d[best : best + 1], span)
        ok = np.flatnonzero(gap >= 0)  # one run of neighbours (U − L is concave)
        d_lo, d_hi = _crossing(d, gap, int(ok[0]), -1), _crossing(d, gap, int(ok[-1]), 1)
        # the polygon's vertices: every drift where L or U bends inside [d_lo, d_hi], and the ends
        drift = distinct(np.concatenate([[d_lo, d_hi], bends[(bends > d_lo) & (bends < d_hi)]]))
        return cls(fit, g, lower, upper, drift, span)

    def limits(self, x: F64) -> tuple[F64, F64]:
        """Smallest and largest ``cpu − cpu_ref − x`` any feasible clock gives at GPU times ``x``."""
        x = np.asarray(x, np.float64)
        d = self._drift
        if len(d) <= _FEW:  # a line at a time: a few passes over x beat a (len(x), few) block
            low = self._low_at[0] + d[0] * x
            high = self._high_at[0] + d[0] * x
            for k in range(1, len(d)):
                np.minimum(low, self._low_at[k] + d[k] * x, out=low)
                np.maximum(high, self._high_at[k] + d[k] * x, out=high)
            return low, high
        low, high = np.empty(len(x)), np.empty(len(x))
        step = max(1, _CHUNK // len(d))
        for i in range(0, len(x), step):
            xs = x[i : i + step, None] * d[None, :]
            low[i : i + step] = np.min(self._low_at[None, :] + xs, axis=1)
            high[i : i + step] = np.max(self._high_at[None, :] + xs, axis=1)
        return low, high

    def bound(self, cpu_ns: npt.ArrayLike) -> F64:
        """Largest error of the fitted line at session-clock times ``cpu_ns`` (ns, rounded up)."""
        xq = (np.asarray(cpu_ns, np.float64) - self.fit.cpu_ref_ns) / self.fit.slope
        return np.ceil(self._err(xq) + 0.5)  # + half a ns: the fit's rounding

    def span_bound(self) -> float:
        """The largest bound between the first and the last sample the fit rests on."""
        return float(np.max(self._err(self._knots()))) + 0.5

    def centre_offset(self) -> float:
        """How far to move the line (ns, same slope) so that its largest error is smallest."""
        grid = self._knots()
        low, high = self.limits(grid)
        line = self._line(grid)
        return float(np.max(high - line) - np.max(line - low)) / 2.0

    def _knots(self) -> F64:
        """The first and the last sample's GPU times and the hull points' between them: every edge
        is linear between two of them, so the extremes over the sampled span are among them."""
        lo, hi = self.span
        inside = self.x[(self.x > lo) & (self.x < hi)]
        return distinct(np.concatenate([[lo, hi], inside]))

    def _line(self, grid: F64) -> F64:
        """The fitted line in the band's frame: cpu − frame_cpu − x at GPU times ``grid``."""
        return (self.fit.cpu_ref_ns - self.frame_cpu_ns) + (self.fit.slope - 1.0) * grid

    def _err(self, grid: F64) -> F64:
        low, high = self.limits(grid)
        low, high = np.minimum(low, high), np.maximum(low, high)  # a band thinner than rounding
        line = self._line(grid)
        return np.asarray(np.maximum(line - low, high - line) + 1.0)  # + 1 ns: integer windows


def _bends(g: F64, lower: F64, upper: F64) -> F64:
    """Drifts where ``L`` or ``U`` may bend: slopes between neighbouring hull points."""
    out = []
    for vals in (lower, upper):
        m = np.isfinite(vals)
        order = np.argsort(g[m], kind="stable")
        out.append(_slopes(g[m][order], vals[m][order]))
    return np.concatenate(out)


def _slopes(x: F64, y: F64) -> F64:
    """Slopes between neighbouring points (sorted by ``x``; points at the same ``x`` give none)."""
    dx = np.diff(x)
    ok = dx > 0
    return np.asarray(np.diff(y)[ok] / dx[ok])


def _edge_low(g: F64, lower: F64, d: F64) -> F64:
    """``L(δ) = max_i(lower_i − δ·g_i)`` at each drift of ``d``."""
    m = np.isfinite(lower)
    return np.asarray(np.max(lower[None, m] - d[:, None] * g[None, m], axis=1))


def _edge_high(g: F64, upper: F64, d: F64) -> F64:
    """``U(δ) = min_i(upper_i − δ·g_i)`` at each drift of ``d``."""
    return -_edge_low(-g, -upper, d)


def _crossing(d: F64, gap: F64, k: int, side: int) -> float:
    """Where ``gap`` (linear between neighbouring ``d``) falls to 0 beyond ``d[k]`` on ``side`` (±1),
    or the range's end; rounded outward, never cutting a feasible drift away."""
    j = k + side
    if j < 0 or j >= len(d) or gap[k] == 0:
        return float(d[k])
    t = gap[k] / (gap[k] - gap[j])  # in (0, 1]: gap[j] < 0 <= gap[k]
    at = float(d[k] + t * (d[j] - d[k]))
    at = float(np.nextafter(at, np.inf * side))
    return min(max(at, float(min(d[k], d[j]))), float(max(d[k], d[j])))


def sample_columns(samples: Sequence[CalibrationSample]) -> I64:
    """The samples as an (n, 4) array: CPU before, GPU, CPU after, device (one pass over them)."""
    flat = itertools.chain.from_iterable(map(_SAMPLE_FIELDS, samples))
    return np.fromiter(flat, np.int64, 4 * len(samples)).reshape(len(samples), 4)


_SAMPLE_FIELDS = operator.attrgetter("cpu_before_ns", "gpu_ns", "cpu_after_ns", "device")
_SCAN_FROM = 64  # samples; fewer go straight to the hull's scan


def _upper_hull_in_range(x: F64, y: F64) -> npt.NDArray[np.intp]:
    """Indices of upper-hull points of ``(x, y)``, with every point that maximises ``y − d·x`` for
    some ``|d| <= MAX_DRIFT``. With many samples, by refinement, not a scan: the winners at a few
    drifts make an envelope below the true one; the true winners where it bends are added until
    none is new. Then it equals the true (convex) envelope at its bends and ends, so everywhere."""
    if len(x) < _SCAN_FROM:
        return _upper_hull(x, y)
    won = np.zeros(0, np.intp)
    at = np.array([-MAX_DRIFT, 0.0, MAX_DRIFT])
    while True:
        winners = np.argmax(y[None, :] - at[:, None] * x[None, :], axis=1)
        # a few indices: sets, not np.setdiff1d (its np.unique imports numpy.ma, 12-17 ms)
        had = set(won.tolist())
        new = set(winners.tolist()) - had
        if not new:
            break
        won = np.array(sorted(had | new), np.intp)
        hull = won[_upper_hull(x[won], y[won])]
        bends = _slopes(x[hull], y[hull])
        at = np.concatenate([[-MAX_DRIFT, MAX_DRIFT], bends[np.abs(bends) < MAX_DRIFT]])
    return won[_upper_hull(x[won], y[won])]


def _upper_hull(x: F64, y: F64) -> npt.NDArray[np.intp]:
    """Indices of the points on the upper convex hull of ``(x, y)`` (Andrew's monotone chain)."""
    order = np.lexsort((y, x))
    hull: list[int] = []
    xs, ys = x.tolist(), y.tolist()
    for i in order.tolist():
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            cross = (xs[a] - xs[o]) * (ys[i] - ys[o]) - (ys[a] - ys[o]) * (xs[i] - xs[o])
            if cross >= 0:  # a lies on or below the chord o→i: not on the upper hull
                hull.pop()
            else:
                break
        hull.append(i)
    return np.array(hull, np.intp)
