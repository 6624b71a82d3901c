"""The output layer: every reader and writer of trace files, and ``load``. A format module,
chosen by the file name's extension (JSON for any name but an export's), provides ``write`` and
``StreamWriter``; only JSON is read back (docs/output.md, "The output layer").

>>> import gputrace, tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "t.json")
>>> with gputrace.session(path, backend="cpu"):
...     with gputrace.trace("step"):
...         pass
>>> [s.name for s in gputrace.load(path)]
['step']

>>> import gputrace.exporters as ex
>>> ex.format_for("run.json.gz").__name__, ex.format_for("run.trace").__name__
('gputrace.exporters.json', 'gputrace.exporters.json')
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from gputrace.exporters.opener import EXPORTS, NotAGputraceTrace, Progress, TraceFileError, canonical
from gputrace.model import Trace
from gputrace.outpath import check_output

__all__ = ["NotAGputraceTrace", "TraceFileError", "canonical", "format_for", "load", "stream_writer", "write"]


def format_for(path: str | os.PathLike[str]) -> ModuleType:
    """The format module that writes ``path`` (by its extension)."""
    export = Path(path).name.lower().endswith(EXPORTS)
    return importlib.import_module("gputrace.exporters." + ("pftrace" if export else "json"))


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` in the format its name asks for (never onto a device, FIFO or folder)."""
    check_output(path)
    return Path(format_for(path).write(trace, path))


def load(path: str | os.PathLike[str], *, progress: Progress | None = None) -> Trace:
    """Load a trace written by gputrace; a file cut short by a crash loads up to its last chunk,
    with ``header["truncated"] = True``. Raises ``TraceFileError`` (one sentence naming the file
    and the problem); ``NotAGputraceTrace``, one of those, carries the parsed ``document`` of a
    JSON file gputrace did not write. ``progress`` is told "read", "parsed", "built"."""
    from gputrace.exporters import json as json_format
    from gputrace.exporters import reader
    from gputrace.figures import with_launch_submissions
    from gputrace.gcpause import gc_paused

    with gc_paused():  # a dict per event, none in a cycle (see gc_paused)
        doc, truncated = json_format.read_document(path, progress)
        trace = reader.from_document(doc, str(path), truncated=truncated)
        del doc  # freed here, while the collector still sleeps
    if progress is not None:
        progress("built")
    return with_launch_submissions(trace)  # older CUPTI files took the scope's entry


def write_session(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """What a session writes at stop: ``path`` and, where it is an export, its canonical file."""
    if canonical(path) != Path(path):
        write(trace, canonical(path))
    return write(trace, path)


def stream_writer(path: str | os.PathLike[str], header: dict[str, Any]) -> Any:
    """A ``StreamWriter`` for ``path`` in the format its name asks for."""
    check_output(path)
    return format_for(path).StreamWriter(path, header)
