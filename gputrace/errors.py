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


def report_internal(kind: str, message: str) -> None:
    """Note a problem inside gputrace: the first since the last reset (a session's start) is a
    ``GputraceWarning``; later ones, and repeats of a kind, are only listed (``reported()``, the
    trace header's ``problems``), so a failing driver warns once. Never raises (not even under
    ``-W error``)."""
    with _lock:
        new = kind not in _reported
        first = new and not _messages
        if new and len(_messages) < MAX_MESSAGES:
            _messages.append(message)
        _reported.add(kind)
    if first:
        with contextlib.suppress(Exception):
            warnings.warn(f"gputrace: {printable(message)}", GputraceWarning, stacklevel=3)


@contextlib.contextmanager
def reporting(kind: str, doing: str, then: str = "") -> Iterator[None]:
    """Run the block; an ``Exception`` raised in it is reported once (``report_internal``) as
    "<doing> failed (<type>: <message>)<then>." and goes no further."""
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
