"""Python's cyclic garbage collector held off while gputrace builds many small objects at once.

Resolving and writing a chunk creates tens of thousands of tuples (per-operation records, event
rows) that all stay alive until the chunk is written, and reading a trace back a container per
event. Each allocation burst makes the collector walk every live object again: 20–30 ms of a 45 ms
join of 20k CUDA operations, and a third of a 20k-scope GPU trace's read, went to collections
that found nothing to free. Nothing gputrace builds there forms a cycle, so the
collector is paused for the stage and restored as it was (a user who disabled it keeps it so).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for the block; leave it as it was afterwards.

    >>> import gc
    >>> with gc_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
