"""Perfetto's own importer (trace_processor) on a written trace: import errors and what it built.

``import_report(path)`` loads a ``.json``, ``.json.gz`` or ``.pftrace`` file in trace_processor and
returns the import-error stats and the counts a reader of the trace cares about: slices per
process and thread, flows bound at both ends, async slices (slices on process-scoped tracks, per
process), counter samples per counter track, instants.

trace_processor is a native binary that Perfetto does not publish on PyPI, npm or Debian (the
``perfetto`` Python package fetches it from Google's servers on first use, which a machine that
only reaches package registries cannot do). So it runs where one is installed: the binary named by
``GPUTRACE_TRACE_PROCESSOR``, or ``trace_processor_shell`` / ``trace_processor`` on the PATH.
Elsewhere ``skip_reason()`` says why, and the tests that need it skip with that sentence.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

ENV = "GPUTRACE_TRACE_PROCESSOR"


def binary() -> str | None:
    """The trace_processor binary to use, or None."""
    path = os.environ.get(ENV)
    if path:
        return path if os.access(path, os.X_OK) else None
    for name in ("trace_processor_shell", "trace_processor"):
        found = shutil.which(name)
        if found:
            return found
    return None


def skip_reason() -> str | None:
    """None when the importer can run here; otherwise one sentence saying why not."""
    try:
        import perfetto.trace_processor  # noqa: F401
    except ImportError:
        return "the perfetto Python package is not installed (pip install perfetto)"
    if binary() is None:
        return (
            "no trace_processor binary here (Perfetto publishes it on no package registry): "
            f"set {ENV} to one, or put trace_processor_shell on the PATH"
        )
    return None


# Perfetto stats whose severity means something was dropped or misread.
_ERRORS = """
SELECT name, idx, severity, source, value FROM stats
WHERE value > 0 AND severity IN ('error', 'data_loss')"""
_THREAD_SLICES = """
SELECT p.pid AS pid, t.tid AS tid, COUNT(*) AS n
FROM slice s JOIN thread_track tt ON s.track_id = tt.id
JOIN thread t USING (utid) LEFT JOIN process p USING (upid)
GROUP BY p.pid, t.tid"""
_PROCESS_SLICES = """
SELECT p.pid AS pid, pt.name AS track, COUNT(*) AS n
FROM slice s JOIN process_track pt ON s.track_id = pt.id
JOIN process p USING (upid)
GROUP BY p.pid, pt.name"""
_FLOWS = """
SELECT COUNT(*) AS n FROM flow f
JOIN slice a ON f.slice_out = a.id JOIN slice b ON f.slice_in = b.id"""
_COUNTERS = """
SELECT ct.name AS track, COUNT(*) AS n
FROM counter c JOIN counter_track ct ON c.track_id = ct.id GROUP BY ct.name"""
_TOTALS = "SELECT COUNT(*) AS n, SUM(dur = 0) AS zero FROM slice"


def import_report(path: str | os.PathLike[str], timeout_s: int = 120) -> dict[str, Any]:
    """Load ``path`` in trace_processor and report what it imported (see the module doc)."""
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    reason = skip_reason()
    if reason:
        raise RuntimeError(reason)
    config = TraceProcessorConfig(bin_path=binary(), load_timeout=timeout_s)
    tp = TraceProcessor(trace=str(Path(path)), config=config)
    try:
        errors = [
            {"name": r.name, "idx": r.idx, "severity": r.severity, "source": r.source, "value": r.value}
            for r in tp.query(_ERRORS)
        ]
        thread_slices = {(r.pid, r.tid): r.n for r in tp.query(_THREAD_SLICES)}
        process_slices = {(r.pid, r.track): r.n for r in tp.query(_PROCESS_SLICES)}
        flows = next(iter(tp.query(_FLOWS))).n
        counters = {r.track: r.n for r in tp.query(_COUNTERS)}
        totals = next(iter(tp.query(_TOTALS)))
    finally:
        tp.close()
    per_process: dict[int, int] = {}
    for (pid, _tid), n in thread_slices.items():
        per_process[pid] = per_process.get(pid, 0) + n
    return {
        "errors": errors,
        "slices": int(totals.n or 0),
        "zero_length_slices": int(totals.zero or 0),
        "thread_slices": thread_slices,  # (pid, tid) -> slices on that thread's track
        "slices_per_process": per_process,  # pid -> slices on its threads' tracks
        "async_slices": process_slices,  # (pid, track name) -> slices on process-scoped tracks
        "async_total": sum(process_slices.values()),
        "flows": int(flows or 0),  # flows with both ends bound to a slice
        "counters": counters,  # counter track name -> samples
    }
