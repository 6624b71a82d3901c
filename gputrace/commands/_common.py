"""What the commands share: loading and writing traces (a bad file ends in one sentence, exit
code 2), and the options more than one command takes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from gputrace.errors import GputraceError
from gputrace.exporters import NotAGputraceTrace, load, write
from gputrace.model import Trace
from gputrace.progress import MIN_BYTES, Progress, content_size, is_terminal
from gputrace.progress import clear as clear_progress
from gputrace.safetext import path_text, printable

EXIT_BAD_INPUT = 2
PROGRESS_MIN_BYTES = MIN_BYTES  # a progress line only for loads that take a while

F = TypeVar("F", bound=Callable[..., Any])


def backend_option(help: str) -> Callable[[F], F]:
    choices = click.Choice(["auto", "cuda", "wgpu", "cpu"])
    return click.option("--backend", type=choices, default="auto", show_default=True, help=help)


def output_option(help: str) -> Callable[[F], F]:
    """``-o``/``--output`` of calibrate and run (a path that is not a regular file is refused by
    ``check_output``, in one sentence)."""
    return click.option("-o", "--output", type=click.Path(path_type=Path), help=help)


def format_option(*flags: str, choices: tuple[str, ...], help: str | None = None) -> Callable[[F], F]:
    """``--format`` (``fmt`` to the command), the first choice by default."""
    fmt = click.Choice(choices)
    return click.option(*flags, "--format", "fmt", type=fmt, default=choices[0], show_default=True, help=help)


def fail(message: str) -> NoReturn:
    """One sentence on stderr, exit code 2, no traceback (a trace's text shown escaped)."""
    clear_progress()
    click.echo(f"gputrace: {printable(message)}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@contextmanager
def _progress(path: str, wanted: bool) -> Iterator[Callable[[str], None] | None]:
    # keyed on the JSON inside: a small .json.gz can hold a trace that takes a while to parse
    if not wanted or not is_terminal(sys.stderr) or content_size(path) < PROGRESS_MIN_BYTES:
        yield None
        return
    with Progress(f"loading {path}", total=3) as bar:
        bar.step("reading")
        yield lambda stage: bar.step({"read": "parsing", "parsed": "building"}.get(stage, "done"))


def load_any(path: str, *, foreign: bool = True, progress: bool = True) -> Trace:
    """A trace from ``path`` (another tool's Chrome trace too if ``foreign``); any problem with the
    file ends the command in one sentence, exit code 2. ``progress``: a line for a large file."""
    try:
        with _progress(path, progress) as stages:
            return load(path, progress=stages)
    except NotAGputraceTrace as exc:
        if not foreign or exc.document is None:
            fail(str(exc))
        from gputrace.exporters.reader import from_chrome

        try:
            return from_chrome(exc.document, path)
        except GputraceError as inner:
            fail(str(inner))
        except Exception as inner:  # a foreign file can hold anything: never a traceback
            fail(f"{path}: cannot be read as a Chrome trace ({type(inner).__name__}: {inner}).")
    except MemoryError:
        fail(f"{path}: too large to load into memory.")
    except RecursionError:
        fail(f"{path}: the trace is nested too deeply to read.")


@contextmanager
def malformed(what: str) -> Iterator[None]:
    """Inside it, an error from what a file holds (a hand-edited file can hold anything) ends the
    command with ``what (Type: error).``"""
    try:
        yield
    except GputraceError:
        raise
    except Exception as exc:
        fail(f"{what} ({type(exc).__name__}: {exc}).")


def write_or_fail(trace: Trace, out: str) -> None:
    """Write ``trace`` to ``out`` (format by extension); a failure ends the command in one sentence."""
    try:
        write(trace, out)
    except OSError as exc:
        fail(f"{path_text(out)}: cannot be written ({exc.strerror or exc}).")
    except Exception as exc:  # the trace cannot be serialised: one sentence, no traceback
        fail(f"{path_text(out)}: cannot be written ({type(exc).__name__}: {exc}).")
