"""Appending a streamed session's chunks to its file, in order, here or in a writer process.

``Appender`` owns the format's ``StreamWriter``: a chunk whose write fails with an ``OSError`` (a
full disk) is held and written again before the next; one the encoder fails on is written with
CPU times only, flagged ``degraded``; ``close`` counts what never reached the file.
``WriterProcess`` runs ``chunks.Resolving`` in a child (``python -S -c SERVE``; docs/reliability.md,
"The writer process"), sent pickled chunks down a pipe, off the program's interpreter. The pipe is
the backpressure: a writer behind blocks the streamer's thread, never the program.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from gputrace.errors import report_internal, reported, reporting
from gputrace.fallback import without_gpu
from gputrace.model import Trace

MAX_HELD_SCOPES = 500_000  # scopes of chunks held while the disk is full (then the oldest are lost)
_FRAME = struct.Struct("<Q")
READY = b"R"  # the writer process has the file open
PIPE_BYTES = 1 << 20  # the pipe's buffer (Linux): chunks in flight before the streamer waits
CLOSE_WAIT_S = 120.0  # a stop waits this long at most for the writer process to finish the file
STALL_S = 60.0  # a writer process that reads nothing this long is given up (its chunks counted lost)
WAIT_TELL_S = 0.05  # how often a send waiting for room in the pipe says so (``on_wait``)
# The writer process's program, given the package's folder: the package without its ``__init__``
# (10 modules it never uses, a fifth of its start); it ends without the interpreter's teardown,
# which the session's stop would wait for (32-64 ms on a 2-core machine).
SERVE = """import os, sys, types
sys.modules["gputrace"] = package = types.ModuleType("gputrace")
package.__path__ = [sys.argv[1]]
from gputrace.appender import serve
serve(int(sys.argv[2]))
os._exit(0)"""


class Losses:
    """What never reached the file, counted for the final header's ``lost``."""

    lost_scopes = lost_chunks = degraded_chunks = 0

    def lose(self, scopes: int, what: str, exc: BaseException) -> None:
        """``what`` failed and cost ``scopes`` scopes: counted, and reported."""
        self.lost_scopes += scopes
        self.lost_chunks += 1
        report_internal(
            f"stream-lost:{what}",
            f"{what} failed ({type(exc).__name__}: {exc}); {scopes} scopes are lost, counted in the trace.",
        )

    def with_lost(self, header: dict[str, Any]) -> dict[str, Any]:
        """``header`` with these counts added to its ``lost``."""
        lost = dict(header.get("lost") or {})
        mine = {
            "scopes": self.lost_scopes,
            "chunks": self.lost_chunks,
            "degraded_chunks": self.degraded_chunks,
        }
        return dict(header, lost=lost | {key: int(lost.get(key, 0)) + n for key, n in mine.items()})


