"""A tighter, still rigorous alignment bound: the set of linear clocks that fit every window.

Each calibration sample says the GPU timestamp ``g_i`` was taken while the CPU clock ran from
``before_i`` to ``after_i``. If the GPU clock maps linearly onto the CPU clock, the true mapping
``cpu = cpu_ref + x + a + δ·x`` (``x = g − gpu_ref``) satisfies, for every sample,

    before_i ≤ cpu_ref + x_i + a + δ·x_i ≤ after_i.

Those 2n half-planes cut out a convex polygon of possible ``(a, δ)``. At any GPU time ``x`` the
truth lies between the smallest and the largest ``a + δ·x`` over the polygon, so the error of the
fitted line there is at most the larger of its distances to those two. Many staggered windows pin
the clock down far better than any one window's half-width; a single sample gives back its
half-width. If no linear clock fits every window, the polygon is empty: the windows or the linear
model are wrong, and the resolver keeps its residual-based bound alone.

The drift is searched within ±``MAX_DRIFT`` (1000 ppm, twenty times more than any clock measured
for this project), so even a single sample gives a finite bound away from it.

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

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from gputrace.backends.base import CalibrationSample
from gputrace.model import ClockFit

F64 = npt.NDArray[np.float64]

MAX_DRIFT = 1e-3
GRID_POINTS = 65
_ITERATIONS = 90  # golden-section steps: 2e-3 wide search down to ~1e-21


def _golden_max(f: Callable[[F64], F64], lo: F64, hi: F64) -> F64:
    """Max of concave functions (one per row of ``lo``/``hi``) by golden-section search."""
    r = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = lo.copy(), hi.copy()
    c, d = b - r * (b - a), a + r * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(_ITERATIONS):
        left = fc >= fd
        b = np.where(left, d, b)
        a = np.where(left, a, c)
        c_new, d_new = b - r * (b - a), a + r * (b - a)
        # reuse the surviving point's value, evaluate the new one
        fc_keep, fd_keep = fc, fd
        c, d = np.where(left, c_new, d), np.where(left, c, d_new)
        fc = np.where(left, f(c), fd_keep)
        fd = np.where(left, fc_keep, f(d))
    return np.maximum(np.maximum(fc, fd), np.maximum(f(lo), f(hi)))


class FeasibleBand:
    """The polygon of linear clocks consistent with every calibration window."""

    def __init__(self, fit: ClockFit, x: F64, lower: F64, upper: F64, d_lo: float, d_hi: float) -> None:
        self.fit = fit  # the line whose error is bounded; its cpu_ref may move (see centre_offset)
        self.frame_cpu_ns = fit.cpu_ref_ns  # lower/upper are relative to this
        self.x, self.lower, self.upper = x, lower, upper
        self.d_lo, self.d_hi = d_lo, d_hi
        self._limits: dict[bytes, tuple[F64, F64]] = {}  # the grid searches, which dominate resolve

    @classmethod
    def build(cls, samples: Sequence[CalibrationSample], fit: ClockFit) -> FeasibleBand | None:
        """The band, or None when no linear clock fits every window."""
        if not samples:
            return None
        g = np.array([s.gpu_ns - fit.gpu_ref_ns for s in samples], np.float64)
        lower = np.array([s.cpu_before_ns - fit.cpu_ref_ns for s in samples], np.float64) - g
        upper = np.array([s.cpu_after_ns - fit.cpu_ref_ns for s in samples], np.float64) - g
        # Only hull points can bind: max_i(lower_i − d·g_i) is decided by the upper hull of the
        # points (g_i, lower_i), min_i(upper_i − d·g_i) by the lower hull of (g_i, upper_i).
        lo_keep, up_keep = _upper_hull(g, lower), _upper_hull(g, -upper)
        g_lo, lower = g[lo_keep], lower[lo_keep]
        g_up, upper = g[up_keep], upper[up_keep]
        g = np.concatenate([g_lo, g_up])
        lower = np.concatenate([lower, np.full(len(g_up), -np.inf)])
        upper = np.concatenate([np.full(len(g_lo), np.inf), upper])

        def gap(d: F64) -> F64:
            dx = d[:, None] * g[None, :]
            return np.asarray(np.min(upper - dx, axis=1) - np.max(lower - dx, axis=1))

        lo, hi = np.array([-MAX_DRIFT]), np.array([MAX_DRIFT])
        best = _golden_max(gap, lo, hi)
        if best[0] < -1.0:  # 1 ns: the windows are integers, the fit is rounded
            return None
        # the feasible drifts: where the (concave) gap is >= 0, found by bisection on each side
        d_star = _argmax(gap, -MAX_DRIFT, MAX_DRIFT)
        d_lo = _edge(gap, d_star, -MAX_DRIFT)
        d_hi = _edge(gap, d_star, MAX_DRIFT)
        return cls(fit, g, lower, upper, d_lo, d_hi)

    def limits(self, x: F64) -> tuple[F64, F64]:
        """Smallest and largest ``cpu − cpu_ref − x`` any feasible clock gives at GPU times ``x``."""
        key = x.tobytes()
        got = self._limits.get(key)
        if got is None:
            got = self._limits[key] = self._search(x)
        return got

    def _search(self, x: F64) -> tuple[F64, F64]:
        g, lower, upper = self.x, self.lower, self.upper

        def high(d: F64) -> F64:  # max over a of a + d·x is U(d) + d·x: concave in d
            return np.asarray(np.min(upper[None, :] - d[:, None] * (g[None, :] - x[:, None]), axis=1))

        def neg_low(d: F64) -> F64:  # -(L(d) + d·x): concave in d
            return np.asarray(-np.max(lower[None, :] - d[:, None] * (g[None, :] - x[:, None]), axis=1))

        lo = np.full(len(x), self.d_lo)
        hi = np.full(len(x), self.d_hi)
        return -_golden_max(neg_low, lo, hi), _golden_max(high, lo, hi)

    def bound(self, cpu_ns: npt.ArrayLike) -> F64:
        """Largest error of the fitted line at session-clock times ``cpu_ns`` (ns, rounded up).

        Evaluated on a grid and interpolated: the bound is convex in time, so the interpolation
        never understates it.
        """
        fit = self.fit
        t = np.asarray(cpu_ns, np.float64)
        xq = (t - fit.cpu_ref_ns) / fit.slope
        lo_x = min(float(xq.min()), float(self.x.min())) if len(xq) else float(self.x.min())
        hi_x = max(float(xq.max()), float(self.x.max())) if len(xq) else float(self.x.max())
        grid = np.linspace(lo_x, hi_x, GRID_POINTS) if hi_x > lo_x else np.array([lo_x])
        err = self._err(grid)
        if len(grid) == 1:
            return np.ceil(np.full(len(xq), err[0]) + 0.5)
        return np.ceil(np.interp(xq, grid, err) + 0.5)  # + half a ns: the fit's rounding

    def span_bound(self) -> float:
        """The largest bound between the first and the last sample."""
        grid = np.linspace(float(self.x.min()), float(self.x.max()), GRID_POINTS)
        return float(np.max(self._err(grid))) + 0.5

    def centre_offset(self) -> float:
        """How far to move the line (ns, same slope) so that its largest error is smallest."""
        grid = np.linspace(float(self.x.min()), float(self.x.max()), GRID_POINTS)
        low, high = self.limits(grid)
        line = self._line(grid)
        return float(np.max(high - line) - np.max(line - low)) / 2.0

    def _line(self, grid: F64) -> F64:
        """The fitted line in the band's frame: cpu − frame_cpu − x at GPU times ``grid``."""
        return (self.fit.cpu_ref_ns - self.frame_cpu_ns) + (self.fit.slope - 1.0) * grid

    def _err(self, grid: F64) -> F64:
        low, high = self.limits(grid)
        low, high = np.minimum(low, high), np.maximum(low, high)  # a band thinner than rounding
        line = self._line(grid)
        return np.asarray(np.maximum(line - low, high - line) + 1.0)  # + 1 ns: integer windows


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


def _argmax(f: Callable[[F64], F64], lo: float, hi: float) -> float:
    r = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    for _ in range(_ITERATIONS):
        c, d = b - r * (b - a), a + r * (b - a)
        if f(np.array([c]))[0] >= f(np.array([d]))[0]:
            b = d
        else:
            a = c
    return (a + b) / 2.0


def _edge(f: Callable[[F64], F64], inside: float, outside: float) -> float:
    """Where ``f`` (concave, >= 0 at ``inside``) crosses 0 between ``inside`` and ``outside``."""
    if f(np.array([outside]))[0] >= 0:
        return outside
    a, b = inside, outside
    for _ in range(_ITERATIONS):
        m = (a + b) / 2.0
        if f(np.array([m]))[0] >= 0:
            a = m
        else:
            b = m
    return b  # the outer side: never cut a feasible drift away
