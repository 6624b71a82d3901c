"""The flight recorder (``session(path, ring_s=N)``) and step windows (``steps="a:b"``,
``schedule=``), as docs/output.md ("Flight recorder and step windows") describes them.

The ring keeps a streaming session's chunks of the last ``ring_s`` seconds (``RingWriter``),
written as one file at stop, at interpreter exit and on ``SIGUSR1`` (``RingTriggers``). A
session starts and stops a ``Stepper``, which ``gputrace.step()`` drives.
"""

from __future__ import annotations

import atexit
import signal
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from gputrace import exporters
from gputrace.backends.base import Clock
from gputrace.errors import GputraceError
from gputrace.flags import flag_counts
from gputrace.model import ANOMALY_FLAGS, Trace
from gputrace.outpath import check_output
from gputrace.recorder import Recorder, active_recorder


class RingWriter:
    """Stands in for a ``StreamWriter``: keeps the chunks of the last ``keep_ns``; ``dump`` writes
    them as one complete file (temp file + rename)."""

    def __init__(self, path: str | Path, keep_ns: int, clock: Clock) -> None:
        self.path, self.keep_ns, self.clock = Path(path), keep_ns, clock
        self.chunks: deque[tuple[int, Trace]] = deque()
        self.rows_in_file = 0  # scopes in the file its last dump wrote
        self.closed = False
        self.dumps = 0
        self._lock = threading.Lock()

    def append(self, chunk: Trace) -> None:
        s = chunk.scopes
        ends = [int(s.cpu_end_ns.max())] if len(s) else []
        ends += [m.ts_ns for m in chunk.marks[-1:]]
        with self._lock:
            self.chunks.append((max(ends, default=self.clock()), chunk))
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
        flags = np.concatenate([c.scopes.flags for c in chunks] or [np.zeros(0, np.int64)])
        anomalous = int(np.count_nonzero(flags & int(ANOMALY_FLAGS)))
        # exact counts; the examples are rebuilt from the per-scope flags by the reader
        anomalies = {"counts": flag_counts(flags), "items": [], "truncated": anomalous}
        ring = {"seconds": self.keep_ns / 1e9, "chunks": len(chunks), "dump": self.dumps + 1}
        header = dict(header, anomalies=anomalies, ring=ring)
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
        self.rows_in_file = sum(len(c) for c in chunks)
        self.dumps += 1
        return self.path

    def close(self, header: dict[str, Any]) -> None:
        if not self.closed:
            self.closed = True
            self.dump(header)


