"""Errors and notices.

``GputraceError`` is the one error type a user sees: its message is one sentence that names the
problem (and the file, where there is one). Failures inside gputrace while recording never raise
into the user's code; they are reported once per kind through ``report_internal``.
"""

from __future__ import annotations

import sys
import threading
import warnings


class GputraceError(Exception):
    """A problem the user can fix: a bad trace file, a missing GPU, a wrong option."""


class GputraceWarning(UserWarning):
    """Something inside gputrace went wrong; the user's program carries on."""


_reported: set[str] = set()
_lock = threading.Lock()


def report_internal(kind: str, message: str) -> bool:
    """Warn once per ``kind`` for this process; returns True if this call emitted the warning."""
    with _lock:
        if kind in _reported:
            return False
        _reported.add(kind)
    warnings.warn(f"gputrace: {message}", GputraceWarning, stacklevel=3)
    return True


def reset_reports() -> None:
    """Forget which internal problems were reported (for tests and new sessions)."""
    with _lock:
        _reported.clear()


def notice(message: str) -> None:
    """A one-line notice on stderr (e.g. which backend ``auto`` chose)."""
    print(f"gputrace: {message}", file=sys.stderr)
