"""``gputrace convert IN OUT``: a trace file written again in the format OUT's name asks for.

    gputrace convert run.json.gz run.pftrace     # for Perfetto's native format
    gputrace convert torch_trace.json run.json.gz # another tool's Chrome trace, as gputrace's file

IN is anything ``summarize`` reads (gputrace's ``.json``/``.json.gz``, other tools' Chrome
traces); OUT is ``.json``, ``.json.gz`` (the canonical file) or ``.pftrace`` (an export).
"""

from __future__ import annotations

import click

from gputrace.commands._common import load_any, write_or_fail
from gputrace.safetext import path_text


@click.command("convert")
@click.argument("src", metavar="IN", type=str)
@click.argument("out", metavar="OUT", type=str)
def convert(src: str, out: str) -> None:
    """Write the trace IN again as OUT (format by OUT's extension: .json, .json.gz, .pftrace)."""
    from gputrace.merge import check_paths

    check_paths(out, [src])  # never overwrite the input
    trace = load_any(src)
    write_or_fail(trace, out)
    click.echo(f"gputrace: wrote {path_text(out)} ({len(trace)} scopes).")
