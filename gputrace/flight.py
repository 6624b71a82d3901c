"""The flight recorder (``session(path, ring_s=N)``) and step windows (``session(steps="a:b")``).

Flight recorder: the session resolves what it records in chunks, as a streaming session does (at
each sync and at least every second), but keeps only the chunks of the last ``ring_s`` seconds in
memory instead of appending them to a file. It writes them to ``path`` (replacing the file, which
is complete each time) when the session stops — a normal exit, an unhandled exception, or the
interpreter exiting without stopping it — and on ``SIGUSR1``, after which the program keeps
running and recording::

    with gputrace.session("last.json.gz", ring_s=30):
        train()            # kill -USR1 <pid> writes the last 30 s now

Step windows: ``gputrace.step()`` marks the end of an iteration (the first iteration is step 0);
``session(steps="100:110")`` records only steps 100 to 109, the way torch.profiler's schedule
skips and warms up. Outside the window the session records nothing and ``gputrace.sync()`` does
nothing; each step inside it is marked ("step 100" …) on the thread that called ``step()``.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np

from gputrace import exporters
from gputrace.backends.base import Clock
from gputrace.errors import GputraceError
from gputrace.model import ANOMALY_FLAGS, Flag, Trace, flag_names
from gputrace.outpath import check_output


class RingWriter:
    """Stands in for a ``StreamWriter``: keeps the chunks of the last ``keep_ns``; ``dump`` writes
    them as one complete file (temp file + rename)."""

    def __init__(self, path: str | Path, header: dict[str, Any], keep_ns: int, clock: Clock) -> None:
        self.path = Path(path)
        self.header = header
        self.keep_ns = keep_ns
        self.clock = clock
        self.chunks: deque[tuple[int, Trace]] = deque()
        self.rows = 0
        self.closed = False
        self.dumps = 0
        self._lock = threading.Lock()

    def append(self, chunk: Trace) -> None:
        s = chunk.scopes
        ends = [int(s.cpu_end_ns.max())] if len(s) else []
        ends += [m.ts_ns for m in chunk.marks[-1:]]
        with self._lock:
            self.chunks.append((max(ends, default=self.clock()), chunk))
            self.rows += len(chunk)
            self._prune()

    def _prune(self) -> None:
        horizon = self.clock() - self.keep_ns
        while self.chunks and self.chunks[0][0] < horizon:
            self.chunks.popleft()

    def dump(self, header: dict[str, Any]) -> Path:
        """Write the kept chunks to ``path`` now; the ring keeps them (the program goes on)."""
        with self._lock:
            self._prune()
            chunks = [c for _, c in self.chunks]
        header = dict(header)
        counts: Counter[str] = Counter()
        anomalous = 0
        for c in chunks:
            for bit in Flag:
                n = int(np.count_nonzero(c.scopes.flags & int(bit)))
                if n:
                    counts[flag_names(int(bit))[0]] += n
            anomalous += int(np.count_nonzero(c.scopes.flags & int(ANOMALY_FLAGS)))
        # exact counts; the examples are rebuilt from the per-scope flags by the reader
        header["anomalies"] = {"counts": dict(counts), "items": [], "truncated": anomalous}
        header["ring"] = {"seconds": self.keep_ns / 1e9, "chunks": len(chunks), "dump": self.dumps + 1}
        tmp = self.path.with_name(".partial-" + self.path.name)  # same extension: same format
        check_output(self.path)  # the rename would replace a device node, FIFO or folder put there
        w = exporters.stream_writer(tmp, header)
        try:
            for c in chunks:
                w.append(c)
            w.close(header)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(self.path)
        self.dumps += 1
        return self.path

    def close(self, header: dict[str, Any]) -> None:
        if not self.closed:
            self.closed = True
            self.dump(header)


def parse_steps(steps: str | tuple[int, int]) -> tuple[int, int]:
    """ "100:110" (or (100, 110)) → (100, 110): steps 100 to 109. A clear error otherwise."""
    if isinstance(steps, tuple):
        a, b = steps
    else:
        try:
            a_s, b_s = str(steps).split(":")
            a, b = int(a_s), int(b_s)
        except ValueError:
            raise GputraceError(f"steps must look like START:STOP (e.g. 100:110), not {steps!r}.") from None
    if not 0 <= a < b:
        raise GputraceError(f"steps {a}:{b} holds no step: START must be ≥ 0 and below STOP.")
    return a, b


class Stepper:
    """Counts ``gputrace.step()`` calls and switches the session's recording on inside the window."""

    def __init__(self, window: tuple[int, int], activate: Any, deactivate: Any, mark: Any) -> None:
        self.start, self.stop = window
        self.n = 0
        self._activate, self._deactivate, self._mark = activate, deactivate, mark

    @property
    def inside(self) -> bool:
        return self.start <= self.n < self.stop

    def begin(self) -> None:
        if self.inside:
            self._activate()
            self._mark(self.n)

    def step(self) -> None:
        was = self.inside
        self.n += 1
        if self.inside and not was:
            self._activate()
        if was and not self.inside:
            self._deactivate()
        elif self.inside:
            self._mark(self.n)


_stepper: Stepper | None = None


def step() -> None:
    """Mark the end of an iteration (see ``session(steps=...)``); free when no window is set.

    >>> import gputrace
    >>> with gputrace.session(backend="cpu", steps="2:4") as s:
    ...     for i in range(6):
    ...         with gputrace.trace("iteration", i=i):
    ...             pass
    ...         gputrace.step()
    >>> [sc.args["i"] for sc in s.trace]
    [2, 3]
    """
    st = _stepper
    if st is not None:
        st.step()


def set_stepper(st: Stepper | None) -> None:
    global _stepper
    _stepper = st
