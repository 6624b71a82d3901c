"""A streamed session's chunks resolved and appended, in the program's process or its writer process.

A ``RawChunk`` holds the complete scopes and the GPU operations, spans and calibration samples
collected since the last chunk. ``Resolving`` resolves each, keeps the operations of scopes still
open for a later chunk, counts the session's anomalies, and hands the result to its ``Appender``.
In a writer process this runs on another core: in the program's interpreter, resolving cost
0.7 µs a tiny CUPTI scope (``benchmarks/probe_loop_stages.py``), and the program waited for it.
A chunk's result depends only on the chunks before it, so the session's own process, given the
chunks a writer process never got, writes what the child would have.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gputrace import exporters
from gputrace.appender import Appender, Losses
from gputrace.errors import report_internal, reporting
from gputrace.fallback import cpu_scopes
from gputrace.flags import flag_counts
from gputrace.model import ANOMALY_FLAGS, Flag, Trace
from gputrace.npstats import distinct
from gputrace.records import OpBatch, RawRecording
from gputrace.resolver import anomaly_report, resolve

MAX_CARRIED_OPS = 1 << 20  # GPU operations whose scope has not ended yet
EXAMPLES = 20  # anomaly examples kept for the final header (counts stay exact)
_COLD = int(Flag.COLD)


@dataclass
class RawChunk:
    """Raw records of one chunk (``raw.header`` empty: ``Resolving`` has the session's).
    ``open_tids``: threads with a scope open when it was cut; ``carry``: operations no scope of it
    holds may belong to a later chunk; ``any_thread``: more pieces of the same take follow, so such
    an operation may belong to any thread's scope."""

    raw: RawRecording
    open_tids: list[int] = field(default_factory=list)
    carry: bool = True
    any_thread: bool = False

    @property
    def scopes(self) -> int:
        return sum(len(t.names) for t in self.raw.threads)


class Resolving(Losses):
    """Resolve chunks in order and append them; never raises into the caller."""

    def __init__(self, appender: Appender, header: dict[str, Any]) -> None:
        self.appender = appender
        # as when the file was opened, here as in a writer process (the session's goes on changing)
        self.header = copy.deepcopy(header)
        self.seen_names: set[str] = set()
        self.counts: Counter[str] = Counter()
        self.examples: list[dict[str, Any]] = []
        self.anomalous = 0
        self.carried: list[OpBatch] = []  # operations waiting for a scope still open
        self.rows = 0  # scopes handed to the appender: the row of the next chunk's first scope
        self.ops: Counter[str] | None = None  # operations written (per-operation timing only)

    def add(self, chunk: RawChunk) -> None:
        try:
            self._add(chunk)
        except Exception as exc:
            self.lose(chunk.scopes, "resolving a trace chunk", exc)

    def _add(self, chunk: RawChunk) -> None:
        raw = chunk.raw
        raw.header = self.header
        raw.batches = batches = self.carried + raw.batches
        self.carried = []
        try:
            out = resolve(raw, report=False)
        except Exception as exc:  # this chunk keeps its CPU times, flagged; the others are whole
            reason = f"resolving GPU times failed ({type(exc).__name__}: {exc})"
            report_internal("stream-resolve", f"{reason}; its scopes keep CPU times only, flagged degraded.")
            out = cpu_scopes(self.header, raw.threads, reason)
            self.degraded_chunks += 1
        if batches and chunk.carry:
            with reporting("stream-ops", "carrying GPU operations"):
                out = self._carry_ops(out, OpBatch.concat(batches), chunk)
        examples = len(self.examples)
        try:
            self._session_flags(out)
        except Exception as exc:  # the counts in the header miss this chunk; the chunk is written
            del self.examples[examples:]
            report_internal("stream-flags", f"counting anomalies failed ({type(exc).__name__}: {exc}).")
        if raw.ops_timing:  # (after carrying: an operation counts with its scope's chunk)
            if self.ops is None:
                self.ops = Counter(count=0, unattributed=0)
            self.ops.update(count=len(out.ops), unattributed=int(np.count_nonzero(out.ops.scope < 0)))
        self.appender.add(out, self.rows)
        self.rows += len(out)

    def _carry_ops(self, out: Trace, ops: OpBatch, chunk: RawChunk) -> Trace:
        """Operations launched inside a scope not ended yet wait for it with the next chunk."""
        o = out.ops
        loose = o.scope < 0
        if not loose.any():
            return out
        rows = ops.rows
        wait = np.isin(rows["correlation"], o.correlation[loose])
        if not chunk.any_thread:
            wait &= np.isin(rows["call_tid"], chunk.open_tids)
        if not wait.any():
            return out
        carried = ops.take(np.flatnonzero(wait)[-MAX_CARRIED_OPS:])
        keep = ~(loose & np.isin(o.correlation, carried.rows["correlation"]))
        self.carried = [carried]
        out.ops = o.take(np.flatnonzero(keep))
        return out

    def _session_flags(self, out: Trace) -> None:
        """ "cold" means first in the session, not first in the chunk; count anomalies."""
        s = out.scopes
        if len(s):
            names = out.names
            seen = np.array([names[i] in self.seen_names for i in range(len(names))], bool)
            again = seen[s.name] & ((s.flags & _COLD) != 0)
            if again.any():
                s.flags = np.where(again, s.flags & ~np.uint32(_COLD), s.flags).astype(np.uint32)
            self.seen_names.update(names[i] for i in distinct(s.name).tolist())
            self.counts.update(flag_counts(s.flags))
            self.anomalous += int(np.count_nonzero(s.flags & int(ANOMALY_FLAGS)))
        if len(self.examples) < EXAMPLES:
            report = anomaly_report(out)
            for item in report["items"][: EXAMPLES - len(self.examples)]:
                self.examples.append(dict(item, scope=self.rows + int(item["scope"])))

    def close(self, header: dict[str, Any]) -> None:
        """The final header with the session's anomalies and what was lost here, to the appender."""
        header = dict(header)
        with contextlib.suppress(Exception):
            header = self.with_lost(header)  # (its degraded_chunks: resolved with CPU times only)
            if self.ops is not None:  # as a trace resolved at once says it (resolver)
                header["ops"] = dict(self.ops)
            header["anomalies"] = {
                "counts": dict(self.counts),
                "items": self.examples,
                "truncated": max(0, self.anomalous - len(self.examples)),
            }
        self.appender.close(header)


def resolving(path: str | os.PathLike[str], header: dict[str, Any]) -> Resolving:
    """Resolve chunks and append them to a new streamed file at ``path``."""
    return Resolving(Appender(exporters.stream_writer(path, header)), header)
