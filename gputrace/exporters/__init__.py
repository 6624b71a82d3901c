"""The output layer: one module per trace format, each with its writer and its reader.

A format module provides::

    EXTENSIONS: tuple[str, ...]                   # e.g. (".json", ".json.gz")
    def write(trace, path) -> Path                # the whole trace, atomically (temp + rename)
    def read(path, progress=None) -> Trace        # a cut file loads with header["truncated"] = True
    class StreamWriter:                           # what a session appends to as it runs
        def __init__(self, path, header) -> None
        def append(self, chunk: Trace) -> None    # flushed to the OS on return
        def close(self, header) -> None           # final header

The format is chosen by the file name's extension (the longest that matches); JSON is the
default for any other name. Reading also looks at the first bytes, so a file renamed still loads.

>>> import gputrace.exporters as ex
>>> ex.format_for("run.json.gz").__name__, ex.format_for("run.trace").__name__
('gputrace.exporters.json', 'gputrace.exporters.json')
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

from gputrace.model import Trace
from gputrace.outpath import check_output

# extension -> module; modules are imported on first use
FORMATS: dict[str, str] = {
    ".json": "gputrace.exporters.json",
    ".json.gz": "gputrace.exporters.json",
    ".gz": "gputrace.exporters.json",
}
DEFAULT = "gputrace.exporters.json"
# leading bytes -> module, for reading files whatever their name
MAGIC: list[tuple[bytes, str]] = [(b"\x1f\x8b", DEFAULT), (b"{", DEFAULT), (b"[", DEFAULT)]


def register(module: str, extensions: tuple[str, ...], magic: tuple[bytes, ...] = ()) -> None:
    """Make ``module`` the format for ``extensions`` (and for files starting with ``magic``)."""
    for ext in extensions:
        FORMATS[ext.lower()] = module
    MAGIC.extend((m, module) for m in magic)


def _module_name(path: str | os.PathLike[str]) -> str:
    name = Path(path).name.lower()
    best = ""
    for ext in FORMATS:
        if name.endswith(ext) and len(ext) > len(best):
            best = ext
    return FORMATS[best] if best else DEFAULT


def format_for(path: str | os.PathLike[str]) -> ModuleType:
    """The format module that writes ``path`` (by its extension)."""
    return importlib.import_module(_module_name(path))


def _format_of_file(path: str | os.PathLike[str]) -> ModuleType:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return format_for(path)  # a FIFO or device: never opened here; the reader refuses it
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return format_for(path)  # the reader says what is wrong with the file
    for magic, module in MAGIC:
        if head.startswith(magic) or head.lstrip().startswith(magic):
            return importlib.import_module(module)
    return importlib.import_module(_module_name(path))


def write(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` in the format its name asks for (never onto a device, FIFO or folder)."""
    check_output(path)
    written: Path = format_for(path).write(trace, path)
    return written


def read(path: str | os.PathLike[str], progress: Any = None) -> Trace:
    """Read a trace file gputrace wrote, in any registered format."""
    trace: Trace = _format_of_file(path).read(path, progress=progress)
    return trace


def stream_writer(path: str | os.PathLike[str], header: dict[str, Any]) -> Any:
    """A ``StreamWriter`` for ``path`` in the format its name asks for."""
    check_output(path)
    return format_for(path).StreamWriter(path, header)


if importlib.util.find_spec("gputrace.exporters.pftrace") is not None:
    register("gputrace.exporters.pftrace", (".pftrace", ".perfetto-trace"))
