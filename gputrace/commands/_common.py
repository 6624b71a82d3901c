"""What the analysis commands share: loading a trace with one-sentence errors and exit code 2."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import click

from gputrace.errors import GputraceError
from gputrace.loader import NotAGputraceTrace, load
from gputrace.model import Trace
from gputrace.safetext import printable

EXIT_BAD_INPUT = 2
PROGRESS_MIN_BYTES = 32 << 20  # a progress bar only for loads that take a while


def fail(message: str) -> NoReturn:
    """One sentence on stderr, exit code 2, no traceback (a trace's text shown escaped)."""
    click.echo(f"gputrace: {printable(message)}", err=True)
    sys.exit(EXIT_BAD_INPUT)


@contextmanager
def _progress(path: str) -> Iterator[Callable[[str], None] | None]:
    try:
        big = os.path.getsize(path) >= PROGRESS_MIN_BYTES
    except OSError:
        big = False
    if not (big and sys.stderr.isatty()):
        yield None
        return
    steps = ("read", "parsed", "built")
    with click.progressbar(length=len(steps), label=f"loading {path}", file=sys.stderr) as bar:
        yield lambda stage: bar.update(1)


def load_any(path: str, *, foreign: bool = True) -> Trace:
    """A trace from ``path``; another tool's Chrome trace is read as CPU/GPU slices if ``foreign``.

    Any problem with the file ends the command with one sentence and exit code 2.
    """
    try:
        with _progress(path) as progress:
            return load(path, progress=progress)
    except NotAGputraceTrace as exc:
        if not foreign or exc.document is None:
            fail(str(exc))
        from gputrace.foreign import from_chrome

        try:
            return from_chrome(exc.document, path)
        except GputraceError as inner:
            fail(str(inner))
        except Exception as inner:  # a foreign file can hold anything: never a traceback
            fail(f"{path}: cannot be read as a Chrome trace ({type(inner).__name__}: {inner}).")
    except GputraceError as exc:
        fail(str(exc))
    except MemoryError:
        fail(f"{path}: too large to load into memory.")
    except RecursionError:
        fail(f"{path}: the trace is nested too deeply to read.")
