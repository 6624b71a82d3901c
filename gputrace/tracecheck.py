"""Checks the loader applies to a trace file's values before they become rows.

Each returns ``None`` for a good file or the reason a file is malformed (the loader raises it):

- a GPU duration (``gpu_us``) below zero is refused, as a negative CPU ``dur`` is, unless the
  slice carries the flag gputrace gives such a measurement (``empty_gpu_span`` or ``degraded``):
  gputrace writes a broken timer's value as measured, flagged, and never unflagged;
- an event that appears twice (a file concatenated or edited by hand) is refused instead of
  becoming a phantom row with doubled counts: the same CPU slice (thread, name, start, duration
  and args all equal) or two GPU slices for one scope. (Two GPU passes may legitimately share
  every field, so passes are not checked.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

# flags under which gputrace itself writes a GPU duration below zero (see resolver._flag)
NEGATIVE_GPU_OK = frozenset({"empty_gpu_span", "degraded"})


def negative_gpu_time(gpu_us: npt.NDArray[np.float64], gpu_args: list[Any]) -> str | None:
    """Why the GPU slices are malformed if one has an unflagged ``gpu_us`` below zero."""
    for i in np.flatnonzero(gpu_us < 0).tolist():
        flags = gpu_args[i].get("flags")
        if isinstance(flags, list) and NEGATIVE_GPU_OK.intersection(f for f in flags if isinstance(f, str)):
            continue
        scope = gpu_args[i].get("scope")
        return f"gpu_us holds a negative value ({gpu_us[i]:g}) for scope {scope}, which is not flagged"
    return None


def repeated_cpu_slice(
    thread: npt.NDArray[Any],
    name: npt.NDArray[Any],
    ts: npt.NDArray[np.float64],
    dur: npt.NDArray[np.float64],
    events: list[Any],
) -> str | None:
    """Why the CPU slices are malformed if one appears twice (every field equal)."""
    if len(ts) < 2:
        return None
    order = np.lexsort((dur, ts, name, thread))
    same = np.ones(len(order) - 1, bool)
    for col in (thread, name, ts, dur):
        c = col[order]
        same &= c[1:] == c[:-1]
    for k in np.flatnonzero(same).tolist():
        a, b = events[int(order[k])], events[int(order[k + 1])]
        try:
            repeated = a == b
        except RecursionError:  # args nested deeper than Python compares
            repeated = False
        if repeated:
            return (
                f"the cpu slice {str(a.get('name'))[:60]!r} at ts {a.get('ts')} appears twice "
                "(was the file concatenated or edited?)"
            )
    return None


def repeated_gpu_scope(rows: npt.NDArray[np.int64]) -> str | None:
    """Why the GPU slices are malformed if two name the same scope."""
    uniq, counts = np.unique(rows, return_counts=True)
    if len(uniq) == len(rows):
        return None
    return f"scope {int(uniq[counts > 1][0])} has two gpu slices (was the file concatenated or edited?)"
