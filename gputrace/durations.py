"""The one duration format of gputrace's text output (summaries, diffs, calibration reports).

Three significant digits in the largest unit that keeps the number at least 1, rounded half away
from zero on the exact value of the float (as JavaScript's ``toFixed`` does, so the viewer's
``GT.fmtNs`` in ``viewer/format.js`` prints the same text for the same number):

>>> fmt_ns(850), fmt_ns(12_345), fmt_ns(4_560_000), fmt_ns(1_230_000_000)
('850 ns', '12.3 µs', '4.56 ms', '1.23 s')
>>> fmt_ns(999_999), fmt_ns(999.4), fmt_ns(2.5), fmt_ns(None)
('1.00 ms', '999 ns', '2.5 ns', '—')

Below 1 µs, ns with trailing zeros dropped. Both implementations are tested on
``tests/data/durations.json``.
"""

from __future__ import annotations

import math
from decimal import ROUND_HALF_UP, Context, Decimal

NONE = "—"
_UNITS = (("µs", 1e3), ("ms", 1e6), ("s", 1e9))
_EXACT = Context(prec=1100)  # enough digits for any float, so rounding sees its exact value


def _fixed(x: float, decimals: int) -> str:
    """``x`` with ``decimals`` digits after the point, ties away from zero (JS ``toFixed``)."""
    q = Decimal(x).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP, context=_EXACT)
    s = f"{q:f}"
    return s[1:] if s.startswith("-") and Decimal(s) == 0 else s


def fmt_ns(ns: float | None) -> str:
    """A duration in nanoseconds as a person reads it; "—" for none (or not a finite number)."""
    if ns is None or not math.isfinite(ns):
        return NONE
    a = abs(ns)
    if abs(float(_fixed(a, 0))) < 1000:
        s = _fixed(ns, 2 if a < 10 else 1 if a < 100 else 0)
        return (s.rstrip("0").rstrip(".") if "." in s else s) + " ns"
    for unit, scale in _UNITS:
        v = ns / scale
        for decimals in (2, 1, 0):
            s = _fixed(v, decimals)
            if abs(float(s)) < 10 ** (3 - decimals):
                return f"{s} {unit}"
    return f"{_fixed(ns / 1e9, 0)} s"
