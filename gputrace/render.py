"""Renderers for a summary (``gputrace.summary.summarize``): table, markdown, CSV and JSON. The JSON
keeps nanoseconds exactly; the others show human units (``human_ns``: ``durations.fmt_ns``):

>>> human_ns(850), human_ns(12_345), human_ns(4_560_000), human_ns(1_230_000_000)
('850 ns', '12.3 µs', '4.56 ms', '1.23 s')
"""

from __future__ import annotations

import csv
import io
from collections.abc import Container
from typing import Any

import orjson

from gputrace.durations import fmt_ns
from gputrace.rankview import lines as rank_lines
from gputrace.safetext import json_safe_text, printable, printable_cut
from gputrace.summary import field

FORMATS = ("table", "json", "csv", "markdown")
human_ns = fmt_ns  # the one duration format, under the name the renderers use


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×" if x < 10 else f"{x:.0f}×"


COLUMNS = (
    "name", "stream", "calls", "cold", "CPU enq med", "GPU med", "GPU p95", "GPU min", "GPU max",
    "GPU total", "busy med", "busy total", "self", "share", "queued med", "queued p95", "GPU/CPU",
    "spread", "outl", "notes",
)  # fmt: skip
TEXT_COLUMNS = (0, 1, len(COLUMNS) - 1)  # left-aligned; the rest are numbers
# A name in a table (summarize's, diff's) is shortened (the JSON keeps it whole): a row padded to a
# name of megabytes (a hand-made or foreign file) is unreadable, and held it in memory once per row.
TABLE_NAME_CHARS = 40


def distinct_names(names: list[str], width: int) -> list[str]:
    """``names`` cut to ``width`` characters in the middle (the tail that tells two kernels of
    one family apart is kept), numbered where two different names still read alike.

    >>> distinct_names(["sgemm_128x64_nn", "sgemm_128x64_nt", "ok"], 11)
    ['sgemm…64_nn', 'sgemm…64_nt', 'ok']
    >>> distinct_names(["aaaa_x_zz", "aaaa_y_zz"], 5)
    ['aa…zz #1', 'aa…zz #2']
    """
    head = width // 2
    tail = width - 1 - head
    out = [n if len(n) <= width else n[:head] + "…" + (n[-tail:] if tail else "") for n in names]
    seen: dict[str, list[str]] = {}
    for n, cut in zip(names, out, strict=True):
        if n not in seen.setdefault(cut, []):
            seen[cut].append(n)
    return [cut if len(seen[cut]) == 1 else f"{cut} #{seen[cut].index(n) + 1}"
            for n, cut in zip(names, out, strict=True)]  # fmt: skip


def _stream(r: dict[str, Any]) -> str:
    """A row's stream as the text shows it: ``device:queue``, or CPU for a scope with no GPU time."""
    if r["queue"] is None:
        return "CPU"
    return f"{r['device']}:{r['queue']}" if r["device"] is not None else str(r["queue"])


def _cells(r: dict[str, Any]) -> list[str]:
    def ns(path: str) -> str:
        return human_ns(field(r, path))

    cold = r["cold"]
    cold_s = "—" if cold is None else human_ns(cold["gpu_ns"] if cold["gpu_ns"] is not None
                                               else cold["cpu_ns"])  # fmt: skip
    notes = [note for key, note in (("launch_bound", "launch-bound"), ("noisy", "noisy")) if r[key]]
    notes += [f"{r[key]} {what}" for key, what in (("empty", "empty"), ("untimed", "untimed"),
                                                   ("errors", "raised")) if r[key]]  # fmt: skip
    return [
        r["name"], _stream(r), str(r["calls"]), cold_s, ns("cpu_ns.median"), ns("gpu_ns.median"),
        ns("gpu_ns.p95"), ns("gpu_ns.min"), ns("gpu_ns.max"), ns("gpu_ns.total"), ns("gpu_busy_ns.median"),
        ns("gpu_busy_ns.total"), ns("self_ns.gpu_total" if r["queue"] is not None else "self_ns.cpu_total"),
        _pct(r["gpu_share"]), ns("queue_gap_ns.median"), ns("queue_gap_ns.p95"), _ratio(r["gpu_over_cpu"]),
        _pct(r["spread"]), str(r["outliers"]), ", ".join(notes),
    ]  # fmt: skip


