"""Median, quantile and distinct values without ``numpy.ma``; quantiles per group (``Grouped``);
interval helpers. ``np.median``/``np.percentile`` import ``numpy.ma`` on first call: 12 ms (73 ms
without bytecode) inside a session's stop; ``np.unique`` without ``return_*`` too (17 ms at a
streamed session's start). These give numpy's results (linear quantiles) from a sort.

>>> median([3.0, 1.0, 2.0]), median([4, 1, 3, 2]), quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.1)
(2.0, 2.5, 1.4)
>>> distinct(np.array([3, 1, 3, 2, 1])).tolist()
[1, 2, 3]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def quantile(a: Any, q: float) -> float:
    """``np.quantile(a, q)`` (method "linear") of a non-empty 1-D array."""
    s = np.sort(np.asarray(a, dtype=np.float64).ravel())
    if not len(s):
        raise ValueError("quantile of an empty array")
    pos = q * (len(s) - 1)
    lo = int(np.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    frac = pos - lo
    return float(s[lo] + (s[hi] - s[lo]) * frac) if frac else float(s[lo])


def distinct(a: Any) -> npt.NDArray[Any]:
    """``np.unique(a)``: the sorted distinct values of an array, flattened."""
    s = np.sort(np.asarray(a).ravel())
    if len(s) < 2:
        return s
    keep = np.empty(len(s), dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def median(a: Any) -> float:
    """``np.median(a)`` of a non-empty 1-D array."""
    s = np.sort(np.asarray(a, dtype=np.float64).ravel())
    n = len(s)
    if not n:
        raise ValueError("median of an empty array")
    m = n // 2
    return float(s[m]) if n % 2 else float((s[m - 1] + s[m]) / 2.0)


def interval_union(
    start: npt.NDArray[np.int64], end: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Merge intervals (non-empty input): block starts, block ends, and the row that opened each.

    >>> b0, b1, first = interval_union(np.array([5, 0, 2]), np.array([6, 3, 4]))
    >>> b0.tolist(), b1.tolist(), first.tolist()
    ([0, 5], [4, 6], [1, 0])
    """
    order = np.lexsort((-end, start))
    st, en = start[order], end[order]
    run_end = np.maximum.accumulate(en)
    opens = np.ones(len(st), bool)
    opens[1:] = st[1:] > run_end[:-1]
    first = np.flatnonzero(opens)
    last = np.concatenate([first[1:] - 1, [len(st) - 1]])
    return st[first], run_end[last], order[first]


def ended_before(en: npt.NDArray[np.int64], firsts: list[int], none: int) -> npt.NDArray[np.int64]:
    """Per interval, the latest end among the earlier intervals of its group (``none`` for a
    group's first); groups are the runs starting at ``firsts``.

    >>> ended_before(np.array([5, 3, 9, 1]), [0, 2], -1).tolist()
    [-1, 5, -1, 9]
    """
    n = len(en)
    out = np.empty(n, np.int64)
    for a, b in zip(firsts, [*firsts[1:], n], strict=True):
        out[a] = none
        out[a + 1 : b] = np.maximum.accumulate(en[a : b - 1])
    return out


class Grouped:
    """Values per group, sorted, for vectorised quantiles per row (``summarize``, ``diff``).

    >>> g = Grouped(np.array([0, 1, 0, 0]), np.array([3, 7, 1, 2]), 3)
    >>> g.q(0.5).tolist(), g.counts.tolist()
    ([2.0, 7.0, nan], [3, 1, 0])
    """

    def __init__(self, group: npt.NDArray[np.int64], values: npt.NDArray[Any], n_groups: int):
        order = np.lexsort((values, group))
        self.values = values[order].astype(np.float64)
        self.counts = np.bincount(group, minlength=n_groups).astype(np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).astype(np.int64)

    def q(self, q: float) -> npt.NDArray[np.float64]:
        """Linear-interpolation quantile (numpy's default) of each group; NaN for an empty one."""
        out = np.full(len(self.counts), np.nan)
        has = self.counts > 0
        pos = (self.counts[has] - 1) * q
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, self.counts[has] - 1)
        a = self.values[self.starts[has] + lo]
        b = self.values[self.starts[has] + hi]
        out[has] = a + (b - a) * (pos - lo)
        return out
