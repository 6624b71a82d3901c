"""One status line on stderr for work that takes a while (loading, merging, calibrating), redrawn
in place (each step, and every ``tick_s`` through a long one) and cleared when the work ends.
Shown only on a terminal, so pipes, logs and CI output stay clean:

>>> import io
>>> with Progress("merging", total=3, stream=io.StringIO()) as p:
...     p.step("a.json")
>>> p.shown
False
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
import time
from typing import TextIO

MIN_BYTES = 32 << 20  # loads of less than this much JSON finish before a bar would help


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # closed or replaced streams
        return False


_SHOWING: list[Progress] = []  # the lines on screen now, so a message can clear them first


def clear() -> None:
    """End any progress line on screen (before printing a message to stderr)."""
    for p in list(_SHOWING):
        p.close()


class Progress:
    """``label: what [done/total] elapsed`` on one line of ``stream`` (stderr by default)."""

    def __init__(
        self, label: str, total: int | None = None, *, stream: TextIO | None = None, tick_s: float = 0.5
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.enabled = is_terminal(self.stream)
        self.shown = False
        self._start = time.monotonic()
        self._what: str | None = None  # the step under way (None: before the first)
        self._tick_s = tick_s
        self._lock = threading.Lock()  # the ticker and the caller both draw
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def step(self, what: str) -> None:
        """``what`` starts now; the step announced before it (if any) is done."""
        if self._what is not None:
            self.done += 1
        self._what = what
        self._draw()

    def _tick(self) -> None:  # keeps the elapsed time moving through a long step
        while not self._stop.wait(self._tick_s):
            self._draw()

    def _draw(self) -> None:
        with self._lock:
            if not self.enabled:
                return
            count = f" [{self.done}/{self.total}]" if self.total else ""
            what = f": {self._what}" if self._what else ""
            line = f"{self.label}{what}{count} {time.monotonic() - self._start:.1f} s"
            try:
                self.stream.write(f"\r\x1b[K{line}")
                self.stream.flush()
                self.shown = True
                if self not in _SHOWING:
                    _SHOWING.append(self)
            except (OSError, ValueError):  # a closed terminal never stops the work
                self.enabled = False

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()
        with self._lock:
            if self in _SHOWING:
                _SHOWING.remove(self)
                with contextlib.suppress(OSError, ValueError):
                    self.stream.write("\r\x1b[K")
                    self.stream.flush()
            self.enabled = False

    def __enter__(self) -> Progress:
        self._draw()
        if self.enabled and self._tick_s > 0:
            self._ticker = threading.Thread(target=self._tick, name="gputrace-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def content_size(path: str | os.PathLike[str]) -> int:
    """Bytes of JSON a (possibly gzipped) file holds (a 4.7 MB ``.json.gz`` holding 44 MB counts as
    44 MB, by its trailer); 0 if the file cannot be read."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return 0  # a FIFO or device: opening it could block; the loader refuses it
        size = st.st_size
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(-4, os.SEEK_END)
            isize = int.from_bytes(f.read(4), "little")  # uncompressed size mod 2**32
    except OSError:
        return 0
    while isize < size:  # files over 4 GiB: the trailer wrapped around
        isize += 1 << 32
    return isize
