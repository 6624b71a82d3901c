"""Python's cyclic garbage collector held off while gputrace builds many small objects at once.

Resolving and writing a chunk, or reading a trace back, creates tens of thousands of objects that
stay alive; each burst made the collector walk every live object again (20–30 ms of a 45 ms join
of 20k CUDA operations, a third of a 20k-scope trace's read), finding nothing to free: nothing
built there forms a cycle.
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
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
