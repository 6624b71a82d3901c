"""Sessions: own one recording, from ``start`` to a resolved ``Trace`` (and a file) at ``stop``.

>>> import gputrace
>>> with gputrace.session(backend="cpu") as s:
...     with gputrace.trace("load"):
...         pass
...     gputrace.mark("checkpoint")
>>> len(s.trace), s.trace.marks[0].name
(1, 'checkpoint')
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gputrace._version import __version__
from gputrace.backends import create, with_timing
from gputrace.backends.base import Backend, Clock
from gputrace.calstore import header_calibration
from gputrace.clock import clock_pair, session_clock
from gputrace.errors import (
    GputraceError,
    GputraceWarning,
    report_internal,
    reported,
    reporting,
    reset_reports,
)
from gputrace.fallback import complete_queues, cpu_scopes, reported_problems, resolve_safely, without_gpu
from gputrace.flight import RingTriggers, RingWriter, Stepper, parse_schedule, parse_steps
from gputrace.gcpause import gc_paused
from gputrace.host import host_facts, launcher_rank, loadavg, rank_file
from gputrace.jsonsafe import safe_header, safe_metadata
from gputrace.model import FORMAT_VERSION, FileTrace, QueueInfo, Trace
from gputrace.outpath import check_output
from gputrace.ranks import RankClock, transport_for
from gputrace.ranks import attach as attach_ranks
from gputrace.recorder import Recorder, active_recorder, drain, scopes_in
from gputrace.records import RawRecording, SpanBatch
from gputrace.safetext import printable
from gputrace.stopcal import stop_samples

# A streamed file's time axis starts this long before the session: GPU times aligned a little
# before the start (clock uncertainty) keep a non-negative ts, which Perfetto requires.
STREAM_BASE_MARGIN_NS = 100_000_000
WRITERS = ("auto", "process", "thread")  # who writes a streamed file (``session(writer=)``)


class session:
    """Record a session and write ``path`` (its format by extension: ``.json``, ``.json.gz`` …).

    With a path the trace is appended as the program runs (``stream=True``): at each ``sync()``
    and at least every ``flush_s`` seconds, so memory stays flat and a killed program leaves a
    file that loads; ``stream=False`` resolves and writes everything at stop.
    ``backend``: "auto" (cuda, then wgpu, then cpu), "cuda", "wgpu", "cpu" or "fake", with
    ``backend_options`` (an unknown key is a ``GputraceError``). ``timing`` picks the cuda
    backend's source: "auto" (CUPTI where it can be used, else CUDA events), "cupti" or "events".
    ``clock`` replaces the session clock (tests). ``nvtx=True``: every scope an NVTX range too.
    ``group``: the job's process group (mpi4py or torch.distributed; ``None`` finds an initialised
    torch.distributed, ``False`` never uses one): the ranks' clock offsets are measured through it
    and the file name gets the rank (``run.rank3.trace.json``); ``group_options`` tune that.
    ``steps="100:110"`` records only steps 100 to 109 of ``gputrace.step()``; ``schedule=``
    (``gputrace.schedule``, as torch.profiler counts) only each cycle's active steps, each window
    marked ("window 0" …). ``ring_s`` keeps only the last seconds (flight recorder).
    ``writer`` writes a streamed file: "process" (a writer process beside the program, off its
    interpreter), "thread" (in the program's process), or "auto" (``GPUTRACE_WRITER`` if set, else
    a process for the cuda backend, whose launches run in the interpreter the writing would hold).
    ``session.trace`` holds the resolved ``Trace`` (read back from a streamed file on first use).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        backend: str | Backend = "auto",
        *,
        clock: Clock | None = None,
        backend_options: dict[str, Any] | None = None,
        timing: str = "auto",
        metadata: dict[str, Any] | None = None,
        quiet: bool = False,
        nvtx: bool = False,
        group: Any = None,
        group_options: dict[str, Any] | None = None,
        stream: bool = True,
        flush_s: float = 1.0,
        ring_s: float | None = None,
        steps: str | tuple[int, int] | None = None,
        schedule: Any = None,
        writer: str = "auto",
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.nvtx = nvtx
        self.backend_spec = backend
        self.clock: Clock = clock or session_clock
        self.backend_options = with_timing(backend, dict(backend_options or {}), timing)
        self.metadata = {} if metadata is None else metadata  # converted at start (safe_metadata)
        self.quiet = quiet
        self._trace: Trace | None = None
        self.written: Path | None = None
        self.ring_s = ring_s
        if ring_s is not None and (self.path is None or not ring_s > 0):
            raise GputraceError(
                "the flight recorder (ring_s) needs a path to write to and a positive ring_s."
            )
        self.stream = (stream or ring_s is not None) and self.path is not None
        self.flush_s = flush_s
        if writer not in WRITERS:
            raise GputraceError(f"writer={writer!r} is not one of {', '.join(WRITERS)}.")
        self.writer = writer
        if steps is not None and schedule is not None:
            raise GputraceError("give steps= or schedule=, not both (steps='a:b' is a one-window schedule).")
        self._steps = parse_steps(steps) if steps is not None else parse_schedule(schedule)
        self._stepper: Stepper | None = None
        self._ring_triggers: RingTriggers | None = None
        self._streamer: Any = None
        self._spawned: Any = None  # a writer process started before the backend (appender.spawn)
        self._finished = False
        self._start_failed = ""  # why ``start`` failed inside gputrace (the session records nothing)
        self._recorder: Recorder | None = None
        self._raw = RawRecording(header={}, threads=[])
        self._lock = threading.Lock()
        # ``gputrace run``'s session: one the program starts itself takes over until it stops
        self.yields_to_inner = False
        self._outer: Recorder | None = None
        self._pid = os.getpid()
        self.group = group if group is None or group is False else transport_for(group)
        self.group_options = group_options
        self._ranks: RankClock | None = None

    # lifecycle -----------------------------------------------------------------------------
    def start(self) -> session:
        """Start recording. A fault inside gputrace undoes what started, is reported, and the
        session records nothing (its file says why); a ``GputraceError`` (the user's to fix) is
        raised after the same undoing."""
        if self._recorder is not None or self._start_failed:
            raise GputraceError("this session was already started; create a new one.")
        if self.path is not None:
            check_output(self.path)  # a device node, FIFO or folder: refused before anything starts
        outer = active_recorder()
        if outer is not None and not getattr(outer, "yields_to_inner", False):
            raise GputraceError("a gputrace session is already active; stop it before starting another.")
        reset_reports()
        try:
            return self._start(outer)
        except BaseException as exc:
            self._undo_start(outer)
            if isinstance(exc, GputraceError) or not isinstance(exc, Exception):
                raise
            self._start_failed = f"starting the session failed ({type(exc).__name__}: {exc})"
            report_internal("start", f"{self._start_failed}; nothing is recorded, your program continues.")
            return self

    def _undo_start(self, outer: Recorder | None) -> None:
        """Take back whatever ``_start`` did before it failed (each step on its own: never raises)."""
        rec, self._recorder = self._recorder, None
        st, self._streamer = self._streamer, None
        steps: list[Callable[[], object]] = [self._discard_spawned]
        if rec is not None:
            steps.append(rec.deactivate)
        if outer is not None:
            steps.append(lambda: outer.activate() if active_recorder() is None else None)
        if st is not None:
            steps += [st.stop_timer, st.abandon]
        if rec is not None:
            steps.append(rec.backend.close)
        steps += [self._stepper.stop] if self._stepper else []
        steps += [self._ring_triggers.remove] if self._ring_triggers else []
        for step in steps:
            with contextlib.suppress(Exception):
                step()
        self._outer = self._stepper = None

    def _start(self, outer: Recorder | None) -> session:
        self._pid = os.getpid()
        if self.path is not None and self.stream and self.ring_s is None and self._offload():
            # the writer process starts while the backend does (CUPTI's start: 18-28 ms on the H200)
            with reporting("writer-process", "starting the trace's writer process"):
                from gputrace.appender import SpawnFailed, spawn

                with contextlib.suppress(SpawnFailed):  # (said when the stream opens without it)
                    self._spawned = spawn()
        ranges = None
        if self.nvtx:  # missing NVTX: one sentence, nothing started
            from gputrace.nvtx import load as nvtx_ranges

            ranges = nvtx_ranges()
        if isinstance(self.backend_spec, Backend):
            backend = self.backend_spec
        else:
            try:
                backend = create(self.backend_spec, self.clock, quiet=self.quiet, **self.backend_options)
            except GputraceError:
                raise  # the user's to fix: a wrong option, a GPU that is not there
            except Exception as exc:  # a fault inside gputrace or a driver: record CPU times
                why = f"{type(exc).__name__}: {exc}"
                report_internal("backend", f"the {self.backend_spec} backend failed to start ({why}); "
                                "recording CPU times only.")  # fmt: skip
                backend = create("cpu", self.clock, quiet=True)
        mono, real = clock_pair()
        base = self.clock()
        calibration = header_calibration(backend.name)
        self._raw.header = {
            "format_version": FORMAT_VERSION,
            "version": __version__,
            "backend": backend.name,
            "start_ns": base,
            "base_ns": base,
            "clock_pair": {"monotonic_ns": mono, "realtime_ns": real},
            "pid": os.getpid(),
            "rank": launcher_rank(),
            "argv": list(sys.argv),
            "host": host_facts(),
            "metadata": safe_metadata(self.metadata),
            **({"calibration": calibration} if calibration is not None else {}),
        }
        self._raw.spans_cover_children = backend.spans_cover_children
        self._raw.empty_span_ns = int(getattr(backend, "empty_span_ns", 0))
        self._raw.source_error_ns = int(getattr(backend, "source_error_ns", 0))
        self._recorder = Recorder(self.clock, backend)
        backend.recorder = self._recorder
        self._recorder.owner = self
        self._recorder.nvtx = ranges
        self._calibrate()
        self._recorder.yields_to_inner = self.yields_to_inner  # type: ignore[attr-defined]
        if outer is not None:
            outer.deactivate()
            self._outer = outer
        self._exchange_clocks("start")
        if self.path is not None:  # each rank writes its own file
            measured = self._ranks.rank if self._ranks is not None else None
            self.path = rank_file(self.path, measured, launched=self.group is not False)
        if self._steps is None:
            self._recorder.activate()
        if self.stream:
            self._start_stream()
        self._discard_spawned()  # (not used: the stream opened without it)
        if self._steps is not None:
            self._stepper = Stepper(self._steps, self._recorder, self.clock).start()
        return self

    def scopes_recorded(self) -> int:
        """Scopes in the trace once stopped (counted as written when streamed: no read-back)."""
        if self._trace is not None and not (isinstance(self._trace, FileTrace) and self._trace.unread):
            return len(self._trace)
        st = self._streamer
        if st is None:
            return 0
        # a flight recorder's file holds only the scopes of its last ring_s seconds
        return int(getattr(st.writer, "rows_in_file", getattr(st.writer, "rows", 0)))

    @property
    def backend_name(self) -> str:
        return str(self._raw.header.get("backend", ""))

    @property
    def backend_info(self) -> dict[str, Any]:
        """The backend's facts for the header (once stopped)."""
        info = self._raw.header.get("backend_info")
        return info if isinstance(info, dict) else {}

    @property
    def steps_seen(self) -> tuple[int, int] | None:
        """With a step window or schedule: (steps the program counted, the first recorded one)."""
        st = self._stepper
        return (st.n, st.first_recorded) if st is not None else None

    @property
    def trace(self) -> Trace | None:
        """The resolved trace once stopped; a streamed one read back from its file on first use
        (``model.FileTrace``), or its header only where that fails (said once)."""
        if self._trace is None and self._streamer is not None and self.written is not None:
            self._trace = FileTrace(read=self._read_back)
        return self._trace

    def _read_back(self) -> Trace:
        from gputrace.exporters import canonical, load

        assert self.written is not None
        try:
            return load(canonical(self.written))
        except (GputraceError, OSError) as exc:  # the file is written: only the read failed
            with contextlib.suppress(Exception):  # (its own warning, always)
                warnings.warn(f"gputrace: the trace is written, but reading it back failed: "
                              f"{printable(str(exc))} session.trace holds its header only.",
                              GputraceWarning, stacklevel=4)  # fmt: skip
            return self._header_only()

    def _result(self) -> Trace:
        trace = self.trace
        if trace is None:  # a streamed file that could not be finished (reported once)
            self._trace = trace = self._header_only()
        return trace

    def _header_only(self) -> Trace:
        return resolve_safely(RawRecording(header=self._raw.header, threads=[]))

    # streaming (gputrace.streaming) ---------------------------------------------------------
    def _start_stream(self) -> None:
        from gputrace.streaming import Streamer

        assert self._recorder is not None and self.path is not None
        header = dict(self._raw.header, base_ns=max(0, self._raw.header["start_ns"] - STREAM_BASE_MARGIN_NS))
        # which source times the GPU, on every chunk's GPU slices (its other facts come at stop)
        timing = (_safe(self._recorder.backend.info) or {}).get("timing")
        if isinstance(timing, str):
            header["backend_info"] = {"timing": timing}
        self._raw.header = header
        streamer = None
        try:
            ring = RingWriter(self.path, int(self.ring_s * 1e9), self.clock) if self.ring_s else None
            offload = self._offload()
            streamer = Streamer(self.path, header, self._recorder, self._raw, ring, offload, self._spawned)
            if getattr(streamer.out, "proc", None) is self._spawned:
                self._spawned = None  # the writer process's now; else ``_start`` ends it
            self._streamer = streamer  # (set only once nothing can fail)
        except Exception as exc:
            self.stream = False  # written at stop instead, where an OSError is reported once
            if streamer is not None:  # built, then a later step failed: not half kept
                streamer.abandon()
            if not isinstance(exc, OSError):
                with contextlib.suppress(OSError):  # an empty file the failed open left: not a trace
                    if os.path.isfile(self.path) and os.path.getsize(self.path) == 0:
                        os.unlink(self.path)
                why = f"{type(exc).__name__}: {exc}"
                report_internal("stream", f"opening the streamed trace failed ({why}); written at stop.")
            return
        if callable(getattr(self._recorder.backend, "collect_background", None)):
            streamer.collect_ops = self._collect_background  # CUPTI: streamed as it arrives
        # chunks are still written at each sync and at stop without it
        with reporting("stream-timer", "starting the trace's writing timer"):
            streamer.start_timer(self.flush_s)
        if self.ring_s is not None:
            self._ring_triggers = RingTriggers(lambda: self._finished or self.stop(), self.dump_ring)

    def _discard_spawned(self) -> None:
        from gputrace.appender import discard

        spawned, self._spawned = self._spawned, None
        with reporting("writer-process", "ending an unused writer process"):  # (never the session's start)
            discard(spawned)

    def _offload(self) -> bool:
        """Whether the streamed file is written by a writer process (``gputrace.appender``)."""
        choice = self.writer
        if choice == "auto":
            choice = os.environ.get("GPUTRACE_WRITER", "").strip().lower() or "auto"
        if os.name != "posix":  # (the pipe's non-blocking writes and select)
            return False
        if choice == "auto":  # a CUDA program launches from the interpreter that would render
            started = self._raw.header.get("backend")
            return self.backend_spec == "cuda" or (self.backend_spec == "auto" and started == "cuda")
        return choice == "process"

    def dump_ring(self) -> Path | None:
        """Write the flight recorder's last ``ring_s`` seconds to ``path`` now (as SIGUSR1 does) and
        record on. Returns the path, or None when not a flight recorder."""
        st = self._streamer
        if st is None or self.ring_s is None or st.detached or st.writer.closed:
            return None
        with reporting("ring", "writing the flight recorder"):
            st.flush()
            self.written = st.writer.dump(self._final_header(self.clock()))
            return self.written
        return None

    def _final_header(self, end_ns: int) -> dict[str, Any]:
        """A streamed file's last header (at stop, and at each ring dump): the clock fit over every
        sample, and the problems reported so far."""
        from gputrace.streaming import final_clock

        raw = self._raw
        header = dict(raw.header, end_ns=end_ns, clock=[])
        with reporting("stream-clock", "fitting the final clock"):
            header["spans_cover_children"] = raw.spans_cover_children or raw.ops_timing
            header["clock"] = final_clock(raw.samples)
        if problems := reported():
            header["problems"] = problems
        return header

    def _stop_stream(self, stop_ns: int) -> None:
        st, rec = self._streamer, self._recorder
        streamed = st.path  # where the file was opened
        assert rec is not None and self.path is not None
        with reporting("stream-timer", "stopping the trace's timer"):
            st.stop_timer()
        # each step on its own: a failing one costs its own scopes (counted), never the file
        if not self._write_chunk(st.take, self._raw.queues, "writing the last recorded scopes"):
            st.lost_scopes += rec.scopes_held(open_too=False)  # never taken: what the buffers hold is lost
        st.final = True
        self._write_chunk(lambda: rec.unclosed(stop_ns), self._raw.queues, "ending the scopes still open")
        early = "what was written so far loads as a trace that ends early"
        try:
            st.close(safe_header(self._final_header(stop_ns)))
            if self.path != streamed:
                check_output(self.path)
                os.replace(streamed, self.path)  # the rank became known after the file was opened
            self.written = self.path
        except OSError as exc:
            report_internal(
                "write", f"could not finish writing the trace to {streamed} ({exc.strerror or exc}); {early}."
            )
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            report_internal("write", f"finishing the streamed trace {streamed} failed ({why}); {early}.")
            self.written = streamed

    def _write_chunk(self, take: Callable[[], Any], queues: list[QueueInfo] | None, doing: str) -> bool:
        """Write what ``take()`` returns as a complete chunk; False when nothing was taken. A fault
        (at the call: ``write`` never raises) is reported once, the chunk's scopes counted lost."""
        st, taken = self._streamer, None
        try:
            taken = take()
            st.write(taken, complete=True, queues=queues)
        except Exception as exc:
            with contextlib.suppress(Exception):
                if n := scopes_in(taken or []):
                    st.lost_scopes += n
                    st.lost_chunks += 1
            report_internal("stream", f"{doing} failed ({type(exc).__name__}: {exc}).")
        return taken is not None

    def sync(self) -> None:
        """Wait for the GPU, take a calibration sample, and collect finished GPU spans."""
        rec = self._recorder
        if rec is None:
            return
        timed_out: GputraceError | None = None
        with reporting("sync", "a gputrace sync"):  # never the program's problem: recording goes on
            timed_out = self._sync(rec)
        if timed_out is not None:
            raise timed_out  # the one documented error: the GPU did not finish in time

    def _sync(self, rec: Recorder) -> GputraceError | None:
        """``sync``'s work; returns the backend's ``GputraceError`` (a GPU wait that timed out)."""
        timed_out = None
        with self._lock:
            taken = None
            if self._streamer is not None:  # a fault leaves the scopes in their buffers for the next chunk
                with reporting("stream", "taking recorded scopes"):
                    taken = self._streamer.take()
            try:
                rec.backend.sync()
            except GputraceError as exc:
                timed_out = exc  # what was taken still goes to the file
            except Exception as exc:
                report_internal("sync", f"syncing the backend failed ({type(exc).__name__}: {exc}).")
            if timed_out is None:
                self._calibrate()
                self._collect()
            if taken is not None:
                self._write_chunk(lambda: taken, self._queues(rec), "writing a trace chunk")
        if timed_out is not None:
            return timed_out
        rec.add_mark("sync", self.clock(), "sync")
        self._exchange_clocks("sync")
        return None

    def stop(self) -> Trace:
        """Stop recording, resolve, write the file if a path was given, and return the trace.
        Never fails over a problem inside gputrace: a stage that raises is reported once, and what
        it lost is flagged ``degraded``."""
        with gc_paused():
            return self._stop()

    def _stop(self) -> Trace:
        rec = self._recorder
        if rec is None and self._start_failed:
            return self._stop_failed_start()
        if rec is None:
            raise GputraceError("this session was never started.")
        if self._trace is not None or self._finished:
            return self._result()
        self._finished = True
        rec.deactivate()
        if self._stepper is not None:
            self._raw.header["schedule"] = self._stepper.stop()
        if self._ring_triggers is not None:
            self._ring_triggers.remove()
        outer, self._outer = self._outer, None
        if os.getpid() != self._pid:
            # a forked child: the parent owns the backend and the file; touch neither
            self._trace = cpu_scopes(self._raw.header, [], "")
            return self._trace
        if outer is not None and active_recorder() is None:
            outer.activate()
        if self._streamer is not None:  # no timer chunk during the final collect (it would wait for it)
            with reporting("stream-timer", "halting the trace's timer"):
                self._streamer.halt_timer()
        with self._lock:
            with reporting("sync", "syncing the backend"):
                rec.backend.sync()
            self._calibrate(final=True)
            self._collect()
        self._exchange_clocks("stop")
        if self._ranks is not None:
            self._raw.header["ranks"] = self._ranks.header()
            if self.path is not None:
                self.path = rank_file(self.path, self._ranks.rank)
        stop_ns, raw = self.clock(), self._raw
        raw.header["host"]["loadavg_end"] = loadavg()
        raw.header.update(
            end_ns=stop_ns, backend_info=_safe(rec.backend.info), devices=_safe(rec.backend.devices) or []
        )
        queues = self._queues(rec)
        if queues is None:  # GPU times on queues no stage could name: left out, and said so
            raw.problem = raw.problem or "listing the GPU queues failed"
            raw.spans, raw.batches = SpanBatch(), []
        raw.queues = queues or []
        with reporting("close", "closing the backend"):
            rec.backend.close()
        lost = getattr(rec.backend, "problem", "")
        if not raw.problem and isinstance(lost, str) and lost:
            raw.problem = lost
        if self._streamer is not None:
            self._stop_stream(stop_ns)
            return self._result()
        lost = {"scopes": rec.scopes_held(), "chunks": 1}  # (unless the drain succeeds)
        raw.threads = []
        with reporting("drain", "reading back the recorded scopes", "; they are lost"):
            raw.threads, lost = drain(rec, stop_ns), {}
        if lost:
            raw.header["lost"] = lost
        if problems := reported():
            raw.header["problems"] = problems
        raw.header = safe_header(raw.header)
        self._trace = trace = resolve_safely(raw)
        if self.path is not None:
            self._write(trace, self.path)
        return trace

    def _stop_failed_start(self) -> Trace:
        """The trace of a session whose start failed inside gputrace: no scopes, and why."""
        if self._trace is None:
            self._finished = True
            # a start that failed before building the header: the fields a reader needs (no scope
            # to place on a time axis), so its file still loads and says why
            first = {"format_version": FORMAT_VERSION, "version": __version__, "start_ns": 0, "base_ns": 0}
            why = reported() or [self._start_failed]
            self._trace = cpu_scopes(safe_header({**first, **self._raw.header, "problems": why}), [], "")
            if self.path is not None:
                self._write(self._trace, self.path)
        return self._trace

    def _write(self, trace: Trace, path: Path) -> None:
        """Write ``trace`` to ``path`` (and, for an export, its canonical file). Where an exporter
        fails: again without the GPU part; then, for an export (``.pftrace``), the CPU scopes in
        its canonical JSON file alone; then that file with the header alone, which counts them as
        lost. All of it through the exporters (nothing else writes trace files); the trace stays
        in ``session.trace`` whatever happens, and the program never dies over a file."""
        from gputrace import exporters

        try:
            exporters.write_session(trace, path)
            self.written = path
            return
        except GputraceError as exc:  # the path became a device node, FIFO or folder: leave it be
            report_internal("write", f"{exc} The trace is still available as session.trace.")
            return
        except OSError as exc:
            report_internal("write", f"could not write the trace to {path} ({exc.strerror or exc}); "
                            "it is still available as session.trace.")  # fmt: skip
            return
        except Exception as exc:
            reason = f"exporting the trace failed ({type(exc).__name__}: {exc})"
            report_internal("export", f"{reason}; its GPU part is left out of {path}.")
        trace.header["problems"] = reported_problems()
        cpu = without_gpu(trace, reason)
        canonical = exporters.canonical(path)
        # again without the GPU part (where exporter faults are most likely); for an export, then its
        # canonical JSON file alone (an export may fail where JSON does not)
        for target in dict.fromkeys((path, canonical)):
            with contextlib.suppress(Exception):
                (exporters.write_session if target == path else exporters.write)(cpu, target)
                self.written = target
                return
        gz = ".gz" if canonical.suffix == ".gz" else ""
        tmp = canonical.with_name(f"{canonical.name}.partial.json{gz}")
        try:  # the writer failing at every call leaves no file; the trace stays here
            with reporting("write", f"writing the trace to {path}", "; session.trace still holds it"):
                header = dict(cpu.header, lost={"scopes": len(cpu), "chunks": 1})
                exporters.stream_writer(tmp, header).close(header)
                tmp.replace(canonical)
                self.written = canonical
                report_internal("write", f"the trace's {len(cpu)} scopes could not be written to {path}; "
                                "the file says so, and session.trace holds them.")  # fmt: skip
        finally:
            tmp.unlink(missing_ok=True)

    def _calibrate(self, final: bool = False) -> None:
        """Take calibration samples; at stop (``final``) until the fit rests on some of them."""
        assert self._recorder is not None
        backend, samples = self._recorder.backend, self._raw.samples
        with self._degrading("calibrate", "taking a clock calibration sample"):
            samples.extend(stop_samples(backend, samples) if final else backend.calibrate())

    @contextlib.contextmanager
    def _degrading(self, kind: str, doing: str) -> Iterator[None]:
        """A stage whose failure costs the trace (some of) its GPU part: reported once, the first
        reason kept as the recording's ``problem``."""
        try:
            yield
        except Exception as exc:
            reason = f"{doing} failed ({type(exc).__name__}: {exc})"
            report_internal(kind, f"{reason}.")
            self._raw.problem = self._raw.problem or reason

    def _collect_background(self) -> tuple[int | None, list[QueueInfo] | None]:
        """The streamer's collect without a sync (CUPTI): the time before which scopes are complete
        (None: unknown) and the queues known now."""
        rec = self._recorder
        assert rec is not None
        with self._lock:
            got, horizon = rec.backend.collect_background()  # type: ignore[attr-defined]
            self._raw.add(got)  # (CUDA events: the spans read without a sync)
            self._calibrate()
            queues = self._queues(rec)
        return horizon, queues

    def _queues(self, rec: Recorder) -> list[QueueInfo] | None:
        """The backend's queues, with stand-ins for those it did not list; None if even that fails
        (reported once): a chunk then keeps the queues known before."""
        raw, listed = self._raw, _safe(rec.backend.queues)
        with reporting("queues", "listing the GPU queues"):
            return complete_queues(listed, raw.spans, rec.backend.name, raw.batches)
        return None

    def _collect(self) -> None:
        rec = self._recorder
        assert rec is not None
        with self._degrading("collect", "collecting GPU timestamps"):
            self._raw.add(rec.backend.collect())

    def _exchange_clocks(self, reason: str) -> None:
        """Exchange clocks with the other ranks through the job's process group (at a ``sync``, when
        rank 0 scheduled one); a group found later (torch.distributed) is attached then."""
        if self._ranks is not None and reason == "sync":
            self._ranks.on_sync()
        elif self._ranks is not None:
            self._ranks.exchange(reason)
        elif self.group is not False and (reason == "start" or self.group is None):
            self._ranks = attach_ranks(self.group, self.clock, self.group_options)
            if self._ranks is not None:
                self._raw.header["rank"] = self._ranks.rank
                self._ranks.exchange(reason)

    # context manager -----------------------------------------------------------------------
    def __enter__(self) -> session:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _safe(fn: Any) -> Any:
    with reporting(f"info:{fn.__name__}", "reading backend facts"):
        return fn()
    return None


def sync() -> None:
    """Sync the active session's GPU work and take a calibration sample (no-op with no session)."""
    owner = getattr(active_recorder(), "owner", None)
    if isinstance(owner, session):
        owner.sync()
