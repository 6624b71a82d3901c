"""The recorder and session with a fake clock: exact times, nesting, threads, exceptions, decorator."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gputrace
from gputrace.backends.base import Backend
from gputrace.clock import FakeClock
from gputrace.model import Flag
from gputrace.recorder import RICH, Recorded, ThreadBuffer


def cpu_session(clock: FakeClock | None = None, **kw: object) -> gputrace.session:
    return gputrace.session(backend="cpu", clock=clock or FakeClock(1_000, 10), quiet=True, **kw)


def test_nesting_exact_times() -> None:
    clock = FakeClock(start_ns=1_000, step_ns=10)
    with cpu_session(clock) as s:  # start reads the clock once (base = 1000)
        with gputrace.trace("outer", k=1):  # 1010
            with gputrace.trace("inner"):  # 1020
                pass  # inner ends 1030
            with gputrace.trace("inner"):  # 1040 .. 1050
                pass
        # outer ends 1060
    t = s.trace
    assert t is not None
    rows = [(sc.name, sc.depth, sc.parent, sc.cpu_start_ns, sc.cpu_end_ns) for sc in t]
    assert rows == [
        ("outer", 0, -1, 1010, 1060),
        ("inner", 1, 0, 1020, 1030),
        ("inner", 1, 0, 1040, 1050),
    ]
    assert t.scope(0).args == {"k": 1}
    assert t.header["start_ns"] == 1000
    flags = [sc.flag_names for sc in t]
    assert flags == [["cold"], ["cold"], []]


def test_same_object_reused_and_recursive() -> None:
    tr = gputrace.trace("rec")

    @tr
    def fact(n: int) -> int:
        return 1 if n <= 1 else n * fact(n - 1)

    with cpu_session() as s:
        assert fact(4) == 24
        with tr:
            pass
    t = s.trace
    assert t is not None
    assert [sc.depth for sc in t] == [0, 1, 2, 3, 0]
    assert [sc.parent for sc in t] == [-1, 0, 1, 2, -1]


def test_exception_closes_scope_and_propagates() -> None:
    class Boom(Exception):
        pass

    with cpu_session() as s:
        with pytest.raises(Boom) as info:
            with gputrace.trace("fails"):
                raise Boom("x")
        assert str(info.value) == "x"
        with gputrace.trace("after"):
            pass
    t = s.trace
    assert t is not None
    fails, after = t.find("fails")[0], t.find("after")[0]
    assert fails.flags & Flag.ERROR and fails.args == {"exception": "Boom"}
    assert fails.cpu_end_ns > fails.cpu_start_ns
    assert after.depth == 0  # the stack was unwound correctly


def test_decorator_keeps_function_identity_and_closes_on_raise() -> None:
    @gputrace.trace("work")
    def work(x: int) -> int:
        """doc"""
        if x < 0:
            raise ValueError("neg")
        return x + 1

    assert work.__name__ == "work" and work.__doc__ == "doc"
    with cpu_session() as s:
        assert work(1) == 2
        with pytest.raises(ValueError):
            work(-1)
    t = s.trace
    assert t is not None
    assert [sc.args.get("exception") for sc in t.find("work")] == [None, "ValueError"]


def test_async_decorator() -> None:
    @gputrace.trace("coro")
    async def coro(x: int) -> int:
        await asyncio.sleep(0)
        return x

    with cpu_session() as s:
        assert asyncio.run(coro(3)) == 3
    t = s.trace
    assert t is not None
    assert len(t.find("coro")) == 1


def test_interleaved_scopes_on_one_thread_are_kept() -> None:
    a, b = gputrace.trace("a"), gputrace.trace("b")
    with cpu_session(FakeClock(0, 1)) as s:
        a.__enter__()  # 1
        b.__enter__()  # 2
        a.__exit__(None, None, None)  # 3: a leaves before b (interleaved coroutines do this)
        b.__exit__(None, None, None)  # 4
    t = s.trace
    assert t is not None
    assert [(sc.name, sc.cpu_start_ns, sc.cpu_end_ns) for sc in t] == [("a", 1, 3), ("b", 2, 4)]


def test_no_session_is_a_noop() -> None:
    tr = gputrace.trace("idle")
    with tr:
        pass
    gputrace.mark("nothing")
    gputrace.sync()
    with cpu_session() as s:
        pass
    t = s.trace
    assert t is not None and len(t) == 0 and t.marks == []


def test_scope_entered_before_session_is_ignored_cleanly() -> None:
    tr = gputrace.trace("early")
    tr.__enter__()
    with cpu_session() as s:
        tr.__exit__(None, None, None)
    assert s.trace is not None and len(s.trace) == 0


def test_unclosed_scope_is_kept_and_flagged() -> None:
    clock = FakeClock(0, 10)
    s = cpu_session(clock).start()
    gputrace.trace("open").__enter__()  # 10
    t = s.stop()  # stop reads the clock: 20 (sync mark) is not taken on cpu; stop_ns = 20
    (sc,) = list(t)
    assert sc.name == "open" and sc.args == {"unclosed": True}
    assert sc.flags & Flag.DEGRADED
    assert sc.cpu_start_ns == 10 and sc.cpu_end_ns == 20


def test_threads_nothing_lost_and_nesting_per_thread() -> None:
    n_threads, n_scopes = 8, 10_000
    barrier = threading.Barrier(n_threads)
    outer, inner = gputrace.trace("outer"), gputrace.trace("inner")

    def worker() -> None:
        barrier.wait()
        for _ in range(n_scopes // 2):
            with outer:
                with inner:
                    pass

    with gputrace.session(backend="cpu", quiet=True) as s:
        threads = [threading.Thread(target=worker, name=f"w{i}") for i in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    t = s.trace
    assert t is not None
    assert len(t) == n_threads * n_scopes
    sc = t.scopes
    for ti, info in enumerate(t.threads):
        rows = np.flatnonzero(sc.thread == ti)
        assert len(rows) == n_scopes, info
        names = [t.names[i] for i in sc.name[rows]]
        assert names == ["outer", "inner"] * (n_scopes // 2)
        assert (sc.depth[rows] == np.tile([0, 1], n_scopes // 2)).all()
        # each inner's parent is the outer just before it, on the same thread
        assert (sc.parent[rows[1::2]] == rows[0::2]).all()
    assert sorted(th.name for th in t.threads) == sorted(f"w{i}" for i in range(n_threads))


def test_mark_and_sync_are_instants() -> None:
    clock = FakeClock(0, 5)
    with cpu_session(clock) as s:
        gputrace.mark("here", step=2)
        gputrace.sync()
    t = s.trace
    assert t is not None
    assert [(m.name, m.kind, m.args) for m in t.marks] == [
        ("here", "mark", {"step": 2}),
        ("sync", "sync", {}),
    ]


def test_second_session_is_refused() -> None:
    with cpu_session():
        with pytest.raises(gputrace.GputraceError, match="already active"):
            cpu_session().start()


def test_unknown_backend_is_one_sentence() -> None:
    with pytest.raises(gputrace.GputraceError) as info:
        gputrace.session(backend="nope").start()
    assert "unknown backend 'nope'" in str(info.value) and str(info.value).count(".") == 1


class Broken(Backend):
    name = "broken"
    timed = True

    def begin(self, name: str, stream: object, cpu_ns: int) -> int:
        if name == "bad-begin":
            raise RuntimeError("driver says no")
        return 7

    def end(self, token: int) -> None:
        raise OSError("lost")


def test_internal_errors_never_reach_user_code_and_warn_once() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gputrace.session(backend=Broken(FakeClock()), clock=FakeClock(), quiet=True) as s:
            for _ in range(3):
                with gputrace.trace("bad-begin"):
                    pass
                with gputrace.trace("bad-end"):
                    pass
    msgs = [str(w.message) for w in caught if issubclass(w.category, gputrace.GputraceWarning)]
    assert len(msgs) == 1, msgs  # one warning, not one per scope or per kind of failure
    t = s.trace
    assert t is not None and len(t.header["problems"]) == 2  # every kind is listed in the file
    assert any("driver says no" in m for m in t.header["problems"])
    assert any("lost" in m for m in t.header["problems"])
    assert t is not None and len(t) == 6
    assert all(sc.flags & Flag.DEGRADED for sc in t)


def test_unwritable_path_warns_and_keeps_trace(tmp_path: object) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cpu_session(path="/nonexistent-dir/x/t.json") as s:
            with gputrace.trace("kept"):
                pass
    assert s.trace is not None and len(s.trace) == 1 and s.written is None
    assert any("could not write the trace" in str(w.message) for w in caught)


def test_import_does_not_import_gpu_libraries() -> None:
    code = "import sys, gputrace; print('cupy' in sys.modules, 'wgpu' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_version_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gputrace", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"gputrace, version {gputrace.__version__}"


def test_session_writes_the_trace_when_the_program_raises(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    with pytest.raises(ZeroDivisionError):
        with cpu_session(path=path):
            with gputrace.trace("before"):
                pass
            with gputrace.trace("fails"):
                _ = 1 / 0
    t = gputrace.load(path)
    assert [sc.name for sc in t] == ["before", "fails"]
    assert t.find("fails")[0].args == {"exception": "ZeroDivisionError"}


def test_sessions_can_follow_each_other() -> None:
    for n in (1, 2):
        with cpu_session() as s:
            for _ in range(n):
                with gputrace.trace("x"):
                    pass
        assert s.trace is not None and len(s.trace) == n


# What a take hands the stream's writer (``Recorded``) -----------------------------------------------
def _take(program: Any, clock: FakeClock) -> Any:
    """Run ``program`` under a recorder of its own (cpu backend) and take what it recorded: the one
    track's ``Recorded``."""
    from gputrace.backends.cpu import CpuBackend
    from gputrace.recorder import Recorder

    rec = Recorder(clock, CpuBackend(clock))
    rec.activate()
    try:
        program()
    finally:
        rec.deactivate()
    (one,) = rec.take_recorded()
    return one