def _sections(summary: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The sections after the table as (title, lines)."""
    out: list[tuple[str, list[str]]] = []
    idle = []
    for q in summary["idle"]:
        share = q["idle_ns"] / q["window_ns"] if q["window_ns"] else 0.0
        line = (f"GPU {q['device']} {q['queue']}: idle {human_ns(q['idle_ns'])} of "
                f"{human_ns(q['window_ns'])} ({_pct(share)})")  # fmt: skip
        if q["idle_ns"]:
            parts = [f"waiting for the host to submit {human_ns(q['waiting_for_host_ns'])}",
                     f"between queued work {human_ns(q['between_queued_work_ns'])}"]  # fmt: skip
            if q["unknown_ns"]:
                parts.append(f"cause unknown {human_ns(q['unknown_ns'])}")
            line += ": " + ", ".join(parts)
        idle.append(line)
    out.append(("GPU idle time per stream", idle or ["no GPU work in this trace."]))
    est = [f"{r['name']} ({_stream(r)}): measured span median {human_ns(e['span_median_ns'])}, "
           f"estimate {human_ns(e['median_ns'])} ({e['assumes']})"
           for r in summary["rows"] if (e := r.get("if_launches_free"))]  # fmt: skip
    if est:  # per row whose GPU waited on the host: the measured span beside the estimate
        out.append(("What it would take if launches were free (an estimate)", est))
    if ops := _op_lines(summary):
        out.append(
            ("GPU operations per scope (busy: time its operations ran; span: first start to last end)", ops)
        )
    an = []
    for a in summary["anomalies"]:
        where = f"{a['kind']} · {a['name']} · {a['count']} call{'s' if a['count'] != 1 else ''}"
        an.append(f"{where}: {a['meaning']}; {a['what_to_do']}.")
        for ex in a["examples"]:
            unc = ex["uncertainty_ns"]  # 0 or unknown: no alignment to be unsure of
            an.append(f"    scope {ex['scope']} at {human_ns(ex['cpu_start_ns'])}: GPU "
                      f"{human_ns(ex['gpu_ns'])}, CPU {human_ns(ex['cpu_ns'])}, gap "
                      f"{human_ns(ex['queue_gap_ns'])}" + (f" ±{human_ns(unc)}" if unc else ""))  # fmt: skip
        if "numbers" in a:
            n = a["numbers"]
            an.append(f"    GPU median {human_ns(n['gpu_median_ns'])}, CPU enqueue median "
                      f"{human_ns(n['cpu_median_ns'])}, spread {_pct(n['spread'])}")  # fmt: skip
    out.append(("Anomalies", an or ["none found."]))
    clock = summary["clock"]
    cl = []
    for f in clock["devices"]:
        cl.append(f"GPU {f.get('device')}: offset {human_ns(f.get('offset_ns'))}, drift "
                  f"{f.get('drift_ppm', 0.0):.2f} ppm, residual {human_ns(f.get('residual_ns'))}, "
                  f"uncertainty ±{human_ns(f.get('uncertainty_ns'))} from {f.get('samples')} "
                  "samples")  # fmt: skip
        if f.get("note"):  # a weak fit (one sample, or a corner of the session) says why
            cl.append(f"GPU {f.get('device')}: WARNING: {f['note']}.")
    cl.append(clock["note"])
    out.append(("Clock alignment", cl))
    if summary.get("ranks"):
        out.append(("Ranks", rank_lines(summary["ranks"])))
    h = summary["host"]
    hl = [f"{h['name'] or 'unknown host'}, {h['cpu_count'] or '?'} CPUs, load average "
          f"{_loads(h['loadavg_start'])} at start, {_loads(h['loadavg_end'])} at end"]  # fmt: skip
    if h["note"]:
        hl.append(("WARNING: " if h["high"] else "") + h["note"])
    out.append(("Host load", hl))
    return out


def _op_lines(summary: dict[str, Any]) -> list[str]:
    """Per row with per-operation records: busy vs span, then one line per operation name."""
    out = []
    every = [o["name"] for r in summary["rows"] for o in r.get("ops", ())]
    short = dict(zip(every, distinct_names(every, 80), strict=True))
    for r in summary["rows"]:
        if "ops" not in r:
            continue
        span, busy = field(r, "gpu_ns.median"), field(r, "gpu_busy_ns.median")
        share = f" ({_pct(busy / span)})" if span and busy is not None else ""
        cold_gap = field(r, "cold.queue_gap_ns")
        cold_q = f"; cold call queued {human_ns(cold_gap)}" if cold_gap is not None else ""
        out.append(f"{r['name']} ({_stream(r)}): busy median {human_ns(busy)} of span median "
                   f"{human_ns(span)}{share}{cold_q}")  # fmt: skip
        for o in r["ops"]:
            lag = field(o, "launch_to_start_ns.median")
            out.append(f"    {o['kind']} {short[o['name']]}: {o['calls']} calls, GPU median "
                       f"{human_ns(o['gpu_ns']['median'])}, total {human_ns(o['gpu_ns']['total'])}, "
                       f"launch → start median {human_ns(lag)}")  # fmt: skip
    return out


def _loads(la: Any) -> str:
    if not isinstance(la, list):
        return "—"
    return " ".join(f"{x:.2f}" if isinstance(x, (int, float)) else "?" for x in la)


def _intro(summary: dict[str, Any]) -> list[str]:
    what = f"{summary['scopes']} scopes"
    if summary["session_ns"] is not None:
        what += f" over {human_ns(summary['session_ns'])}"
    if summary["backend"]:
        what += f", backend {summary['backend']}"
    lines = [f"{summary['file'] or 'trace'}: {what}."]
    if summary["note"]:
        lines.append(summary["note"])
    if timing := summary.get("timing"):
        t = ", ".join(f"GPU {d['device']} {d['timing']}" for d in timing)
        dropped = summary.get("cupti_dropped_records")
        if dropped is not None:
            t += f"; CUPTI dropped {dropped} record{'s' if dropped != 1 else ''}"
        lines.append(f"Timing source: {t}.")
    lines.append("Times: median/p95/min/max over warm calls (the first, cold, call shown apart);"
                 " totals over all calls.")  # fmt: skip
    return lines


def aligned(rows: list[list[str]], left: Container[int]) -> list[str]:
    """A plain-text table: the first row is the head, underlined; columns in ``left`` are
    left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for k, r in enumerate(rows):
        cells = [
            c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def _md(text: str) -> str:
    return text.replace("|", "\\|")  # a cell or list item in markdown: ``|`` would end a cell


def markdown_table(head: list[str], body: list[list[str]], left: Container[int]) -> list[str]:
    """A GitHub-flavoured markdown table; ``|`` in a cell is escaped."""
    lines = ["| " + " | ".join(head) + " |"]
    lines.append("|" + "|".join("---" if i in left else "--:" for i in range(len(head))) + "|")
    lines += ["| " + " | ".join(map(_md, r)) + " |" for r in body]
    return lines


def to_table(summary: dict[str, Any]) -> str:
    """Aligned plain-text table plus sections, for a terminal."""
    rows = [list(COLUMNS)] + [[printable(c) for c in _cells(r)] for r in summary["rows"]]
    for r, cut in zip(rows[1:], distinct_names([r[0] for r in rows[1:]], TABLE_NAME_CHARS), strict=True):
        r[0] = cut
    lines = [*_intro(summary), "", *aligned(rows, TEXT_COLUMNS)]
    if not summary["rows"]:
        lines.append("(no scopes match)")
    for title, body in _sections(summary):
        lines += ["", title, *(f"  {b}" for b in body)]
    return "\n".join(map(printable, lines)) + "\n"  # a trace's text never reaches the terminal raw


def to_markdown(summary: dict[str, Any]) -> str:
    """A GitHub-flavoured markdown table plus sections."""
    table = [_cells(r) for r in summary["rows"]]
    for cells in table:
        cells[0] = printable_cut(cells[0])  # a name of megabytes (a hand-made file) is cut
    lines = [*_intro(summary), "", *markdown_table(list(COLUMNS), table, TEXT_COLUMNS)]
    for title, body in _sections(summary):
        lines += ["", f"### {title}", ""]
        lines += [("  - " if b.startswith("    ") else "- ") + _md(b.strip()) for b in body]
    return "\n".join(map(printable, lines)) + "\n"


# CSV column -> its field in a summary row (``cold.cpu_ns``: ``row["cold"]["cpu_ns"]``)
CSV_FIELDS = {
    "name": "name", "device": "device", "device_name": "device_name", "queue": "queue", "calls": "calls",
    "warm_calls": "warm_calls", "timed_calls": "timed_calls", "empty": "empty", "untimed": "untimed",
    "errors": "errors", "cold_cpu_ns": "cold.cpu_ns", "cold_gpu_ns": "cold.gpu_ns",
    "cpu_median_ns": "cpu_ns.median", "cpu_p95_ns": "cpu_ns.p95", "cpu_total_ns": "cpu_ns.total",
    "gpu_median_ns": "gpu_ns.median", "gpu_p95_ns": "gpu_ns.p95", "gpu_min_ns": "gpu_ns.min",
    "gpu_max_ns": "gpu_ns.max", "gpu_total_ns": "gpu_ns.total", "gpu_share": "gpu_share",
    "gap_median_ns": "queue_gap_ns.median", "gap_p95_ns": "queue_gap_ns.p95", "gpu_over_cpu": "gpu_over_cpu",
    "spread": "spread", "noisy": "noisy", "outliers": "outliers", "launch_bound": "launch_bound",
    "busy_median_ns": "gpu_busy_ns.median", "busy_total_ns": "gpu_busy_ns.total",
    "self_cpu_total_ns": "self_ns.cpu_total", "self_gpu_total_ns": "self_ns.gpu_total",
    "if_launches_free_median_ns": "if_launches_free.median_ns",
}  # fmt: skip


def to_csv(summary: dict[str, Any]) -> str:
    """One line per row of the table, in nanoseconds; empty cells where there is no value."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_FIELDS)
    for r in summary["rows"]:
        vals = [field(r, path) for path in CSV_FIELDS.values()]
        w.writerow(["" if v is None else printable(v) if isinstance(v, str) else v for v in vals])
    return buf.getvalue()


def to_json(summary: dict[str, Any]) -> str:
    """The summary dict as indented JSON with sorted keys (stable across runs)."""
    text = orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    return json_safe_text(text) + "\n"


def render(summary: dict[str, Any], fmt: str) -> str:
    return {"table": to_table, "json": to_json, "csv": to_csv, "markdown": to_markdown}[fmt](summary)
