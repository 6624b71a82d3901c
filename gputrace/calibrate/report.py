"""Render a ``Calibration`` as the text table ``gputrace calibrate`` prints.

>>> fmt_ns(950.0), fmt_ns(6_210.0), fmt_ns(14_400_000.0), fmt_ns(2.5e9)
('950 ns', '6.21 µs', '14.4 ms', '2.50 s')
>>> fmt_count(2_100_000), fmt_count(4096), fmt_count(300)
('2.1M', '4.1k', '300')
"""

from __future__ import annotations

from gputrace.calibrate.result import Calibration, Measurement, Stat
from gputrace.durations import fmt_ns


def fmt_count(n: int) -> str:
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2g}{suffix}" if n / scale < 10 else f"{n / scale:.0f}{suffix}"
    return str(n)


def _cell(s: Stat | None) -> tuple[str, str]:
    if s is None:
        return "", ""
    return fmt_ns(s.median), f"{fmt_ns(s.p5)} … {fmt_ns(s.p95)}"


def _note(m: Measurement) -> str:
    parts = []
    if m.bytes:
        best = m.device or m.wall
        if best is not None and best.median > 0:
            parts.append(f"{m.bytes / best.median:.2f} GB/s")
    if m.note:
        parts.append(m.note)
    return "; ".join(parts)


def render(cal: Calibration) -> str:
    """The whole report: header line, measurements grouped, break-even table, skipped items."""
    host = cal.host
    load = host.get("loadavg")
    lines = [
        f"gputrace calibrate · backend {cal.backend} · {cal.device} · host {host.get('name')} "
        f"({host.get('cpu_count')} CPUs, load {load[0] if load else '?'}) · {cal.created}"
        + (" · quick" if cal.quick else ""),
        "",
    ]
    w_what = max([len(m.what) for m in cal.measurements] + [30])
    head = (
        f"{'measurement':<{w_what}}  {'wall median':>11}  {'wall p5 … p95':<21}  "
        f"{'device median':>13}  {'device p5 … p95':<21}  {'n':>5}  note"
    )
    lines += [head, "-" * len(head)]
    group = None
    for m in cal.measurements:
        if m.group != group:
            group = m.group
            lines.append(f"[{group}]")
        wm, wr = _cell(m.wall)
        dm, dr = _cell(m.device)
        n = max(s.n for s in (m.wall, m.device) if s is not None) if (m.wall or m.device) else 0
        lines.append(
            f"{m.what:<{w_what}}  {wm:>11}  {wr:<21}  {dm:>13}  {dr:<21}  {n:>5}  {_note(m)}".rstrip()
        )
    if cal.breakeven:
        sizes = cal.curves.get("elements", [])
        top = sizes[-1] if sizes else None
        lines += [
            "",
            "break-even: smallest element count (float32) where the GPU finishes first "
            "(numpy on this CPU vs one kernel + wait)",
            f"{'multiply-adds/element':>21}  {'data on the GPU':<44}  with copies in and out",
        ]
        for r in cal.breakeven:
            lines.append(
                f"{r.ops_per_element:>21}  {_be_cell(r.resident, r.resident_below_grid, top):<44}  "
                f"{_be_cell(r.with_copies, r.with_copies_below_grid, top)}"
            )
    if cal.summary:
        facts = ", ".join(f"{k}={v:g}" for k, v in cal.summary.items())
        lines += ["", f"summary (recorded into later traces): {facts}"]
    if cal.skipped:
        lines += ["", "not measured:"] + [f"  {k}: {why}" for k, why in cal.skipped.items()]
    return "\n".join(lines)


def _be_cell(n: int | None, below: bool, top: int | None) -> str:
    if n is None:
        return f"> {fmt_count(top)} (CPU faster on the whole grid)" if top else "CPU always faster"
    if below:
        return f"≤ {fmt_count(n)} (GPU faster from the smallest size)"
    return f"≈ {fmt_count(n)}"
