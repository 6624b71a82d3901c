"""Where gputrace may write: a regular file (replaced) or a path that does not exist yet.

A rename onto a device node would replace the node (``/dev/full`` becoming a regular file, as
root), opening a FIFO blocks until someone reads it, and a directory holds no content: every
writer asks ``check_output`` first, which refuses anything else in one sentence:

>>> try:
...     check_output("/dev/null")
... except GputraceError as exc:
...     print(exc)
/dev/null: is a character device, not a regular file; choose a regular file or a new path.
"""

from __future__ import annotations

import os
import stat

from gputrace.errors import GputraceError
from gputrace.safetext import path_text

FILE_KINDS = (  # (the opener names what it refuses to read with these too)
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def check_output(path: str | os.PathLike[str]) -> None:
    """Raise ``GputraceError`` unless ``path`` is a regular file (a symbolic link to one counts)
    or does not exist. Paths that cannot be inspected (no permission, a missing folder) are left
    to the writer, which reports them."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in FILE_KINDS if test(mode)), "of another kind")
    raise GputraceError(
        f"{path_text(path)}: is {kind}, not a regular file; choose a regular file or a new path."
    )