def _names_times(r: Any) -> list[tuple[str, int, int]]:
    raw = r.raw()
    return [(n, int(t[0]), int(t[1])) for n, t in zip(raw.names, raw.times, strict=True)]


def _a_b_then_c() -> None:
    with gputrace.trace("a"):  # 1000 .. 1030
        with gputrace.trace("b"):  # 1010 .. 1020
            pass
    with gputrace.trace("c"):  # 1040 .. 1050
        pass


def test_a_take_settles_against_the_gpu_horizon() -> None:
    """With a horizon (CUPTI: every operation launched before it has arrived) a scope that ended
    after it waits; a scope still waiting is written with the next take, or at a sync
    (``complete``), after that take's own scopes; without a horizon an untimed scope never waits."""
    clock = FakeClock(1_000, 10)
    took = _take(_a_b_then_c, clock)
    assert took.scopes() == 3
    assert _names_times(took) == [("b", 1010, 1020), ("a", 1000, 1030), ("c", 1040, 1050)]

    ready, waiting = _take(_a_b_then_c, FakeClock(1_000, 10)).settle(None, horizon=1045)
    assert _names_times(ready) == [("b", 1010, 1020), ("a", 1000, 1030)]
    assert waiting is not None and _names_times(waiting) == [("c", 1040, 1050)]

    def d() -> None:
        with gputrace.trace("d"):
            pass

    later = _take(d, FakeClock(2_000, 10))
    ready, none = later.settle(waiting, horizon=None, complete=True)
    assert none is None and _names_times(ready) == [("d", 2000, 2010), ("c", 1040, 1050)]

    ready, none = _take(_a_b_then_c, FakeClock(1_000, 10)).settle(None, horizon=None)
    assert none is None and ready.scopes() == 3  # (no GPU token: nothing to wait for)


