"""One duration format: gputrace's text output and the viewer print the same text for a duration.

The cases live in tests/data/durations.json; the viewer's side (viewer/format.js ``GT.fmtNs``) is
checked against the same table in tests/cli/test_viewer.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputrace import render
from gputrace.calibrate import report
from gputrace.durations import fmt_ns

CASES = json.loads((Path(__file__).parents[1] / "data" / "durations.json").read_text("utf-8"))["cases"]


@pytest.mark.parametrize(("ns", "text"), CASES)
def test_fmt_ns_matches_the_shared_table(ns: float, text: str) -> None:
    assert fmt_ns(ns) == text


def test_every_python_renderer_uses_the_one_formatter() -> None:
    assert render.human_ns is fmt_ns and report.fmt_ns is fmt_ns
    assert report.fmt_ns(999_999) == "1.00 ms"  # not "1e+03 µs"
    assert fmt_ns(None) == fmt_ns(float("nan")) == fmt_ns(float("inf")) == "—"


def test_three_significant_digits_at_every_unit_boundary() -> None:
    for scale in (1e3, 1e6, 1e9):
        for ns in range(1, 200_000, 7):
            text = fmt_ns(ns * scale / 1e3)
            number, shown = text.split(" ")
            if shown == "ns":
                continue
            assert shown in ("µs", "ms", "s")
            digits = number.replace("-", "").replace(".", "").lstrip("0")
            assert len(digits) == 3 or (shown == "s" and float(number) >= 1000), text
