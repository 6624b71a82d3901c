"""What is written when a stage after recording fails: the CPU scopes, flagged ``degraded``.

Built without the resolver and the exporters (either may be what failed): every scope keeps its
CPU times, flagged ``degraded`` with the reason in ``args["degraded"]``. Queues a backend could
not list get stand-ins (``complete_queues``), so no later stage meets an unknown queue.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gputrace.errors import report_internal, reported
from gputrace.jsonsafe import safe_header
from gputrace.model import Flag, QueueInfo, ScopeTable, SpanTable, ThreadInfo, Trace, nest
from gputrace.records import OpBatch, RawThread, SpanBatch
from gputrace.resolver import RawRecording, resolve


def resolve_safely(raw: RawRecording) -> Trace:
    """``resolve(raw)``; if it fails, the CPU scopes alone, flagged degraded with the reason."""
    try:
        return resolve(raw)
    except Exception as exc:
        reason = f"resolving GPU times failed ({type(exc).__name__}: {exc})"
        report_internal("resolve", f"{reason}; the trace keeps CPU times only, flagged degraded.")
    return cpu_scopes(dict(raw.header, problems=reported_problems()), raw.threads, reason)


def reported_problems() -> list[Any]:
    """The problems reported so far (``gputrace.errors``), as header data; never raises."""
    return safe_header({"p": reported()}).get("p", [])  # type: ignore[no-any-return]


def cpu_scopes(header: dict[str, Any], threads: list[RawThread], reason: str) -> Trace:
    """The CPU scopes of ``threads`` as a trace (no GPU part); degraded with ``reason`` if given."""
    try:
        names = list(dict.fromkeys(nm for t in threads for nm in t.names))
        ids = {nm: i for i, nm in enumerate(names)}
        times = np.concatenate([t.times[: len(t.names)] for t in threads] or [np.zeros((0, 4), np.int64)])
        thread = np.repeat(np.arange(len(threads)), [len(t.names) for t in threads])
        given = [t.args.get(k) for t in threads for k in range(len(t.names))]
        order = np.lexsort((-times[:, 1], thread, times[:, 0]))  # (start, thread, -end), as ScopeTable says
        s = ScopeTable.empty(len(order))
        if len(order):
            s.cpu_start_ns, s.cpu_end_ns = times[order, 0], times[order, 1]
            s.thread = thread[order].astype(np.int32)
            s.name = np.array([ids[nm] for t in threads for nm in t.names], np.int32)[order]
            s.flags = (times[order, 3] | (int(Flag.DEGRADED) if reason else 0)).astype(np.uint32)
            mark = {"degraded": reason} if reason else {}
            s.args = {
                row: {**(given[k] or {}), **mark} for row, k in enumerate(order.tolist()) if given[k] or mark
            }
            nest(s)
        th = [ThreadInfo(t.tid, t.name) for t in threads]
        return Trace(dict(header), names, th, [], s, SpanTable.empty(0), [], {})
    except Exception:
        return Trace(dict(header), [], [], [], ScopeTable.empty(0), SpanTable.empty(0), [], {})


def without_gpu(trace: Trace, reason: str) -> Trace:
    """``trace`` without its GPU part, every scope flagged degraded with ``reason``."""
    s = trace.scopes
    cpu = ScopeTable.empty(len(s))
    for col in ("name", "thread", "parent", "depth", "cpu_start_ns", "cpu_end_ns"):
        setattr(cpu, col, getattr(s, col).copy())
    cpu.flags = s.flags | np.uint32(int(Flag.DEGRADED))
    cpu.args = {i: dict(s.args.get(i) or {}, degraded=reason) for i in range(len(s))}
    header = dict(trace.header, clock=[])
    return Trace(header, list(trace.names), list(trace.threads), [], cpu, SpanTable.empty(0), [], {})


def complete_queues(
    queues: Any, spans: SpanBatch, backend: str, batches: list[OpBatch] | None = None
) -> list[QueueInfo]:
    """The backend's queues, with a stand-in for every queue a span or operation names that it
    did not list (its ``queues()`` failed or forgot one)."""
    out = [q for q in queues if isinstance(q, QueueInfo)] if isinstance(queues, list) else []
    tops = [int(spans.cols[:, 1].max())] if len(spans) else []
    need = max(tops + [int(b.rows["queue"].max()) for b in batches or [] if len(b)], default=-1) + 1
    for i in range(len(out), need):
        out.append(QueueInfo(0, "unknown device", backend, f"queue {i}"))
    return out


def lost_text(lost: dict[str, Any]) -> str:
    """The header's ``lost`` in words (``summarize`` prints it).

    >>> for part in lost_text({"scopes": 4, "chunks": 1, "degraded_chunks": 2}).split("; "):
    ...     print(part)
    is missing 4 scopes (1 chunk) that gputrace failed to write
    2 chunks were written with CPU times only (flagged degraded).
    >>> lost_text({"scopes": 0, "degraded_chunks": 1})
    'has 1 chunk written with CPU times only (flagged degraded).'
    """

    def count(n: Any, word: str) -> str:
        n = int(n or 0)
        return f"{n} {word}{'' if n == 1 else 's'}"

    parts = []
    if lost.get("scopes"):
        chunks = count(lost.get("chunks"), "chunk")
        parts.append(f"is missing {count(lost['scopes'], 'scope')} ({chunks}) that gputrace failed to write")
    if degraded := int(lost.get("degraded_chunks") or 0):
        verb = ("was " if degraded == 1 else "were ") if parts else ""
        parts.append(f"{count(degraded, 'chunk')} {verb}written with CPU times only (flagged degraded)")
    if not parts:
        return "lost nothing."
    text = "; ".join(parts) + "."
    return text if text.startswith("is") else f"has {text}"