def test_a_scope_waiting_for_the_horizon_keeps_its_children_with_it() -> None:
    """A parent that ended after the horizon waits, and so does every scope that started inside
    it, though it ended before: a chunk resolves the spans of its own scopes only, so a parent's
    GPU span must be written with its children's work."""
    ready, waiting = _take(_a_b_then_c, FakeClock(1_000, 10)).settle(None, horizon=1025)
    assert ready.scopes() == 0 and waiting is not None
    assert sorted(n for n, _, _ in _names_times(waiting)) == ["a", "b", "c"]


def test_scopes_with_a_gpu_span_settle_in_order() -> None:
    """Scopes in the rich layout (a GPU token, args) settle as plain ones do. Without a horizon
    those with a token wait and the others are ready, each in order, wherever they stand; with
    one, those that ended after it wait, with every scope that started inside them."""
    buf = ThreadBuffer(None, "t", 1)
    rich: list[Any] = []
    for name, start, end, token in [("b", 5, 8, 1), ("a", 0, 10, 0), ("c", 20, 30, 2), ("d", 40, 50, 0)]:
        rich.extend((name, start, end, token, 0, None))

    def names(r: Any) -> list[str]:
        return [] if r is None else list(r.rich[0::RICH])

    ready, waiting = Recorded(buf, [], list(rich), []).settle(None, horizon=None)
    assert (names(ready), names(waiting)) == (["a", "d"], ["b", "c"])
    ready, waiting = Recorded(buf, [], list(rich), []).settle(None, horizon=25)
    assert (names(ready), names(waiting)) == (["b", "a"], ["c", "d"])
    ready, waiting = Recorded(buf, [], list(rich), []).settle(None, horizon=9)
    assert (names(ready), names(waiting)) == ([], ["b", "a", "c", "d"])  # (b ended before 9, inside a)


def test_a_take_cut_into_pieces_keeps_every_scope_once() -> None:
    took = _take(_a_b_then_c, FakeClock(1_000, 10))
    pieces = took.pieces(2)
    assert [p.scopes() for p in pieces] == [2, 1]
    assert [x for p in pieces for x in _names_times(p)] == _names_times(took)
