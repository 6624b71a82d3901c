"""Undoing an append that failed, so that one failing chunk never costs the others.

A streamed file is written chunk by chunk, and each chunk depends on its writer's state (names
and tracks already announced, the lanes still open, for ``.pftrace`` the time of the previous
packet, for ``.json.gz`` the compressor's history). An ``append`` that fails part-way (a full
disk, a fault while encoding) would leave half a chunk in the file and a state that later chunks
build on, and every later chunk would be unreadable. So the streamer takes a ``checkpoint``
before each append and, when it fails, a ``rollback`` cuts the file back to the checkpoint's
length and puts back the writer's state as it was: the file is again exactly the chunks
written before, and the next append continues from there.

>>> state = {"named": {(1, 0)}, "rows": 3, "open": [[(0, 5)]]}
>>> copy = state_copy(state)
>>> state["named"].add((1, 2)); state["open"][0].append((6, 7))
>>> copy
{'named': {(1, 0)}, 'rows': 3, 'open': [[(0, 5)]]}
"""

from __future__ import annotations

import copy
import os
import types
from typing import Any, NamedTuple

# Values that no writer changes in place: kept, not copied (tuples of these are what keys are).
_ATOMIC = (
    int, float, complex, str, bytes, bool, type(None), tuple, frozenset, type,
    types.FunctionType, types.BuiltinFunctionType, types.MethodType,
)  # fmt: skip


def state_copy(x: Any) -> Any:
    """A copy of a writer's state deep enough that nothing the writer mutates is shared, and no
    deeper: tuples, strings, numbers and frozen dataclasses are shared (a ``copy.deepcopy`` of
    a ``.pftrace`` writer's tables took 20-120 ms a chunk; this takes a few). A container met
    twice is copied twice: what a writer mutates it reaches one way only."""
    if isinstance(x, _ATOMIC) or getattr(getattr(type(x), "__dataclass_params__", None), "frozen", False):
        return x
    if isinstance(x, dict):
        out = copy.copy(x)  # keeps the type (a defaultdict keeps its factory)
        out.update({k: state_copy(v) for k, v in x.items() if not isinstance(v, _ATOMIC)})
        return out
    if isinstance(x, (list, set)):
        return type(x)(v if isinstance(v, _ATOMIC) else state_copy(v) for v in x)
    if hasattr(x, "__dict__"):
        out = copy.copy(x)
        out.__dict__.update({k: state_copy(v) for k, v in vars(x).items()})
        return out
    return copy.deepcopy(x)  # (a numpy array, a slotted object)


class Checkpoint(NamedTuple):
    """A file's length and its writer's state, before an append."""

    offset: int
    state: dict[str, Any]


def checkpoint(fd: int, writer: Any, *names: str) -> Checkpoint:
    """The length of ``fd`` and a copy of ``writer``'s attributes ``names`` (a compressor is
    copied with its own ``copy()``)."""
    state = {}
    for name in names:
        v = getattr(writer, name)
        state[name] = v.copy() if hasattr(v, "flush") and hasattr(v, "copy") else state_copy(v)
    return Checkpoint(os.lseek(fd, 0, os.SEEK_CUR), state)


def rollback(fd: int, writer: Any, cp: Checkpoint) -> None:
    """Cut ``fd`` back to ``cp``'s length and give ``writer`` back the state it had then. Raises
    OSError if the file cannot be cut (then the writer must not append again)."""
    os.ftruncate(fd, cp.offset)
    os.lseek(fd, cp.offset, os.SEEK_SET)
    for name, v in cp.state.items():
        setattr(writer, name, v)
