"""CUDA events timing, read back without a GPU: a stand-in CuPy (``tests/cupy_standin.py``) whose
event records land at GPU times the test chooses, so every span read has an exact answer.

What is checked: spans read in bulk (every scope of a read finished, one device) are the spans
the scope-by-scope read gives, and the scripted ones; scopes whose events the GPU has not reached
wait for a later read, stream by stream; a failed elapsed-time read costs its scope only; a
session writes them all.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import gputrace
from gputrace.backends import cuda_events
from gputrace.backends.cuda_events import CudaEventsBackend
from gputrace.clock import FakeClock
from gputrace.records import RawSpan
from tests.cupy_standin import StandIn, install

SCOPES = 700


def _record(
    gpu: StandIn,
    backend: CudaEventsBackend,
    clock: FakeClock,
    n: int,
    streams: tuple[int, ...] = (0,),
    gap_ns: int = 1_000,
) -> list[tuple[int, int, int]]:
    """``n`` scopes, round robin over ``streams``: scope i runs 500 + i ns on the GPU, ``gap_ns``
    (on both clocks) after the previous one; returns each token with its stream and scripted
    duration."""
    made = []
    for i in range(n):
        gpu.advance(gap_ns)
        clock.advance(gap_ns)
        stream = streams[i % len(streams)]
        token = backend.begin("s", stream, clock())
        gpu.advance(500 + i)
        backend.end(token)
        made.append((token, stream, 500 + i))
    return made


def _spans(monkeypatch: pytest.MonkeyPatch, *, bulk: bool) -> list[RawSpan]:
    gpu = install(monkeypatch)
    if not bulk:
        monkeypatch.setattr(CudaEventsBackend, "_place_all", lambda self, *a: None)
    clock = FakeClock(1_000_000_000, 1_000)
    # 3.5 s of scopes, an anchor every 0.1 s: each scope is placed from the nearest of 35, whose
    # float32 elapsed times are exact to 8 ns (one 3 s away would be to 240 ns)
    backend = CudaEventsBackend(clock, anchor_every_ns=100_000_000)
    backend._harvest_at = 10**9  # (every scope read by the one collect below)
    made = _record(gpu, backend, clock, SCOPES, gap_ns=5_000_000)
    spans = backend.collect().spans
    assert [(s.token, s.gpu_end_ns - s.gpu_start_ns) for s in spans] == [(t, d) for t, _, d in made]
    return spans


def test_spans_read_in_bulk_are_the_scope_by_scope_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    bulk = _spans(monkeypatch, bulk=True)
    monkeypatch.undo()
    loop = _spans(monkeypatch, bulk=False)
    assert bulk == loop
    assert all(type(s) is RawSpan and s.label == "" for s in bulk)
    # 5 ms of GPU time between scopes, as scripted, to within the nearest anchor's float32
    starts = [s.gpu_start_ns for s in bulk]
    steps = [b - a - (500 + i + 5_000_000) for i, (a, b) in enumerate(itertools.pairwise(starts))]
    assert max(map(abs, steps)) <= 16


def test_scopes_the_gpu_has_not_reached_wait_for_a_later_read(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = install(monkeypatch)
    clock = FakeClock(1_000_000_000, 1_000)
    backend = CudaEventsBackend(clock)
    backend._harvest_at = 10**9
    made = _record(gpu, backend, clock, 40, streams=(5, 9))
    last9 = backend._ended[-1][3]  # the newest end event, on stream 9
    gpu.pending.add(last9)
    first = backend.collect_background()[0].spans
    assert [s.token for s in first] == [t for t, _, _ in made[:-1]]  # stream 5 whole, stream 9 but its last
    gpu.pending.clear()
    second = backend.collect_background()[0].spans
    assert [(s.token, s.gpu_end_ns - s.gpu_start_ns) for s in second] == [(made[-1][0], made[-1][2])]
    assert len({s.queue for s in first}) == 2


def test_a_failed_read_costs_its_scope_only(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = install(monkeypatch)
    clock = FakeClock(1_000_000_000, 1_000)
    backend = CudaEventsBackend(clock)
    backend._harvest_at = 10**9
    made = _record(gpu, backend, clock, 20)
    gpu.broken.add(backend._ended[7][3])
    got = backend.collect()
    assert [s.token for s in got.spans] == [t for k, (t, _, _) in enumerate(made) if k != 7]
    assert list(got.degraded) == [made[7][0]] and "reading its CUDA events failed" in got.degraded[made[7][0]]


def test_harvests_at_scope_exits_keep_the_pool_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a sync, finished scopes are read at scope exits and their events reused."""
    gpu = install(monkeypatch)
    clock = FakeClock(1_000_000_000, 1_000)
    backend = CudaEventsBackend(clock)
    made = _record(gpu, backend, clock, 20 * cuda_events.HARVEST_EVERY)
    dev = backend._devs[0]
    assert dev.created < 2 * cuda_events.HARVEST_EVERY + 2 * cuda_events.HARVEST_BATCH + 64
    spans = backend.collect().spans
    assert sorted((s.token, s.gpu_end_ns - s.gpu_start_ns) for s in spans) == [(t, d) for t, _, d in made]


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_an_events_session_writes_every_scripted_span(
    writer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu = install(monkeypatch)
    path = tmp_path / "run.json"
    with gputrace.session(
        path, backend="cuda", backend_options={"timing": "events"}, writer=writer, quiet=True
    ):
        for i in range(300):
            gpu.advance(1_000)
            with gputrace.trace("step", i=i):
                gpu.advance(2_000 + i)
            if i % 100 == 99:
                gputrace.sync()
    t = gputrace.load(path)
    assert t.header["backend_info"]["timing"] == "events"
    assert (t.scopes.gpu_end_ns - t.scopes.gpu_start_ns).tolist() == [2_000 + i for i in range(300)]
