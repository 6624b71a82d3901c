"""``gputrace convert IN OUT``: a trace file (or another tool's Chrome trace) written again in the
format OUT's name asks for."""

from __future__ import annotations

import click

from gputrace.commands._common import fail, load_any, write_or_fail
from gputrace.safetext import path_text


@click.command("convert")
@click.argument("src", metavar="IN", type=str)
@click.argument("out", metavar="OUT", type=str)
def convert(src: str, out: str) -> None:
    """Write the trace IN again as OUT (format by OUT's extension: .json, .json.gz, .pftrace)."""
    from gputrace.exporters.opener import SUFFIXES
    from gputrace.merge import check_paths

    if not out.lower().endswith(SUFFIXES):  # (the name is all that picks the format)
        fail(f"{path_text(out)}: name the output .json, .json.gz or .pftrace; the name picks the format.")
    check_paths(out, [src])  # never overwrite the input
    trace = load_any(src)
    write_or_fail(trace, out)
    click.echo(f"gputrace: wrote {path_text(out)} ({len(trace)} scopes).")
