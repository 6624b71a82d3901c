"""Read a trace file written by gputrace back into the same ``Trace`` model.

A thin front over the output layer (``gputrace.exporters``): the format is chosen by the file's
content and name, and each format module holds its own reader.

>>> import gputrace, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.json")
>>> with gputrace.session(path, backend="cpu"):
...     with gputrace.trace("step"):
...         pass
>>> [s.name for s in gputrace.load(path)]
['step']
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gputrace.errors import GputraceError
from gputrace.gcpause import gc_paused
from gputrace.model import Trace


class TraceFileError(GputraceError):
    """A file that cannot be read as a trace; the message names the file and the problem."""


class NotAGputraceTrace(TraceFileError):
    """Valid JSON (maybe a Chrome trace from another tool), but not written by gputrace."""

    def __init__(self, message: str, document: Any = None) -> None:
        super().__init__(message)
        self.document = document


Progress = Callable[[str], None]


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of ``path``; ``TraceFileError`` with one sentence if it cannot be read."""
    from gputrace.readlimits import read_trace_bytes

    try:  # bounded: regular files only, at most GPUTRACE_MAX_TRACE_BYTES
        return read_trace_bytes(path, decompress=False)
    except GputraceError as exc:
        raise TraceFileError(str(exc)) from None


def read_document(path: str | os.PathLike[str], progress: Progress | None = None) -> Any:
    """The parsed JSON of a (possibly gzipped) file; ``TraceFileError`` with one sentence if not.

    A gputrace file cut short (a killed process) comes back repaired, up to its last complete
    chunk. ``progress`` (if given) is called with "read" once the bytes are in and "parsed" after.
    """
    from gputrace.exporters import json as json_format

    with gc_paused():  # a dict per event, none in a cycle (see gc_paused)
        doc, _ = json_format.read_document(path, progress)
    return doc


def load(path: str | os.PathLike[str], *, progress: Progress | None = None) -> Trace:
    """Load a trace written by gputrace (any format of ``gputrace.exporters``).

    Raises ``TraceFileError`` (a ``GputraceError``) with one sentence naming the file and the
    problem for a missing, truncated, non-JSON or non-trace file; ``NotAGputraceTrace`` (a
    ``TraceFileError``) carries the parsed ``document`` of a JSON file gputrace did not write.
    A file cut short by a crash loads up to its last flushed chunk, with
    ``trace.header["truncated"] = True``. ``progress`` is called with "read", "parsed", "built".
    """
    from gputrace.exporters import read

    return read(path, progress=progress)


def from_document(doc: Any, where: str = "<trace>") -> Trace:
    """A ``Trace`` from a parsed gputrace JSON document."""
    from gputrace.exporters import json as json_format

    return json_format.from_document(doc, where)
