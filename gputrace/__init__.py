"""gputrace: a lightweight tracing profiler for GPU work driven from Python.

Wrap regions in ``trace``; run them inside a ``session``; open the written file in Perfetto
(https://ui.perfetto.dev) or summarise it with ``gputrace summarize``.

>>> import gputrace
>>> with gputrace.session(backend="cpu") as s:
...     for _ in range(3):
...         with gputrace.trace("step"):
...             pass
>>> len(s.trace.find("step"))
3

``import gputrace`` imports neither cupy nor wgpu: backends load lazily when a session starts.
"""

from gputrace._version import __version__
from gputrace.errors import GputraceError, GputraceWarning
from gputrace.exporters import TraceFileError, load
from gputrace.flight import schedule, step
from gputrace.model import Flag, Scope, Trace
from gputrace.recorder import mark, trace
from gputrace.session import session, sync

__all__ = [
    "Flag",
    "GputraceError",
    "GputraceWarning",
    "Scope",
    "Trace",
    "TraceFileError",
    "__version__",
    "load",
    "mark",
    "schedule",
    "session",
    "step",
    "sync",
    "trace",
]
