"""A clock fit that cannot rest on a corner of the session (fake GPU, fake clock: exact).

The scenario seen on lavapipe under load: the start's calibration windows are tight, the stop's
are 2 ms wide (the GPU's worker thread woke late), so a fit that drops them as too wide rests on
the first instants of a 2.3 s session. The truth here is offset 0, drift 0.
"""

from __future__ import annotations

import numpy as np
import pytest

import gputrace
from gputrace.backends.fake import FakeBackend
from gputrace.clock import FakeClock
from gputrace.resolver import MIN_FIT_STRETCH, fit_clock
from gputrace.stopcal import STOP_CALIBRATION_ROUNDS

TIGHT = (25_000, 60_000)  # the GPU read 25 µs after the first clock read, 60 µs before the second
WIDE = (2_000_000, 60_000)  # a worker thread woken 2 ms late
SAMPLES = 4  # per calibration


def record(windows, delay_ns: int = 50_000, scopes: int = 100):  # type: ignore[no-untyped-def]
    clock = FakeClock(start_ns=10**9, step_ns=1_000)
    backend = FakeBackend(
        clock, samples_per_calibration=SAMPLES, windows=windows, script=lambda name, i: (delay_ns, 20_000)
    )
    with gputrace.session(backend=backend, clock=clock, quiet=True) as s:
        for _ in range(scopes):
            with gputrace.trace("frame"):
                pass
            clock.advance(23_000_000)
    assert s.trace is not None
    return s.trace, backend


def errors(trace, backend):  # type: ignore[no-untyped-def]
    """Per scope: aligned GPU start − true GPU start (ns), and the stated uncertainty."""
    s = trace.scopes
    true_start = np.array([backend.truth[tok][1] for tok in sorted(backend.truth)])
    return s.gpu_start_ns - true_start, s.uncertainty_ns


def test_stop_windows_always_wide_the_fit_stays_on_its_samples_and_says_it_is_weak() -> None:
    trace, backend = record(lambda k: TIGHT if k < SAMPLES else WIDE)
    (fit,) = trace.clock_fits.values()
    # every stop round was wide: the session tried them all
    assert len(backend.truth_samples) == SAMPLES * (2 + STOP_CALIBRATION_ROUNDS)
    assert fit.samples == SAMPLES
    # the start's windows say offset ∈ [−25 µs, +61 µs]: centred on its own samples, not moved
    # 1 ms by the stop's wide windows (as it was)
    assert fit.offset_ns == 18_000 and fit.slope == 1.0
    assert "rests on 4 calibration samples" in fit.note and "too wide" in fit.note
    assert trace.header["clock"][0]["note"] == fit.note
    err, unc = errors(trace, backend)
    assert (err == 18_000).all()
    assert (np.abs(err) <= unc).all()  # honest: within its stated uncertainty everywhere
    # and the uncertainty grows away from the start's samples, as an assumed drift does
    assert unc[0] < 50_000 < 100_000 < unc[-1]


def test_stop_retries_until_its_windows_are_tight_and_the_fit_covers_the_session() -> None:
    rounds_wide = 3
    trace, backend = record(lambda k: WIDE if SAMPLES <= k < SAMPLES * (1 + rounds_wide) else TIGHT)
    (fit,) = trace.clock_fits.values()
    assert len(backend.truth_samples) == SAMPLES * (1 + rounds_wide + 1)  # start, 3 wide, 1 tight
    assert fit.samples == 2 * SAMPLES and fit.note == ""  # the start's and the stop's tight ones
    assert fit.last_cpu_ns - fit.first_cpu_ns > MIN_FIT_STRETCH * (
        trace.header["end_ns"] - trace.header["start_ns"]
    )
    err, unc = errors(trace, backend)
    assert (err == 18_000).all() and (unc < 50_000).all()


def test_start_before_submit_is_judged_against_the_honest_uncertainty() -> None:
    # the GPU "starts" 300 µs before the submission: impossible, and every such scope is flagged,
    # although the stop's windows were wide (before, the fit moved by them hid this under ±1 ms)
    trace, _ = record(lambda k: TIGHT if k < SAMPLES else WIDE, delay_ns=-300_000)
    flagged = trace.scopes.flags & int(gputrace.Flag.START_BEFORE_SUBMIT)
    assert np.count_nonzero(flagged) == len(trace)


def test_an_honest_fit_has_no_note() -> None:
    trace, _ = record(lambda k: TIGHT)
    (fit,) = trace.clock_fits.values()
    assert fit.note == "" and "note" not in trace.header["clock"][0]
    assert fit.offset_ns == 18_000


@pytest.mark.parametrize("n", [1])
def test_one_sample_is_a_weak_fit(n: int) -> None:
    from gputrace.backends.base import CalibrationSample
    from gputrace.resolver import RawRecording, resolve

    samples = [CalibrationSample(1_000, 1_500, 2_000, 0)] * n
    trace = resolve(RawRecording(header={"start_ns": 0, "end_ns": 10**9}, threads=[], samples=samples))
    (fit,) = trace.clock_fits.values()
    assert "rests on 1 calibration sample" in fit.note
    assert fit_clock(samples) is not None


def test_summarize_prints_why_a_fit_is_weak(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys

    from gputrace import exporters

    trace, _ = record(lambda k: TIGHT if k < SAMPLES else WIDE)
    path = exporters.write(trace, tmp_path / "weak.json")
    out = subprocess.run(
        [sys.executable, "-m", "gputrace", "summarize", str(path)], capture_output=True, text=True, check=True
    ).stdout
    section = out[out.index("Clock alignment") :].splitlines()[1:4]
    assert section == [
        "  GPU 0: offset 18.0 µs, drift 0.00 ppm, residual 0 ns, uncertainty ±43.0 µs from 4 samples",
        "  GPU 0: WARNING: the clock fit rests on 4 calibration samples from 0.347 ms of the 2375 ms it "
        "should cover (the other samples' windows were too wide): its uncertainty grows away from them.",
        "  GPU times are placed on the CPU clock within ±157 µs.",
    ]
    honest, _ = record(lambda k: TIGHT)
    out = subprocess.run(
        [sys.executable, "-m", "gputrace", "summarize", str(exporters.write(honest, tmp_path / "ok.json"))],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "WARNING: the clock fit" not in out