class Appender(Losses):
    """Append chunks to ``writer`` in order; hold a chunk whose write fails with an ``OSError``."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer
        self.held: list[tuple[int, Trace]] = []  # (first row, chunk) whose write failed, in order
        self.chunks = 0
        self.dropped: list[tuple[int, int]] = []  # (first row, scopes) of chunks that never reached the file

    def add(self, chunk: Trace, first_row: int) -> None:
        """Append the held chunks, then ``chunk`` (its first scope: row ``first_row`` of what the
        session sent); a chunk whose write fails is held, and those after it wait behind it."""
        self.held.append((first_row, chunk))
        # (on a fault the chunks stay held: written with the next one, or at close)
        with reporting("stream-append", "appending a trace chunk", "; it is tried again"):
            self._flush_held(at_close=False)
            while sum(len(c) for _, c in self.held) > MAX_HELD_SCOPES and len(self.held) > 1:
                self._drop_held(OSError(errno.ENOSPC, "the disk stayed full"))

    def _flush_held(self, at_close: bool) -> None:
        while self.held:
            if self._append_first():
                continue
            if not at_close:
                return  # the disk is still full: try again with the next chunk, or at close
            self._drop_held(OSError(errno.ENOSPC, "the disk was still full at the end"))

    def _append_first(self) -> bool:
        """Append ``held[0]``: True once written or lost (counted), False if held (an OSError)."""
        first, chunk = self.held[0]
        if self.writer.closed:
            self._drop_held(RuntimeError("the trace file is closed"))
            return True
        for cpu_only in (False, True):
            cp = self._checkpoint()
            try:
                self.writer.append(chunk)
                break
            except OSError as exc:
                self._undo(cp)
                report_internal("stream-disk", f"appending to the trace failed ({exc.strerror or exc}); "
                                "the chunk is kept and written with the next one.")  # fmt: skip
                return False
            except Exception as exc:
                self._undo(cp)
                if cpu_only or self.writer.closed:
                    self._drop_held(exc)
                    return True
                reason = f"encoding GPU times failed ({type(exc).__name__}: {exc})"
                report_internal(
                    "stream-encode", f"{reason}; its scopes keep CPU times only, flagged degraded."
                )
                chunk = without_gpu(chunk, reason)
                self.held[0] = (first, chunk)
                self.degraded_chunks += 1
        self.held.pop(0)
        self.chunks += 1
        return True

    def _checkpoint(self) -> Any:
        with contextlib.suppress(Exception):
            return self.writer.checkpoint() if hasattr(self.writer, "checkpoint") else None
        return None

    def _undo(self, cp: Any) -> None:
        """Cut the file back to ``cp``; if impossible, stop appending (the file ends at its last
        whole chunk)."""
        if not hasattr(self.writer, "checkpoint"):
            return  # a writer in memory (the flight recorder's ring): nothing half-written to cut
        try:
            if cp is None:
                raise RuntimeError("no checkpoint was taken")
            self.writer.rollback(cp)
        except Exception as undo_exc:
            why = f"{type(undo_exc).__name__}: {undo_exc}"
            report_internal("stream-undo", f"a failed append could not be undone ({why}); "
                            "the trace ends at its last whole chunk.")  # fmt: skip
            with contextlib.suppress(Exception):
                self.writer.abandon()  # (every writer with a checkpoint has it)

    def _drop_held(self, exc: BaseException) -> None:
        """``held[0]`` never reaches the file: counted, and its rows remembered for ``close``."""
        first, chunk = self.held.pop(0)
        self.dropped.append((first, len(chunk)))
        self.lose(len(chunk), "appending a trace chunk", exc)

    def close(self, header: dict[str, Any]) -> None:
        """Write what is held (a last try), then the final header with this appender's counts added
        and the anomaly examples of lost chunks taken out."""
        try:
            self._flush_held(at_close=True)
        except Exception as exc:
            n = sum(len(c) for _, c in self.held)
            self.held.clear()
            self.lose(n, "appending the last trace chunks", exc)
        header = self.with_lost(header)
        if not (header["lost"]["scopes"] or header["lost"]["degraded_chunks"]):
            del header["lost"]
        anomalies = header.get("anomalies")
        if self.dropped and isinstance(anomalies, dict):
            anomalies["items"] = _without_rows(anomalies.get("items") or [], self.dropped)
        header["streamed"] = {"chunks": self.chunks}
        self.writer.close(header)


def _without_rows(items: list[dict[str, Any]], dropped: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """Anomaly examples (``scope``: the row among those sent) renumbered as rows of the file,
    those of the dropped chunks left out."""
    out = []
    for item in items:
        row = int(item["scope"])
        if any(first <= row < first + n for first, n in dropped):
            continue
        out.append(dict(item, scope=row - sum(n for first, n in dropped if first + n <= row)))
    return out


# -- the writer process -------------------------------------------------------------------------
def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=5)
    return _FRAME.pack(len(data)) + data


def _receive(f: Any) -> Any:
    """The next framed message, or None where the pipe ends first."""
    head = f.read(_FRAME.size)
    if head is None or len(head) != _FRAME.size:
        return None
    n = _FRAME.unpack(head)[0]
    body = f.read(n)
    return pickle.loads(body) if body is not None and len(body) == n else None


class SpawnFailed(Exception):
    """The writer process could not be started."""


def spawn() -> subprocess.Popen[bytes]:
    """Start a writer process (before the backend, so their starts overlap): it imports what it
    needs, then waits for the file it writes."""
    # the child finds this gputrace first (an editable install's finder may not be a path) and
    # this process's path: it skips ``site`` (-S), whose .pth files took 48 of the 58 ms an
    # interpreter needs to start on the H200 (docs/cupti.md)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, *(p for p in sys.path if p)]))
    # the child does no linear algebra: numpy's BLAS would start a thread per core that
    # spins while the program runs (2.0 s of CPU before the child was ready, on the H200's 16)
    env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    try:
        return subprocess.Popen(
            [sys.executable, "-S", "-c", SERVE, os.path.join(here, "gputrace"), str(time.monotonic_ns())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, close_fds=True, start_new_session=True,
        )  # fmt: skip
    except Exception as exc:  # no interpreter to run: the session appends in-process
        raise SpawnFailed(f"{type(exc).__name__}: {exc}") from None


def discard(proc: subprocess.Popen[bytes] | None) -> None:
    """End a writer process that was never given a file. Never raises."""
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.kill()
        _finish(proc, False)


def _finish(proc: subprocess.Popen[bytes], answer: bool) -> Any:
    """Close the pipe; read the writer process's answer (with ``answer``; "late" if none came in
    ``CLOSE_WAIT_S``: the child finishes on its own); it is reaped once it ends."""
    reply: Any = None
    out: Any = proc.stdout
    with contextlib.suppress(Exception):
        proc.stdin.close()  # type: ignore[union-attr]
    if answer:
        with contextlib.suppress(Exception):
            if not select.select([out], [], [], CLOSE_WAIT_S)[0]:
                return "late"
            reply = _receive(out)
    # reaped on a thread of its own: nothing waits for it, and ``Popen.wait`` with a time-out
    # polls in sleeps of 0.5 ms and more (1-3 ms at a stop)
    if proc.poll() is None:
        with contextlib.suppress(Exception):
            threading.Thread(target=proc.wait, name="gputrace-reap", daemon=True).start()
    with contextlib.suppress(Exception):
        out.close()
    return reply


class WriterProcess(Losses):
    """``Resolving`` in a child process, with the same methods; never raises into the session."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: dict[str, Any],
        proc: subprocess.Popen[bytes] | None = None,
    ) -> None:
        """``proc``: a writer process from ``spawn`` (else one is started; the caller's to
        discard if this raises)."""
        _check_writable(path)  # refused here, at once, as an in-process open would refuse it
        self.path, self.header = path, copy.deepcopy(header)  # as the writer process gets it
        self.proc = proc if proc is not None else spawn()
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._stdout: IO[bytes] = self.proc.stdout
        self._fd = self.proc.stdin.fileno()
        os.set_blocking(self._fd, False)  # see _send: never wait on a writer process for ever
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self.closed = False
        self.rows = 0  # scopes sent
        self._broken: str | None = None  # (its lost_scopes: sent after the writer process ended)
        # Until a chunk is sent to a child that said it is ready (it imports numpy and the exporters
        # first: 0.1-0.5 s), the chunks sent are kept here too: a session that ends before then
        # writes them itself, for no more than waiting for the child would cost.
        self._kept: list[Any] | None = []  # (``chunks.RawChunk``s; ``_here``: ``chunks.Resolving``)
        self._is_ready = False
        self._here: Any = None  # the writer process failed before it was ready
        self._unsent: list[memoryview] = []  # frames not in the pipe yet (the child is starting)
        # told True while a send waits for room in the pipe (every WAIT_TELL_S), then False
        self.on_wait: Callable[[bool], None] | None = None
        self._send(("open", os.fspath(path), header), wait=False)

    def _send(self, msg: Any, wait: bool = True) -> bool:
        """Frame ``msg`` (None: none) and write it after the frames not written yet; ``wait``: until
        all are in the pipe (at most ``STALL_S`` each time it is full), else what fits now (the
        rest goes with the next send). False once the writer process ended or hangs (reported)."""
        if self._broken is not None:
            return False
        if msg is not None:
            self._unsent.append(memoryview(_frame(msg)))
        waited = False
        try:
            while self._unsent:
                try:
                    n = os.write(self._fd, self._unsent[0])
                except BlockingIOError:
                    if not wait:
                        return True
                    for _ in range(int(STALL_S / WAIT_TELL_S)):
                        if select.select([], [self._fd], [], WAIT_TELL_S)[1]:
                            break
                        if self.on_wait is not None:
                            waited = True
                            self.on_wait(True)
                    else:
                        why = f"the writer process read nothing for {STALL_S:g} s"
                        raise TimeoutError(errno.ETIMEDOUT, why) from None
                    continue
                self._unsent[0] = self._unsent[0][n:]
                if not self._unsent[0].nbytes:
                    self._unsent.pop(0)
            return True
        except OSError as exc:  # the writer process ended or hangs: what it had is in the file
            self._broken = exc.strerror or str(exc)
            report_internal("writer-process", f"the trace's writer process ended ({self._broken}); the trace "
                            "ends at its last whole chunk, later scopes are counted as lost.")  # fmt: skip
            return False
        finally:
            if waited and self.on_wait is not None:
                self.on_wait(False)

    def add(self, chunk: Any) -> None:
        n = chunk.scopes
        self.rows += n
        if self._here is not None:
            self._here.add(chunk)
            return
        ready = self._ready()  # (before the send: a chunk sent to a child still starting is kept)
        sent = self._send(("add", chunk), wait=ready)
        if self._kept is not None:
            if ready and sent:  # the child resolves and appends from here on
                self._kept = None
                return
            self._kept.append(chunk)
            if not sent:  # it ended before it was sent a chunk when ready: this process writes the file
                self._write_here()
        elif not sent:
            self.lost_scopes += n

    def _ready(self) -> bool:
        """Whether the writer process said it has the file open (one byte, read without waiting)."""
        if not self._is_ready:
            out = self._stdout
            with contextlib.suppress(Exception):
                if select.select([out], [], [], 0)[0] and out.read(1) == READY:
                    self._is_ready = True
        return self._is_ready

    def abandon(self) -> None:
        """End the writer process without a final header (the file reads as ending early)."""
        if not self.closed:
            self.closed = True
            _finish(self.proc, False)  # (it ends once it has read what was sent)

    def close(self, header: dict[str, Any]) -> None:
        """Send the final header and wait for the writer process to finish the file; what it
        reported is reported here."""
        if self.closed:
            return
        self.closed = True
        if self._here is None and self._kept is not None:
            if self._ready() and self._send(None):  # it is reading every chunk kept: it writes them
                self._kept = None
            else:
                self._write_here()
        if self._here is not None:
            self._here.close(header)
            return
        sent = self._send(("close", self.with_lost(header)))
        reply = _finish(self.proc, sent)
        if reply == "late":
            report_internal("writer-process", f"the trace's writer process is still writing {self.path} "
                            f"after {CLOSE_WAIT_S:g} s; the file is complete once it ends (it goes on "
                            "without the program).")  # fmt: skip
            return
        if not isinstance(reply, dict):
            if sent:
                report_internal("writer-process", "the trace's writer process ended before the final "
                                "header; the trace ends at its last whole chunk.")  # fmt: skip
            return
        for message in reply.get("reports", []):
            report_internal(f"writer:{message}", message)
        if reply.get("error"):
            raise OSError(errno.EIO, reply["error"])

    def _write_here(self) -> None:
        """From now on this process appends (the session ended before a chunk was sent to a ready
        child, or the child ended before then): the child is stopped, the file opened afresh, and
        the chunks kept appended first."""
        from gputrace.chunks import resolving

        discard(self.proc)
        self._here = resolving(self.path, self.header)
        kept, self._kept = self._kept or [], None
        for chunk in kept:
            self._here.add(chunk)


