"""Streaming: a session with a path writes its trace as it runs, in chunks, with bounded memory
(docs/output.md, "Streaming"; what each failure costs: docs/reliability.md).

At each ``sync()`` the session takes every scope recorded so far, before the GPU sync, so their
GPU work is complete once it returns; a timer takes what has no GPU work pending at least every
``interval_s``. A failed chunk costs no other: what is lost is counted in the final header. The
streamer cuts chunks of raw records (``chunks.RawChunk``), resolved and appended here or, with
``offload``, in a writer process (``appender.WriterProcess``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from gputrace.appender import Appender, Losses, SpawnFailed, WriterProcess
from gputrace.backends.base import CalibrationSample
from gputrace.chunks import RawChunk, Resolving, resolving
from gputrace.errors import report_internal, reporting
from gputrace.gcpause import gc_paused
from gputrace.model import QueueInfo
from gputrace.recorder import Recorded, Recorder, scopes_in
from gputrace.records import RawThread, SpanBatch
from gputrace.resolver import RawRecording

CHUNK_FIT_SAMPLES = 64  # a chunk's clock fit uses the latest samples (local, and cheap to fit)
MAX_CARRIED_SPANS = 1 << 20  # GPU spans whose scope has not ended yet
PIECE = 50_000  # scopes resolved and written at a time
BACKLOG_SCOPES = 500_000  # scopes waiting (about 50 MB of buffers) that make recording threads wait
BACKLOG_CHECK_S = 0.1
# CUPTI: collect once this many bytes of records wait (about 14,000 kernels with their launch
# calls); recording threads wait while more operations are not yet written (docs/cupti.md, "Memory")
COLLECT_BYTES = 4 << 20
OPS_BACKLOG = 30_000
OFFLOADED_COLLECT_S = 0.1  # a writer process is sent CUPTI records this often (the stop's share)


_live: weakref.WeakSet[Streamer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for st in list(_live):
        st.detach()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Streamer(Losses):
    """Owns a session's ``StreamWriter`` and what is pending between chunks."""

    def __init__(
        self,
        path: Any,
        header: dict[str, Any],
        recorder: Recorder,
        raw: RawRecording,
        writer: Any = None,
        offload: bool = False,
        spawned: Any = None,
    ) -> None:
        """``writer``: one with a ``StreamWriter``'s methods (the flight recorder's ring), else the
        format's; ``spawned``: a writer process already started for ``offload`` (the caller's to
        end unless it is used)."""
        self.path, self.recorder = path, recorder
        self.raw = raw  # the session's: spans, samples, untimed and degraded arrive here
        self.out: Resolving | WriterProcess
        if writer is not None:
            self.out = Resolving(Appender(writer), header)
        else:
            self.out = self._open(path, header, offload, spawned)
        self.lock = threading.RLock()  # one take or chunk at a time
        self.pending: dict[int, Recorded] = {}  # per track, scopes waiting for their GPU work
        self.last_write = time.monotonic()  # the first timer chunk comes a full interval in
        self.queues: list[QueueInfo] = []
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.final = False  # the last chunk (stop): nothing is carried past it
        self._gate = threading.Event()  # open: recording threads never wait (see _throttle)
        self._gate.set()
        self.throttling = False
        self.throttled = 0  # backlogs that made recording threads wait
        # set by the session (CUPTI): collect without a sync -> (horizon, queues)
        self.collect_ops: Callable[[], tuple[int | None, list[QueueInfo] | None]] | None = None
        self.last_collect = time.monotonic()
        self.last_horizon: int | None = None  # CUPTI: the latest horizon, and whether it moved
        self.horizon_moves = True
        self._held_for_writer = False  # throttling while the writer process is behind
        self.detached = False  # in a forked child (``detach``)
        if isinstance(self.out, WriterProcess):
            self.out.on_wait = self._writer_waits
        _live.add(self)

    @staticmethod
    def _open(path: Any, header: dict[str, Any], offload: bool, spawned: Any) -> Resolving | WriterProcess:
        if offload:
            try:
                return WriterProcess(path, header, spawned)
            except SpawnFailed as exc:
                report_internal("writer-process", f"the trace's writer process could not be started "
                                f"({exc}); the trace is written in the program's process.")  # fmt: skip
        return resolving(path, header)

    @property
    def writer(self) -> Any:
        """What the chunks go to: the format's writer, or the writer process."""
        return self.out.appender.writer if isinstance(self.out, Resolving) else self.out

    def abandon(self) -> None:
        """End the file without a final header (a start undone); never raises."""
        with contextlib.suppress(Exception):
            getattr(self.writer, "abandon", lambda: None)()

    def detach(self) -> None:
        """In a forked child: never write to the parent's file (the child has no timer either)."""
        fd = getattr(self.writer, "_fd", None)
        # only a file still open: a closed writer's descriptor number may belong to something
        # else by now (a subprocess's pipes, in the child between fork and exec)
        if isinstance(fd, int) and not getattr(self.writer, "closed", True):
            with contextlib.suppress(OSError):
                os.close(fd)  # the child's copy of the descriptor; the parent's stays open
        self.detached = True  # (the file is the parent's: nothing is written)
        self.lock = threading.RLock()
        self._gate.set()
        self._timer = None
        self.collect_ops = None

    # -- the timer -----------------------------------------------------------------------------
    def start_timer(self, interval_s: float) -> None:
        def loop() -> None:
            check_s = min(interval_s, BACKLOG_CHECK_S)  # the backlog is looked at more often
            collect_s = (
                min(interval_s, OFFLOADED_COLLECT_S) if isinstance(self.out, WriterProcess) else interval_s
            )
            again = False
            # a fault ends the timer: chunks are still written at syncs and stop
            with reporting("stream-timer", "the trace's writing timer"):
                while not self._stop.wait(0.0 if again else check_s):
                    try:
                        again = self._tick(interval_s, collect_s)
                    except Exception as exc:  # never let the timer die silently, never break the program
                        again = False
                        self._throttle(False)
                        why = f"{type(exc).__name__}: {exc}"
                        report_internal("stream", f"writing a trace chunk failed ({why}).")

        self._timer = threading.Thread(target=loop, name="gputrace-stream", daemon=True)
        self._timer.start()

    def _tick(self, interval_s: float, collect_s: float) -> bool:
        """One round of the timer; True when the next should come at once (threads wait for it)."""
        if self.collect_ops is None and not getattr(self.recorder.backend, "ops_timing", False):
            behind = self.recorder.backlog() >= BACKLOG_SCOPES
            self._throttle(behind)  # recording threads wait while this one catches up
            # (unless a sync wrote a chunk meanwhile: no need to compete for the GIL)
            if behind or time.monotonic() - self.last_write >= interval_s:
                self.flush()
            return behind
        # CUPTI: the kernels that arrived are collected, and the scopes that ended before every
        # launch still waiting for its kernels are written (CUDA events alike, with the spans read
        # so far). Records are collected once a few MB wait, and while the operations collected
        # outrun the writer, recording threads wait at scope exits (``_throttle``).
        waiting = _waiting_bytes(self.recorder.backend)
        if self.collect_ops is None or not (
            self.throttling or time.monotonic() - self.last_collect >= collect_s or waiting >= COLLECT_BYTES
        ):
            return False
        self.last_collect = time.monotonic()
        # throttled while records pile up past two collects' worth or the writer is behind, until
        # both are down to half their bounds; decided before the collect too, so the program waits
        # while a big one runs. Never while the horizon stands still (a launch whose kernels never
        # came): waiting would only slow the program.
        k = 2 if self.throttling else 1
        behind = waiting * k >= 2 * COLLECT_BYTES or (
            self.horizon_moves and self.ops_backlog() * k >= OPS_BACKLOG
        )
        self._throttle(behind)
        horizon, queues = self.collect_ops()
        last = self.last_horizon
        self.horizon_moves = horizon is not None and (last is None or horizon > last)
        if self.horizon_moves:
            self.last_horizon = horizon
        elif self.throttling and waiting * 2 < 2 * COLLECT_BYTES:
            self._throttle(False)
        if not self.throttling and self.horizon_moves and self.ops_backlog() >= OPS_BACKLOG:
            self._throttle(True)
        again = self.throttling
        if horizon is not None:
            self.flush(queues, horizon)
        return again

    def ops_backlog(self) -> int:
        """GPU operations collected and not yet cut into a chunk (not those carried for an open scope)."""
        return sum(len(b) for b in list(self.raw.batches))

    def _throttle(self, on: bool) -> None:
        """Backpressure: without syncs, a loop of empty scopes records faster (1.6 M/s) than this
        thread, sharing its interpreter, writes them (1.4 M/s), and the backlog grew without bound
        (949 MB after 10 M scopes). Scope exits wait (``Recorder.throttle``) while it is on."""
        if on == self.throttling:
            return
        self.throttling = on
        if on:
            self._gate.clear()
            self.throttled += 1
        else:
            self._gate.set()
        with self.lock:  # never while a chunk is being taken
            self.recorder.throttle(self._gate if on else None)

    def _writer_waits(self, on: bool) -> None:
        """The writer process is behind (``on``: a chunk waits for room in its pipe). Once records
        pile up meanwhile (two collects' worth, or ``BACKLOG_SCOPES``), recording threads wait
        until the chunk is in; else the next chunk holds all of it (a 10M-kernel CUPTI run on the
        H200 grew to 2.0 GB, its writer process to 2.8 GB). A short wait leaves the program alone."""
        if on:
            rec = self.recorder
            if not self.throttling and (
                _waiting_bytes(rec.backend) >= 2 * COLLECT_BYTES or rec.backlog() >= BACKLOG_SCOPES
            ):
                self._held_for_writer = True
                self._throttle(True)
        elif self._held_for_writer:
            self._held_for_writer = False
            self._throttle(False)

    def halt_timer(self) -> None:
        """No new timer chunk from now (the stop's final collect would wait for it), and no
        recording thread waits; ``stop_timer`` also waits for one in progress."""
        self._stop.set()
        self._gate.set()

    def stop_timer(self) -> None:
        self.halt_timer()
        t = self._timer
        if t is not None and t is not threading.current_thread():
            t.join()

    # -- chunks --------------------------------------------------------------------------------
    def take(self) -> list[Recorded]:
        """Take every scope and mark recorded so far out of the recorder's buffers."""
        with self.lock:  # two takers at once would both copy a prefix, then both delete one
            return self.recorder.take_recorded()

    def flush(self, queues: list[QueueInfo] | None = None, horizon: int | None = None) -> None:
        """What is complete now (before ``horizon``), taken and written (a timer chunk, a ring's dump)."""
        with self.lock:
            self.write(self.take(), False, queues, horizon)

    def write(
        self,
        taken: list[Recorded],
        complete: bool,
        queues: list[QueueInfo] | None = None,
        horizon: int | None = None,
    ) -> None:
        """Resolve and append ``taken``, at most ``PIECE`` scopes a chunk (bounded memory);
        ``horizon``: only scopes that ended before it are complete (CUPTI without a sync). Never
        raises: what a fault costs is flagged ``degraded`` or counted as lost."""
        timer = threading.current_thread() is self._timer
        with self.lock, gc_paused():
            try:  # pieces of at most ``PIECE`` scopes of one thread each (one if small)
                small = scopes_in(taken) <= PIECE
                pieces = [taken] if small else [[p] for rec in taken for p in rec.pieces(PIECE)]
            except Exception as exc:
                self.lose(scopes_in(taken), "cutting recorded scopes into chunks", exc)
                return
            for i, piece in enumerate(pieces):
                try:  # (operations of later pieces' scopes wait for them)
                    self._write(piece, complete, queues, horizon, more=i + 1 < len(pieces))
                except Exception as exc:
                    self.lose(scopes_in(piece), "writing a trace chunk", exc)
                if timer and not self.throttling and self.recorder.backlog() >= BACKLOG_SCOPES:
                    self._throttle(True)  # the program outgrows this write: it waits now

    def _write(
        self,
        taken: list[Recorded],
        complete: bool,
        queues: list[QueueInfo] | None,
        horizon: int | None,
        more: bool,
    ) -> None:
        if self.detached or self.writer.closed:
            if not self.detached:
                self.lose(scopes_in(taken), "writing to a closed trace", RuntimeError("closed"))
            return
        if queues is not None and len(queues) >= len(self.queues):
            self.queues = list(queues)
        threads: list[RawThread] = []
        for rec in taken:  # scopes whose GPU work may still be running wait
            ready, waiting = rec.settle(self.pending.pop(rec.key, None), horizon, complete)
            if waiting is not None:
                self.pending[rec.key] = waiting
            self._add_thread(threads, ready)
        if complete:  # pending scopes of threads that recorded nothing new since
            for held in self.pending.values():
                self._add_thread(threads, held)
            self.pending.clear()
        raw = self.raw
        if not any(len(t.names) or t.marks for t in threads) and not any(len(b) for b in raw.batches):
            return  # (operations outside every scope are written too: kept, never piled up)
        # what was collected since the last chunk goes with this one (the session's raw starts afresh)
        got = replace(
            raw, header={}, threads=threads, queues=self.queues, samples=raw.samples[-CHUNK_FIT_SAMPLES:]
        )
        raw.spans, raw.batches, raw.blind, raw.untimed, raw.degraded = SpanBatch(), [], [], set(), {}
        spans, untimed, degraded = got.spans, got.untimed, got.degraded
        chunk = RawChunk(
            got,
            # (operations of a scope still open wait for it in ``Resolving``)
            open_tids=self.recorder.open_tids() + [held.tid for held in self.pending.values()],
            carry=not self.final or more,
            any_thread=more,
        )
        # spans whose scope has not ended yet wait for it (and their tokens' facts with them);
        # CUPTI has none (a set of every scope's token cost 1.5 ms a 20k-scope chunk)
        ended = np.concatenate([th.times[:, 2] for th in threads]) if threads else np.zeros(0, np.int64)
        left = np.flatnonzero(np.isin(spans.cols[:, 0], ended, invert=True))
        tokens = set(ended[ended > 0].tolist()) if untimed or degraded else set()
        if len(left) > MAX_CARRIED_SPANS:
            report_internal(
                "stream-spans",
                f"{len(left) - MAX_CARRIED_SPANS} GPU spans whose scope never ended were dropped.",
            )
            left = left[-MAX_CARRIED_SPANS:]
        raw.spans = SpanBatch.concat([spans.take(left), raw.spans])
        raw.untimed |= {t for t in untimed if t not in tokens}
        raw.degraded.update({t: v for t, v in degraded.items() if t not in tokens})
        self.out.add(chunk)
        self.last_write = time.monotonic()

    def _add_thread(self, threads: list[RawThread], rec: Recorded) -> None:
        try:
            threads.append(rec.raw())
        except Exception as exc:
            self.lose(rec.scopes(), "reading back recorded scopes", exc)

    def close(self, final_header: dict[str, Any]) -> None:
        """The final header, with what was lost here, to the resolving side."""
        header = self.with_lost(final_header)
        with self.lock:
            try:
                self.out.close(header)
            finally:
                _live.discard(self)


def _waiting_bytes(backend: Any) -> int:
    """Bytes of activity records the backend's source holds, not yet collected (0: unknown)."""
    with contextlib.suppress(Exception):
        return int(backend.waiting_bytes())
    return 0


def final_clock(samples: list[CalibrationSample]) -> list[dict[str, Any]]:
    """The clock fit over every sample of the session, per device (the final header's)."""
    from gputrace.resolver import clock_fits

    fits = clock_fits(samples)
    return [dict(device=d, **fits[d].to_dict()) for d in sorted(fits)]
