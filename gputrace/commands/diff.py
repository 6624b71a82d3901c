"""``gputrace diff A B``: per scope name, did B get slower or faster than A, beyond the noise?"""

from __future__ import annotations

import sys

import click

from gputrace.commands._common import format_option, load_any, malformed
from gputrace.compare import diff as diff_traces
from gputrace.compare import to_table
from gputrace.render import to_json
from gputrace.safetext import path_text

EXIT_REGRESSION = 1


@click.command("diff")
@click.argument("a", type=str)
@click.argument("b", type=str)
@format_option("-f", choices=("table", "json", "markdown"))
@click.option(
    "--fail-above",
    type=click.FloatRange(min=0),
    default=None,
    metavar="PCT",
    help="Exit with code 1 if a name got slower by more than PCT % beyond the noise.",
)
def diff(a: str, b: str, fmt: str, fail_above: float | None) -> None:
    """Compare the median GPU time per scope name between two traces.

    Exit code 0: no regression; 1: a name got slower than --fail-above; 2: a bad input file.
    """
    ta, tb = load_any(a), load_any(b)
    with malformed(f"{a} or {b}: cannot be compared, a trace looks malformed"):
        result = diff_traces(ta, tb, fail_above_pct=fail_above, a_name=path_text(a), b_name=path_text(b))
        text = to_json(result) if fmt == "json" else to_table(result, markdown=fmt == "markdown")
    click.echo(text, nl=False)
    if result["regressions"]:
        sys.exit(EXIT_REGRESSION)
