"""``gputrace summarize TRACE``: the per-scope table and what to look at next.

gputrace summarize trace.json
gputrace summarize trace.json.gz --sort gpu_median --top 10 --name 'matmul*'
gputrace summarize trace.json --format json > summary.json
"""

from __future__ import annotations

import click

from gputrace.commands._common import fail, load_any
from gputrace.render import FORMATS, render
from gputrace.summary import SORT_KEYS
from gputrace.summary import summarize as summarize_trace


@click.command("summarize")
@click.argument("trace", type=str)
@click.option(
    "-f",
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="table",
    show_default=True,
    help="Output format; json keeps exact nanoseconds.",
)
@click.option(
    "--sort",
    type=click.Choice(list(SORT_KEYS)),
    default="gpu_total",
    show_default=True,
    help="Order of the rows (largest first; name: alphabetical).",
)
@click.option("--top", type=click.IntRange(min=1), default=None, help="Keep the first N rows.")
@click.option(
    "--name", "pattern", default=None, help="Keep names matching this glob pattern (or containing it)."
)
def summarize(trace: str, fmt: str, sort: str, top: int | None, pattern: str | None) -> None:
    """Per scope name: calls, cold call, CPU enqueue and GPU time, queue gap, stability;
    then GPU idle time, anomalies, clock uncertainty and host load."""
    t = load_any(trace)
    try:
        summary = summarize_trace(t, sort=sort, top=top, name=pattern, file=trace)
        text = render(summary, fmt)
    except Exception as exc:  # a hand-edited file can hold anything: one sentence, no traceback
        fail(f"{trace}: cannot be summarized, the trace looks malformed ({type(exc).__name__}: {exc}).")
    click.echo(text, nl=False)
    if t.header.get("truncated"):
        click.echo(
            f"gputrace: note: {trace} ends early (its program was killed or is still running); "
            "it holds what was written up to its last flush.",
            err=True,
        )
