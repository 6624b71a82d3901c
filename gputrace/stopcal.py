"""Calibration at stop: samples until the clock fit rests on the stop's too.

A fit from the start's samples alone rests on a corner of the session: seen on lavapipe under
load, the stop's windows 2 ms wide (the driver's worker thread woken late), left out of the fit
as too wide, and the fit 1 ms off by the end. So at stop, while none of the stop's samples is
about as tight as the session's earlier ones (and within the backend's
``calibration_target_ns``), more rounds are taken, ``STOP_CALIBRATION_ROUNDS`` at most, keeping
the tightest. A fit still short of the stop says so in the header (``ClockFit.note``).
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
    """The stop's samples: the backend's first round, and the tightest of up to
    ``STOP_CALIBRATION_ROUNDS`` more (as many as the first gave) where it was not tight enough."""
    got = backend.calibrate()
    target = int(getattr(backend, "calibration_target_ns", 0) or 0)
    extra: list[CalibrationSample] = []
    for _ in range(STOP_CALIBRATION_ROUNDS):
        if fit_reaches(earlier + got + extra, got + extra, target):
            break
        extra = tightest(extra + backend.calibrate(), got)
    return got + extra


def tightest(pool: list[CalibrationSample], like: list[CalibrationSample]) -> list[CalibrationSample]:
    """Per device, the tightest of ``pool``, as many as ``like`` has: the stop's extra rounds
    add their best windows, they do not pile up wide ones (which in numbers would pass for the
    session's typical width)."""
    out = []
    for d in dict.fromkeys(x.device for x in like):
        mine = sorted((x for x in pool if x.device == d), key=lambda x: x.half_width_ns)
        out += sorted(mine[: sum(x.device == d for x in like)], key=lambda x: x.cpu_before_ns)
    return out


def fit_reaches(
    samples: list[CalibrationSample], latest: list[CalibrationSample], target_ns: int = 0
) -> bool:
    """Do ``latest`` (the stop's samples, the last of ``samples``) hold, for every device, one
    about as tight as that device's earlier ones (within ``STOP_WINDOW_RATIO`` of their median
    half-width) and within the backend's calibration target (``target_ns``, 0: none), that its
    clock fit rests on?"""
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
