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

import os
import socket
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from gputrace._version import __version__
from gputrace.backends import create
from gputrace.backends.base import Backend, Clock
from gputrace.clock import clock_pair, session_clock
from gputrace.errors import GputraceError, report_internal, reset_reports
from gputrace.model import FORMAT_VERSION, Trace
from gputrace.recorder import Recorder, active_recorder, drain
from gputrace.resolver import RawRecording, resolve

# A streamed file's time axis starts this long before the session: GPU times aligned a little
# before the start (clock uncertainty) keep a non-negative ts, which Perfetto requires.
STREAM_BASE_MARGIN_NS = 100_000_000
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "LOCAL_RANK")


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _rank() -> int | None:
    for var in RANK_VARS:
        v = os.environ.get(var)
        if v is not None and v.strip().isdigit():
            return int(v)
    return None


class session:
    """Record a session and write ``path`` (its format by extension: ``.json``, ``.json.gz`` …).

    With a path the trace is written as the program runs (``stream=True``, the default): at each
    ``sync()`` and at least every ``flush_s`` seconds what is resolved is appended, so memory stays
    flat and a killed program leaves a file that loads (see ``gputrace.streaming``); with
    ``stream=False`` everything is resolved and written at stop.
    ``backend`` is "auto" (cuda, then wgpu, then cpu), "cuda", "wgpu", "cpu" or "fake";
    ``backend_options`` go to the backend. ``clock`` replaces the session clock (tests).
    The resolved ``Trace`` stays available as ``session.trace`` (read back from the file when
    streamed, on first use).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        backend: str | Backend = "auto",
        *,
        clock: Clock | None = None,
        backend_options: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        quiet: bool = False,
        stream: bool = True,
        flush_s: float = 1.0,
        ring_s: float | None = None,
        steps: str | tuple[int, int] | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.backend_spec = backend
        self.clock: Clock = clock or session_clock
        self.backend_options = backend_options or {}
        self.metadata = metadata or {}
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
        self._steps: tuple[int, int] | None = None
        if steps is not None:
            from gputrace.flight import parse_steps

            self._steps = parse_steps(steps)
        self._stepper: Any = None
        self._usr1: Any = None
        self._streamer: Any = None
        self._finished = False
        self._load_at_stop = True  # ``with session(...)`` leaves a streamed trace on disk until used
        self._recorder: Recorder | None = None
        self._raw = RawRecording(header={}, threads=[])
        self._lock = threading.Lock()
        # True for the session ``gputrace run`` wraps around a program: a session the program starts
        # itself then takes over recording until it stops, instead of failing as "already active".
        self.yields_to_inner = False
        self._outer: Recorder | None = None

    # lifecycle -----------------------------------------------------------------------------
    def start(self) -> session:
        if self._recorder is not None:
            raise GputraceError("this session was already started; create a new one.")
        outer = active_recorder()
        if outer is not None and not getattr(outer, "yields_to_inner", False):
            raise GputraceError("a gputrace session is already active; stop it before starting another.")
        reset_reports()
        if isinstance(self.backend_spec, Backend):
            backend = self.backend_spec
        else:
            backend = create(self.backend_spec, self.clock, quiet=self.quiet, **self.backend_options)
        mono, real = clock_pair()
        base = self.clock()
        self._raw.header = {
            "format_version": FORMAT_VERSION,
            "version": __version__,
            "backend": backend.name,
            "start_ns": base,
            "base_ns": base,
            "clock_pair": {"monotonic_ns": mono, "realtime_ns": real},
            "pid": os.getpid(),
            "rank": _rank(),
            "argv": list(sys.argv),
            "host": {
                "name": socket.gethostname(),
                "cpu_count": os.cpu_count(),
                "loadavg_start": _loadavg(),
            },
            "metadata": dict(self.metadata),
        }
        calibration = _calibration(backend.name)
        if calibration is not None:
            self._raw.header["calibration"] = calibration
        self._raw.spans_cover_children = backend.spans_cover_children
        self._raw.empty_span_ns = int(getattr(backend, "empty_span_ns", 0))
        self._recorder = Recorder(self.clock, backend)
        self._recorder.owner = self
        self._calibrate()
        self._recorder.yields_to_inner = self.yields_to_inner  # type: ignore[attr-defined]
        if outer is not None:
            outer.deactivate()
            self._outer = outer
        if self._steps is None:
            self._recorder.activate()
        if self.stream:
            self._start_stream()
        if self._steps is not None:
            self._start_steps()
        return self

    @property
    def trace(self) -> Trace | None:
        """The resolved trace once stopped (a streamed one is read back from its file)."""
        if self._trace is None and self._streamer is not None and self.written is not None:
            from gputrace.exporters import read

            self._trace = read(self.written)
        return self._trace

    @trace.setter
    def trace(self, value: Trace | None) -> None:
        self._trace = value

    def _result(self) -> Trace:
        trace = self.trace
        if trace is None:  # a streamed file that could not be finished (reported once)
            self._trace = trace = resolve(RawRecording(header=self._raw.header, threads=[]))
        return trace

    # streaming (gputrace.streaming) ---------------------------------------------------------
    def _start_stream(self) -> None:
        from gputrace.streaming import Streamer

        assert self._recorder is not None and self.path is not None
        header = dict(self._raw.header)
        header["base_ns"] = max(0, header["start_ns"] - STREAM_BASE_MARGIN_NS)
        self._raw.header = header
        try:
            writer = None
            if self.ring_s is not None:
                from gputrace.flight import RingWriter

                writer = RingWriter(self.path, header, int(self.ring_s * 1e9), self.clock)
            self._streamer = Streamer(self.path, header, self._recorder, self._raw, writer)
        except OSError:
            self.stream = False  # fall back to writing at stop, where the error is reported once
            return
        self._streamer.start_timer(self.flush_s)
        if self.ring_s is not None:
            self._install_ring_triggers()

    # flight recorder and step windows (gputrace.flight) ---------------------------------------
    def _install_ring_triggers(self) -> None:
        import atexit
        import signal

        atexit.register(self._ring_at_exit)
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1"):

            def on_usr1(signum: int, frame: Any) -> None:  # write from a thread: never block here
                threading.Thread(target=self.dump_ring, name="gputrace-ring", daemon=True).start()

            self._usr1 = signal.signal(signal.SIGUSR1, on_usr1)

    def _remove_ring_triggers(self) -> None:
        import atexit
        import signal

        atexit.unregister(self._ring_at_exit)
        if self._usr1 is not None:
            signal.signal(signal.SIGUSR1, self._usr1)
            self._usr1 = None

    def _ring_at_exit(self) -> None:
        if not self._finished:
            self._load_at_stop = False  # the interpreter is ending: write, do not read back
            self.stop()

    def dump_ring(self) -> Path | None:
        """Write the flight recorder's last ``ring_s`` seconds to ``path`` now (SIGUSR1 does this);
        the session keeps recording. Returns the path, or None when not a flight recorder."""
        from gputrace.streaming import final_clock

        st = self._streamer
        if st is None or self.ring_s is None or st.writer.closed:
            return None
        try:
            st.flush(complete=False)
            header = dict(self._raw.header)
            header["end_ns"] = self.clock()
            header["clock"] = final_clock(self._raw.samples)
            header["spans_cover_children"] = self._raw.spans_cover_children
            path: Path = st.writer.dump(header)
            self.written = path
            return path
        except Exception as exc:
            report_internal("ring", f"writing the flight recorder failed ({type(exc).__name__}: {exc}).")
            return None

    def _start_steps(self) -> None:
        from gputrace.flight import Stepper, set_stepper

        rec = self._recorder
        assert rec is not None and self._steps is not None

        def activate() -> None:
            if active_recorder() is None:
                rec.activate()

        def mark(n: int) -> None:
            rec.buffer().marks.append((f"step {n}", self.clock(), "mark", {"step": n}))

        self._stepper = Stepper(self._steps, activate, rec.deactivate, mark)
        set_stepper(self._stepper)
        self._stepper.begin()

    def _stop_stream(self, stop_ns: int) -> None:
        from gputrace.streaming import final_clock, unclosed

        st = self._streamer
        rec = self._recorder
        assert rec is not None
        st.stop_timer()
        try:
            st.write(st.take(), complete=True, queues=self._raw.queues)
            st.write(unclosed(rec, stop_ns), complete=True, queues=self._raw.queues)
            header = dict(self._raw.header)
            header["clock"] = final_clock(self._raw.samples)
            header["spans_cover_children"] = self._raw.spans_cover_children
            st.close(header)
            self.written = self.path
        except OSError as exc:
            report_internal(
                "write",
                f"could not finish writing the trace to {self.path} ({exc.strerror or exc}); "
                "what was written so far loads as a trace that ends early.",
            )

    def _stream_sync(self, taken: Any) -> None:
        rec = self._recorder
        assert rec is not None
        try:
            self._streamer.write(taken, complete=True, queues=_safe(rec.backend.queues) or [])
        except Exception as exc:
            report_internal("stream", f"writing a trace chunk failed ({type(exc).__name__}: {exc}).")

    def sync(self) -> None:
        """Wait for the GPU, take a calibration sample, and collect finished GPU spans."""
        rec = self._recorder
        if rec is None:
            return
        with self._lock:
            taken = self._streamer.take() if self._streamer is not None else None
            try:
                rec.backend.sync()
            except GputraceError:
                raise
            except Exception as exc:
                report_internal("sync", f"syncing the backend failed ({type(exc).__name__}: {exc}).")
            self._calibrate()
            self._collect()
            if taken is not None:
                self._stream_sync(taken)
        rec.buffer().marks.append(("sync", self.clock(), "sync", {}))

    def stop(self) -> Trace:
        """Stop recording, resolve, write the file if a path was given, and return the trace."""
        rec = self._recorder
        if rec is None:
            raise GputraceError("this session was never started.")
        if self._trace is not None or self._finished:
            return self._result()
        self._finished = True
        rec.deactivate()
        if self._stepper is not None:
            from gputrace.flight import set_stepper

            set_stepper(None)
        if self.ring_s is not None:
            self._remove_ring_triggers()
        outer, self._outer = self._outer, None
        if outer is not None and active_recorder() is None:
            outer.activate()
        with self._lock:
            try:
                rec.backend.sync()
            except Exception as exc:
                report_internal("sync", f"syncing the backend failed ({type(exc).__name__}: {exc}).")
            self._calibrate()
            self._collect()
        stop_ns = self.clock()
        raw = self._raw
        raw.header["end_ns"] = stop_ns
        raw.header["host"]["loadavg_end"] = _loadavg()
        raw.header["backend_info"] = _safe(rec.backend.info)
        raw.header["devices"] = _safe(rec.backend.devices) or []
        raw.queues = _safe(rec.backend.queues) or []
        if self._streamer is not None:
            self._stop_stream(stop_ns)
        else:
            raw.threads = drain(rec, stop_ns)
        try:
            rec.backend.close()
        except Exception as exc:
            report_internal("close", f"closing the backend failed ({type(exc).__name__}: {exc}).")
        if self._streamer is not None:
            return self._result() if self._load_at_stop else self._trace  # type: ignore[return-value]
        self.trace = resolve(raw)
        if self.path is not None:
            self._write(self.trace, self.path)
        return self.trace

    def _write(self, trace: Trace, path: Path) -> None:
        from gputrace.exporters import write

        try:
            write(trace, path)
            self.written = path
        except OSError as exc:
            # The user's program must not die at exit over a file: say so once; keep the trace.
            report_internal(
                "write",
                f"could not write the trace to {path} ({exc.strerror or exc}); "
                "it is still available as session.trace.",
            )

    def _calibrate(self) -> None:
        rec = self._recorder
        assert rec is not None
        try:
            self._raw.samples.extend(rec.backend.calibrate())
        except Exception as exc:
            report_internal(
                "calibrate",
                f"taking a clock calibration sample failed ({type(exc).__name__}: {exc}).",
            )

    def _collect(self) -> None:
        rec = self._recorder
        assert rec is not None
        try:
            got = rec.backend.collect()
        except Exception as exc:
            report_internal("collect", f"collecting GPU timestamps failed ({type(exc).__name__}: {exc}).")
            return
        self._raw.spans.extend(got.spans)
        self._raw.untimed |= got.untimed
        self._raw.degraded.update(got.degraded)

    # context manager -----------------------------------------------------------------------
    def __enter__(self) -> session:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._load_at_stop = False
        self.stop()


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        report_internal(f"info:{fn.__name__}", f"reading backend facts failed ({type(exc).__name__}: {exc}).")
        return None


def _calibration(backend: str) -> dict[str, Any] | None:
    """This machine's saved calibration for ``backend`` (``gputrace calibrate``), or None."""
    try:
        from gputrace.calibrate.store import header_calibration

        return header_calibration(backend)
    except Exception:  # a calibration file must never fail a session
        return None


def current_session() -> session | None:
    rec = active_recorder()
    owner = getattr(rec, "owner", None)
    return owner if isinstance(owner, session) else None


def sync() -> None:
    """Sync the active session's GPU work and take a calibration sample (no-op with no session)."""
    s = current_session()
    if s is not None:
        s.sync()