def _check_writable(path: str | os.PathLike[str]) -> None:
    """Raise the ``OSError`` an open for writing would, without making the file."""
    p = os.fspath(path)
    folder = os.path.dirname(p) or "."
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", p)
    if not os.access(p if os.path.exists(p) else folder, os.W_OK):
        raise PermissionError(errno.EACCES, "Permission denied", p)


def _peak_rss_mb() -> float | None:
    """This process's peak resident memory since its start (``VmHWM``; Linux), in MB."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return None


def serve(spawned_ns: int) -> None:
    """The writer process: chunks from stdin resolved and appended; the close answered on stdout.
    ``spawned_ns``: when the program started it (``time.monotonic_ns``, one clock for both)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the program; this finishes the file
    from gputrace.chunks import Resolving, resolving

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    out: Resolving | None = None
    ready_s = 0.0
    ready_ms = None  # from the spawn to the file open: chunks sent before then wait
    error = ""
    while (msg := _receive(stdin)) is not None:
        try:
            if msg[0] == "open":  # a failure ends this process: the session then writes the file
                out = resolving(msg[1], msg[2])
                ready_s = time.process_time()
                ready_ms = round((time.monotonic_ns() - spawned_ns) / 1e6, 1)
                with contextlib.suppress(OSError):  # (a session already gone: the file goes on)
                    stdout.write(READY)
                    stdout.flush()
            elif msg[0] == "add" and out is not None:
                out.add(msg[1])
            elif msg[0] == "close" and out is not None:
                cpu_s = time.process_time()  # its CPU time: starting, then the chunks
                facts = {"peak_rss_mb": _peak_rss_mb(), "start_cpu_s": round(ready_s, 3),
                         "chunks_cpu_s": round(cpu_s - ready_s, 3), "ready_ms": ready_ms}  # fmt: skip
                header = dict(msg[1], writer_process=facts)
                if mine := [m for m in reported() if m not in header.get("problems", [])]:
                    header["problems"] = [*header.get("problems", []), *mine]
                out.close(header)
                break
        except Exception as exc:  # said to the session at close
            error = error or f"{type(exc).__name__}: {exc}"
            if msg[0] in ("open", "close"):
                break
    if out is not None and not out.appender.writer.closed:  # the pipe closed first: a crash, or abandon
        with contextlib.suppress(Exception):
            out.appender.writer.abandon()
    with contextlib.suppress(OSError):
        stdout.write(_frame({"reports": reported(), "error": error}))
        stdout.flush()
