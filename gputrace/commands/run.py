"""``gputrace run``: trace a Python program without editing it.

Options go before the script; everything after it belongs to the program. The program's exit
status is passed through (1 with a traceback when it raises); the trace is written in every case.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from gputrace.backends import TIMINGS
from gputrace.commands._common import backend_option, output_option
from gputrace.safetext import path_text, printable


@click.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
@output_option("Where to write the trace (default: <script>.run.trace.json here; .gz to compress).")
@backend_option("Which GPU backend records the program's scopes.")
@click.option(
    "--trace-module",
    "trace_modules",
    multiple=True,
    metavar="NAME",
    help="Trace every top-level function of module NAME (__main__: the script). Repeatable.",
)
@click.option(
    "--trace-function",
    "trace_functions",
    multiple=True,
    metavar="MODULE:FUNC",
    help="Trace one function (or Class.method) of a module. Repeatable.",
)
@click.option(
    "--nvtx", is_flag=True, help="Also make every scope an NVTX range (Nsight Systems); needs nvtx or CuPy."
)
@click.option(
    "--ring",
    "ring_s",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Flight recorder: keep only the last SECONDS; written at exit and on SIGUSR1.",
)
@click.option("--steps", metavar="START:STOP", help="Record only steps START..STOP-1 (gputrace.step()).")
@click.option(
    "--schedule",
    metavar="wait=W,warmup=U,active=A,repeat=R",
    help="Record only the active steps of each cycle, as torch.profiler's schedule counts them.",
)
@click.option(
    "--timing",
    type=click.Choice(TIMINGS),
    default="auto",
    show_default=True,
    help="How the cuda backend times GPU work: CUPTI (every kernel) or CUDA events (per scope).",
)
@click.option("-q", "--quiet", is_flag=True, help="No notices from gputrace on stderr.")
@click.argument("script", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(output: Path | None, script: Path, args: tuple[str, ...], **options: Any) -> None:
    """Run a Python program as `python SCRIPT ARGS` would, with a gputrace session active."""
    from gputrace.runner import RunOptions, run_script

    output = output or Path(f"{script.stem}.run.trace.json")
    result = run_script(RunOptions(script, list(args), output, **options))
    if result.written is not None:
        click.echo(
            f"gputrace: trace written to {path_text(result.written)} ({result.scopes} scopes, "
            f"backend {printable(str(result.backend))})",
            err=True,
        )
    elif result.session is not None:
        click.echo("gputrace: no trace file was written (see the warning above).", err=True)
    if not options["quiet"]:
        for note in result.notes:
            click.echo(f"gputrace: {printable(note)}", err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if result.signal is not None:  # end the way the signal would have ended the program
        signal.signal(result.signal, signal.SIG_DFL)
        os.kill(os.getpid(), result.signal)
    sys.exit(result.exit_code)
