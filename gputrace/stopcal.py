"""Calibration at stop: more rounds while none of the stop's samples is about as tight as the earlier
ones. A fit from the start's samples alone rests on a corner of the session (lavapipe under load:
the stop's windows 2 ms wide, left out of the fit, and the fit 1 ms off by the end).
"""

from __future__ import annotations

import numpy as np

from gputrace.backends.base import Backend
from gputrace.npstats import median
from gputrace.records import CalibrationSample
from gputrace.resolver import fit_clock

STOP_CALIBRATION_ROUNDS = 8
STOP_WINDOW_RATIO = 2.0  # "about as tight": within this many times the earlier median half-width


def stop_samples(backend: Backend, earlier: list[CalibrationSample]) -> list[CalibrationSample]:
    """The backend's first round at stop, and the tightest of up to ``STOP_CALIBRATION_ROUNDS``
    more (as many as the first gave) while it was not tight enough."""
    got = backend.calibrate()
    target = int(getattr(backend, "calibration_target_ns", 0) or 0)
    extra: list[CalibrationSample] = []
    for _ in range(STOP_CALIBRATION_ROUNDS):
        if fit_reaches(earlier + got + extra, got + extra, target):
            break
        extra = tightest(extra + backend.calibrate(), got)
    return got + extra


def tightest(pool: list[CalibrationSample], like: list[CalibrationSample]) -> list[CalibrationSample]:
    """Per device, the tightest of ``pool``, as many as ``like`` has (wide windows piled up would
    pass for the typical width)."""
    out = []
    for d in dict.fromkeys(x.device for x in like):
        mine = sorted((x for x in pool if x.device == d), key=lambda x: x.half_width_ns)
        out += sorted(mine[: sum(x.device == d for x in like)], key=lambda x: x.cpu_before_ns)
    return out


def fit_reaches(samples: list[CalibrationSample], latest: list[CalibrationSample], target_ns: int) -> bool:
    """Do ``latest`` (the last of ``samples``) hold, per device, one window about as tight as the
    earlier ones (``STOP_WINDOW_RATIO``) and the target (``target_ns``, 0: none), that the fit reaches?"""
    n_old = len(samples) - len(latest)
    for d in {x.device for x in latest}:
        mine = [x for x in latest if x.device == d]
        earlier = [x.half_width_ns for x in samples[:n_old] if x.device == d]
        best = min(x.half_width_ns for x in mine)
        if earlier and best > STOP_WINDOW_RATIO * max(float(median(np.array(earlier))), 1.0):
            return False
        if target_ns and best > target_ns:
            return False
        fit = fit_clock([x for x in samples if x.device == d])
        if fit is None or fit.last_cpu_ns < min(x.cpu_before_ns for x in mine):
            return False
    return True
