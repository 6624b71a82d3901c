"""``gputrace merge OUT IN...``: traces of several processes (ranks) on one time line
(``gputrace.merge``); one line per input says how it was placed, and how well."""

from __future__ import annotations

import click

from gputrace.commands._common import load_any, malformed, write_or_fail
from gputrace.merge import check_paths, expand_inputs, placement_lines
from gputrace.merge import merge as merge_traces
from gputrace.progress import Progress
from gputrace.safetext import path_text


@click.command("merge")
@click.argument("out", type=str)
@click.argument("inputs", nargs=-1, required=True, type=str)
def merge(out: str, inputs: tuple[str, ...]) -> None:
    """Merge traces from several processes (ranks) into OUT (gzip if it ends in .gz).

    Ranks that measured their clock offsets through the job's process group are placed on
    rank 0's clock by those measured fits; any other input by its recorded clock pair. Every
    process keeps its own tracks, named by its rank, and one line per input says how it was
    placed and how well.
    """
    inputs = tuple(expand_inputs(inputs))  # 'run.rank*.trace.json' quoted past the shell
    check_paths(out, list(inputs))  # never overwrite an input; each file once
    with Progress("gputrace merge", total=len(inputs) + 2) as bar:
        traces = []
        for p in inputs:
            bar.step(f"reading {path_text(p)}")
            traces.append(load_any(p, foreign=False, progress=False))
        bar.step("merging")
        with malformed(f"cannot merge {', '.join(map(path_text, inputs))}: a trace looks malformed"):
            merged = merge_traces(traces, list(inputs))
        bar.step(f"writing {path_text(out)}")
        write_or_fail(merged, out)
    procs = ", ".join(p["label"] for p in merged.header["processes"])
    click.echo(f"wrote {path_text(out)}: {len(merged)} scopes from {len(inputs)} traces ({procs}).", err=True)
    for line in placement_lines(merged.header):  # how each rank was put on the time line
        click.echo(f"  {line}", err=True)