class RingTriggers:
    """Installs when a flight recorder writes besides its session's stop: at interpreter exit
    (``at_exit``) and on ``SIGUSR1`` (``dump``, on a thread of its own: a signal handler must
    never block; only from the main thread, where signals can be set)."""

    def __init__(self, at_exit: Callable[[], object], dump: Callable[[], object]) -> None:
        self.at_exit = at_exit
        self._usr1: Any = None  # the handler SIGUSR1 had before
        if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR1"):

            def on_usr1(signum: int, frame: Any) -> None:
                threading.Thread(target=dump, name="gputrace-ring", daemon=True).start()

            self._usr1 = signal.signal(signal.SIGUSR1, on_usr1)
        atexit.register(at_exit)  # last: a start that failed above leaves no exit hook behind

    def remove(self) -> None:
        atexit.unregister(self.at_exit)
        if self._usr1 is not None:
            signal.signal(signal.SIGUSR1, self._usr1)
            self._usr1 = None


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Which ``gputrace.step()`` iterations are recorded (``gputrace.schedule``, with
    torch.profiler.schedule's arguments and counting): ``skip_first`` steps, then ``repeat``
    cycles (0: no end) of ``wait``, ``warmup`` and ``active`` steps. Only active steps are
    recorded, each cycle's as its own marked window ("window 0" …). Warmup steps are counted but
    not recorded: the backend starts with the session, so there is no start-up to absorb.

    >>> sch = Schedule(wait=1, warmup=1, active=2, repeat=2)
    >>> [sch.window(n) for n in range(9)]
    [None, None, 0, 0, None, None, 1, 1, None]
    >>> sch.windows()
    [(2, 4), (6, 8)]
    >>> import gputrace
    >>> with gputrace.session(backend="cpu", schedule=gputrace.schedule(wait=1, active=1, repeat=2)) as s:
    ...     for i in range(6):
    ...         with gputrace.trace("iteration", i=i):
    ...             pass
    ...         gputrace.step()
    >>> [sc.args["i"] for sc in s.trace], [m.name for m in s.trace.marks if m.name.startswith("window")]
    ([1, 3], ['window 0', 'window 1'])
    """

    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0
    skip_first: int = 0

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise GputraceError(f"schedule {name} must be a whole number ≥ 0, not {v!r}.")
        if self.active < 1:
            raise GputraceError("a schedule records nothing with active=0: give active ≥ 1.")

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    def window(self, n: int) -> int | None:
        """The active window step ``n`` (counted from 0) belongs to, or None: not recorded."""
        k, at = divmod(n - self.skip_first, self.cycle)
        if n < self.skip_first or (self.repeat and k >= self.repeat):
            return None
        return k if at >= self.wait + self.warmup else None

    def first_recorded(self) -> int:
        return self.skip_first + self.wait + self.warmup

    def windows(self) -> list[tuple[int, int]] | None:
        """Every window's steps as (start, stop); None when it repeats without end."""
        if not self.repeat:
            return None
        first = self.first_recorded()
        return [(first + k * self.cycle, first + k * self.cycle + self.active) for k in range(self.repeat)]


schedule = Schedule  # gputrace.schedule(wait=, warmup=, active=, repeat=, skip_first=)


def parse_schedule(spec: str | Schedule | dict[str, int] | None) -> Schedule | None:
    """A ``Schedule`` from one, a dict of its fields, or "wait=1,warmup=1,active=3,repeat=2"."""
    if spec is None or isinstance(spec, Schedule):
        return spec
    if isinstance(spec, dict):
        given = dict(spec)
    else:
        given = {}
        for part in str(spec).replace(" ", "").split(","):
            key, sep, value = part.partition("=")
            if not sep or not value.isdigit():
                raise GputraceError(f"a schedule looks like wait=1,warmup=1,active=3,repeat=2, not {spec!r}.")
            given[key] = int(value)
    known = [f.name for f in fields(Schedule)]
    if unknown := sorted(set(given) - set(known)):
        fields_of = f"the fields are {', '.join(known)}"
        raise GputraceError(f"unknown schedule field {', '.join(map(repr, unknown))}; {fields_of}.")
    return Schedule(**given)


def parse_steps(steps: str | tuple[int, int]) -> Schedule:
    """ "100:110" (or (100, 110)) → the schedule of steps 100 to 109. A clear error otherwise."""
    try:
        a, b = steps if isinstance(steps, tuple) else map(int, str(steps).split(":"))
    except ValueError:
        raise GputraceError(f"steps must look like START:STOP (e.g. 100:110), not {steps!r}.") from None
    if not 0 <= a < b:
        raise GputraceError(f"steps {a}:{b} holds no step: START must be ≥ 0 and below STOP.")
    return Schedule(skip_first=a, active=b - a, repeat=1)


class Stepper:
    """Counts ``gputrace.step()`` calls and switches ``rec`` on inside each active window (off
    outside); marks every window's start and every step inside one."""

    def __init__(self, plan: Schedule, rec: Recorder, clock: Clock) -> None:
        self.plan, self.rec, self.clock = plan, rec, clock
        self.n = 0
        self.first_recorded = plan.first_recorded()
        self.seen: list[tuple[int, int]] = []  # windows entered: (first step, last step + 1)

    def start(self) -> Stepper:
        """From now on ``gputrace.step()`` calls ``step`` here (a session's start)."""
        global _stepper
        _stepper = self
        first = self.plan.window(0)
        if first is not None:
            self.enter(first)
        return self

    def stop(self) -> dict[str, Any]:
        """``step()`` counts nothing more; returns the header's ``schedule`` (plan, steps, windows)."""
        global _stepper
        _stepper = None
        return dict(asdict(self.plan), steps=self.n, windows=[list(w) for w in self.seen])

    def step(self) -> None:
        was = self.plan.window(self.n)
        self.n += 1
        now = self.plan.window(self.n)
        if was is not None and now != was:
            self.rec.deactivate()
        if now is not None and now != was:
            self.enter(now)
        elif now is not None:
            self.seen[-1] = (self.seen[-1][0], self.n + 1)
            self._mark(None)

    def enter(self, window: int) -> None:
        self.seen.append((self.n, self.n + 1))
        if active_recorder() is None:
            self.rec.activate()
        self._mark(window)

    def _mark(self, window: int | None) -> None:
        now = self.clock()
        if window is not None:  # an active window starts: its own mark, so each can be found
            self.rec.add_mark(f"window {window}", now, "mark", {"window": window, "step": self.n})
        self.rec.add_mark(f"step {self.n}", now, "mark", {"step": self.n})


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
