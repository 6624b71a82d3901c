"""``gputrace calibrate``: measure this machine's launch, copy and timer costs, and save them
(per machine and backend, or to ``GPUTRACE_CALIBRATION``) for later sessions' headers."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click

from gputrace.commands._common import backend_option, fail, format_option, output_option
from gputrace.errors import GputraceError
from gputrace.safetext import path_text, printable_lines

STEP_NAMES = {
    "first_use": "first use in fresh processes",
    "launch": "kernel launches",
    "grid": "grid sizes",
    "graph": "CUDA graph replays",
    "events": "event timer",
    "copies": "copies",
    "breakeven": "break-even on the GPU",
    "submit": "submits and passes",
    "clock": "session clock",
    "scope_cost": "profiler cost per scope",
    "numpy_breakeven": "break-even with numpy",
}


def _auto_backend() -> str:
    from gputrace.calibrate import on_cuda, on_wgpu  # each imports its GPU library only in probe()

    for name, backend in (("cuda", on_cuda), ("wgpu", on_wgpu)):
        with contextlib.suppress(GputraceError):
            backend.probe()
            return name
    return "cpu"


@click.command()
@backend_option("What to measure.")
@click.option("--quick", is_flag=True, help="Fewer repetitions and a smaller grid (seconds).")
@format_option(choices=("table", "json"), help="What to print on stdout.")
@output_option("Also save the results (JSON) to this file.")
@click.option("--no-save", is_flag=True, help="Do not save to this machine's default location.")
def calibrate(backend: str, quick: bool, fmt: str, output: Path | None, no_save: bool) -> None:
    """Measure launch overhead, copy latency, timer resolution and the CPU-vs-GPU break-even."""
    from gputrace.calibrate import measure, steps
    from gputrace.calibrate.report import render
    from gputrace.calstore import default_path, save
    from gputrace.outpath import check_output
    from gputrace.progress import Progress

    # a GputraceError (no such backend here, an output that is not a regular file) ends the
    # command in one sentence (gputrace.cli)
    chosen = _auto_backend() if backend == "auto" else backend
    targets = ([] if output is None else [output]) + ([] if no_save else [default_path(chosen)])
    for path in targets:  # a device node, FIFO or folder: refused before measuring
        check_output(path)
    if backend == "auto":
        click.echo(f"gputrace: calibrating the {chosen} backend.", err=True)
    with Progress(f"gputrace calibrate --backend {chosen}", total=len(steps(chosen))) as bar:
        cal = measure(chosen, quick=quick, progress=lambda key: bar.step(STEP_NAMES.get(key, key)))
    doc = cal.to_json()
    for path in targets:
        try:
            save(doc, path)
        except OSError as exc:
            fail(f"could not save the calibration to {path_text(path)} ({exc.strerror or exc}).")
    if fmt == "json":
        click.echo(json.dumps(doc, indent=1))
    else:
        click.echo(printable_lines(render(cal)))  # device names come from drivers: shown escaped
    for path in targets:
        click.echo(f"gputrace: calibration saved to {path_text(path)}", err=True)
