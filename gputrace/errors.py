"""Errors and notices: ``GputraceError``, the one error a user sees (one sentence naming the
problem and the file); failures inside gputrace never raise into the user's code: the first is a
warning (``report_internal``), all are listed in the trace.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator

from gputrace.safetext import printable


class GputraceError(Exception):
    """A problem the user can fix: a bad trace file, a missing GPU, a wrong option."""


class GputraceWarning(UserWarning):
    """Something inside gputrace went wrong; the user's program carries on."""


_reported: set[str] = set()
_messages: list[str] = []  # what was reported since the last reset (the trace header lists it)
_lock = threading.Lock()
MAX_MESSAGES = 20


def report_internal(kind: str, message: str) -> bool:
    """Note a problem inside gputrace; returns True if this call emitted a warning.

    The first problem since the last reset (a session's start) is a ``GputraceWarning``; later
    ones, and repeats of a kind, are only listed (``reported()``, the trace header's
    ``problems``), so a failing driver gives one warning, not one per call. Never raises, not even
    when warnings are turned into errors (``-W error``)."""
    with _lock:
        if kind in _reported:
            return False
        _reported.add(kind)
        first = not _messages
        if len(_messages) < MAX_MESSAGES:
            _messages.append(message)
    if not first:
        return False
    with contextlib.suppress(Exception):
        warnings.warn(f"gputrace: {printable(message)}", GputraceWarning, stacklevel=3)
    return True


@contextlib.contextmanager
def reporting(kind: str, doing: str, then: str = "") -> Iterator[None]:
    """Run the block; an ``Exception`` raised in it goes no further and is reported once as
    "<doing> failed (<type>: <message>)<then>." (``report_internal``): what gputrace does beside
    the program (syncs, chunks, stops) never stops the program."""
    try:
        yield
    except Exception as exc:
        report_internal(kind, f"{doing} failed ({type(exc).__name__}: {exc}){then}.")


def reported() -> list[str]:
    """The problems reported since the last reset, in order (at most ``MAX_MESSAGES``)."""
    with _lock:
        return list(_messages)


def reset_reports() -> None:
    """Forget which internal problems were reported (for tests and new sessions)."""
    with _lock:
        _reported.clear()
        _messages.clear()


def _reinit_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


def notice(message: str) -> None:
    """A one-line notice on stderr (e.g. which backend ``auto`` chose)."""
    print(f"gputrace: {printable(message)}", file=sys.stderr)
