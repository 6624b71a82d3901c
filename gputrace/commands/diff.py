"""``gputrace diff A B``: per scope name, did B get slower or faster than A, beyond the noise?

    gputrace diff before.json after.json
    gputrace diff before.json after.json --fail-above 5     # exit 1 on a >5 % regression (CI)

Exit codes: 0 no regression, 1 a regression above ``--fail-above``, 2 a bad input file.
"""

from __future__ import annotations

import sys

import click
import orjson

from gputrace.commands._common import fail, load_any
from gputrace.compare import diff as diff_traces
from gputrace.compare import to_table
from gputrace.safetext import json_safe_text, path_text

EXIT_REGRESSION = 1


@click.command("diff")
@click.argument("a", type=str)
@click.argument("b", type=str)
@click.option(
    "-f",
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "markdown"]),
    default="table",
    show_default=True,
)
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
    try:
        result = diff_traces(ta, tb, fail_above_pct=fail_above, a_name=path_text(a), b_name=path_text(b))
        if fmt == "json":
            text = orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
            text = json_safe_text(text) + "\n"
        else:
            text = to_table(result, markdown=fmt == "markdown")
    except Exception as exc:  # a hand-edited file can hold anything: one sentence, no traceback
        fail(f"{a} or {b}: cannot be compared, a trace looks malformed ({type(exc).__name__}: {exc}).")
    click.echo(text, nl=False)
    if result["regressions"]:
        sys.exit(EXIT_REGRESSION)
