"""Compare two traces per scope name: is B slower or faster than A, beyond the noise of both?

Per name, the median GPU time of the warm calls (no cold call, no empty span; the CPU enqueue time
for a name without GPU times) and its noise, the interquartile range. ``slower``/``faster`` when
the medians differ by more than the IQR of *both* runs, else ``within noise``; ``too few calls``
(under ``MIN_CALLS`` warm calls), ``only in A``/``B``, ``not comparable`` (GPU in one run only).

>>> import gputrace
>>> from gputrace.clock import FakeClock
>>> def run(us):
...     clock = FakeClock(0, 1_000)
...     with gputrace.session(backend="fake", clock=clock, quiet=True,
...                           backend_options={"script": lambda n, i: (1_000, us * 1_000)}) as s:
...         for _ in range(6):
...             with gputrace.trace("conv"):
...                 pass
...     return s.trace
>>> row = diff(run(20), run(30))["rows"][0]
>>> row["name"], row["change_pct"], row["verdict"]
('conv', 50.0, 'slower')

JSON (``gputrace diff --format json``), schema ``gputrace-diff/1``: ``{"schema", "a", "b",
"fail_above_pct", "regressions" (names slower by more than fail_above_pct), "rows": [{"name",
"metric" ("gpu" | "cpu"), "calls_a", "calls_b", "median_a_ns", "median_b_ns", "iqr_a_ns",
"iqr_b_ns", "change_ns", "change_pct", "exceeds_noise", "verdict"}]}``; values a run lacks are null.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gputrace.model import NO_TIME, Flag, Trace
from gputrace.npstats import Grouped

SCHEMA = "gputrace-diff/1"
MIN_CALLS = 3


def name_stats(trace: Trace) -> dict[str, dict[str, Any]]:
    """Per name: metric, warm calls, median and IQR of the compared time (ns)."""
    s = trace.scopes
    flags = s.flags.astype(np.int64)
    warm = (flags & int(Flag.COLD)) == 0
    timed = (s.gpu_start_ns != NO_TIME) & ((flags & int(Flag.EMPTY)) == 0)
    g = len(trace.names)
    name = s.name.astype(np.int64)
    gpu = Grouped(name[warm & timed], (s.gpu_end_ns - s.gpu_start_ns)[warm & timed], g)
    cpu = Grouped(name[warm], (s.cpu_end_ns - s.cpu_start_ns)[warm], g)
    any_gpu = np.bincount(name[timed], minlength=g) > 0
    present = np.bincount(name, minlength=g) > 0
    out = {}
    for metric, grouped in (("gpu", gpu), ("cpu", cpu)):
        med, q1, q3 = grouped.q(0.5), grouped.q(0.25), grouped.q(0.75)
        for i in np.flatnonzero(present & (any_gpu if metric == "gpu" else ~any_gpu)).tolist():
            n = int(grouped.counts[i])
            out[trace.names[i]] = {
                "metric": metric,
                "calls": n,
                "median": float(med[i]) if n else None,
                "iqr": float(q3[i] - q1[i]) if n else None,
            }
    return out


def diff(
    a: Trace, b: Trace, *, fail_above_pct: float | None = None, a_name: str = "A", b_name: str = "B"
) -> dict[str, Any]:
    """Per-name comparison of ``a`` and ``b`` (see the module docstring)."""
    sa, sb = name_stats(a), name_stats(b)
    rows = []
    for nm in sorted(set(sa) | set(sb)):
        x, y = sa.get(nm), sb.get(nm)
        row: dict[str, Any] = {"name": nm, "metric": (y or x or {}).get("metric")}
        for key, stat in (("calls_{}", "calls"), ("median_{}_ns", "median"), ("iqr_{}_ns", "iqr")):
            row.update({key.format(side): st[stat] if st else None for side, st in (("a", x), ("b", y))})
        row.update(change_ns=None, change_pct=None, exceeds_noise=None)
        if x is None:
            row["verdict"] = "only in B"
        elif y is None:
            row["verdict"] = "only in A"
        elif x["metric"] != y["metric"]:
            row["verdict"] = "not comparable"  # GPU times in one run, CPU only in the other
        elif x["median"] is None or y["median"] is None:
            row["verdict"] = "too few calls"
        else:
            change = y["median"] - x["median"]
            row["change_ns"] = change
            row["change_pct"] = 100.0 * change / x["median"] if x["median"] else None
            exceeds = abs(change) > max(x["iqr"], y["iqr"])
            row["exceeds_noise"] = bool(exceeds)
            if min(x["calls"], y["calls"]) < MIN_CALLS:
                row["verdict"] = "too few calls"
            elif not exceeds:
                row["verdict"] = "within noise"
            else:
                row["verdict"] = "slower" if change > 0 else "faster"
        rows.append(row)
    regressions = [
        r["name"] for r in rows
        if fail_above_pct is not None and r["verdict"] == "slower"
        and (r["change_pct"] is None or r["change_pct"] > fail_above_pct)
    ]  # fmt: skip
    return {
        "schema": SCHEMA,
        "a": a_name,
        "b": b_name,
        "fail_above_pct": fail_above_pct,
        "regressions": regressions,
        "rows": rows,
    }


def to_table(result: dict[str, Any], *, markdown: bool = False) -> str:
    """The comparison as an aligned table (or markdown), in human units."""
    from gputrace.render import TABLE_NAME_CHARS, aligned, human_ns, markdown_table
    from gputrace.safetext import NAME_CHARS, printable, printable_cut

    head = ["name", "metric", "calls A", "calls B", "median A", "median B", "change", "noise A",
            "noise B", "verdict"]  # fmt: skip
    body = []
    name_chars = NAME_CHARS if markdown else TABLE_NAME_CHARS
    for r in result["rows"]:
        pct = r["change_pct"]
        body.append([
            printable_cut(r["name"], name_chars), r["metric"] or "—", _s(r["calls_a"]), _s(r["calls_b"]),
            human_ns(r["median_a_ns"]), human_ns(r["median_b_ns"]),
            "—" if pct is None else f"{pct:+.1f}%",
            human_ns(r["iqr_a_ns"]), human_ns(r["iqr_b_ns"]), r["verdict"],
        ])  # fmt: skip
        body[-1] = [printable(c) for c in body[-1]]  # names from a trace never reach the terminal raw
    lines = [f"A = {result['a']}", f"B = {result['b']}",
             "noise = interquartile range of the warm calls; a change counts when it exceeds both.",
             ""]  # fmt: skip
    lines += markdown_table(head, body, (0, 1, 9)) if markdown else aligned([head, *body], (0, 1, 9))
    if result["fail_above_pct"] is not None:
        lines.append("")
        if result["regressions"]:
            names = ", ".join([printable_cut(n, name_chars) for n in result["regressions"]])
            lines.append(f"FAIL: slower by more than {result['fail_above_pct']:g}% beyond the noise: {names}")
        else:
            lines.append(f"OK: nothing slower by more than {result['fail_above_pct']:g}% beyond the noise.")
    return "\n".join(map(printable, lines)) + "\n"


def _s(x: int | None) -> str:
    return "—" if x is None else str(x)
