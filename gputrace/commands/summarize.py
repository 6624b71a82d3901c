"""``gputrace summarize TRACE``: the per-scope table and what to look at next."""

from __future__ import annotations

import click

from gputrace.commands._common import format_option, load_any, malformed
from gputrace.fallback import lost_text
from gputrace.render import FORMATS, render
from gputrace.safetext import path_text
from gputrace.summary import SORT_ALIASES, SORT_KEYS
from gputrace.summary import summarize as summarize_trace


@click.command("summarize")
@click.argument("trace", type=str)
@format_option("-f", choices=FORMATS, help="Output format; json keeps exact nanoseconds.")
@click.option(
    "--sort",
    type=click.Choice([*SORT_KEYS, *SORT_ALIASES]),
    default=None,
    help="Order of the rows (largest first; name: alphabetical; self: exclusive GPU busy, or "
    "exclusive CPU time without GPU times). Default: busy_total, or cpu_total when the trace has "
    "no GPU times, or self_cpu_total for another tool's trace (as torch's key_averages).",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=None,
    help="Keep the first N entries of every section (rows, idle streams, anomalies).",
)
@click.option(
    "--group",
    is_flag=True,
    help="Fold trailing numbers in names into one row (ProfilerStep#12 -> ProfilerStep#*).",
)
@click.option(
    "--name", "pattern", default=None, help="Keep names matching this glob pattern (or containing it)."
)
def summarize(
    trace: str, fmt: str, sort: str | None, top: int | None, pattern: str | None, group: bool
) -> None:
    """Per scope name: calls, cold call, CPU enqueue and GPU time, queue gap, stability;
    then GPU idle time, anomalies, clock uncertainty and host load."""
    t = load_any(trace)
    with malformed(f"{trace}: cannot be summarized, the trace looks malformed"):
        summary = summarize_trace(t, sort=sort, top=top, name=pattern, file=path_text(trace), group=group)
        text = render(summary, fmt)
    click.echo(text, nl=False)
    lost = t.header.get("lost")
    if isinstance(lost, dict) and (lost.get("scopes") or lost.get("degraded_chunks")):
        click.echo(f"gputrace: note: {path_text(trace)} {lost_text(lost)}", err=True)
    if t.header.get("truncated"):
        click.echo(
            f"gputrace: note: {path_text(trace)} ends early (its program was killed or is still running); "
            "it holds what was written up to its last flush.",
            err=True,
        )
