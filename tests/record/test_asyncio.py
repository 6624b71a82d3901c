"""Scopes in asyncio tasks and generators: they nest per task, never across tasks, and a suspended
generator's open scope does not adopt the scopes that run while it waits."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import gputrace
from gputrace.model import Flag, Trace
from tests import perfetto_rules


def _no_partial_overlaps(t: Trace) -> None:
    """On each track, any two scopes nest or follow each other."""
    by_thread: dict[int, list[tuple[int, int]]] = {}
    for sc in t:
        by_thread.setdefault(sc.thread.tid, []).append((sc.cpu_start_ns, sc.cpu_end_ns))
    for spans in by_thread.values():
        spans.sort(key=lambda x: (x[0], -x[1]))
        stack: list[int] = []
        for st, en in spans:
            while stack and stack[-1] <= st:
                stack.pop()
            assert not stack or en <= stack[-1], "partially overlapping scopes on one track"
            stack.append(en)


def test_concurrent_tasks_nest_per_task_on_their_own_tracks(tmp_path: Path) -> None:
    async def job(i: int) -> int:
        with gputrace.trace("job", i=i):
            await asyncio.sleep(0.001)
            with gputrace.trace("inner"):
                await asyncio.sleep(0)
        return i

    async def main() -> list[int]:
        return list(await asyncio.gather(*(job(i) for i in range(100))))

    out = tmp_path / "tasks.json"
    with gputrace.session(out, backend="cpu", quiet=True) as s:
        assert asyncio.run(main()) == list(range(100))
    t = s.trace
    assert t is not None
    jobs, inners = t.find("job"), t.find("inner")
    assert len(jobs) == 100 and len(inners) == 100
    assert all(j.parent == -1 and j.depth == 0 for j in jobs)  # no job adopts another task's
    for inner in inners:  # each inner scope sits in its own task's job
        assert inner.parent >= 0 and t.scope(inner.parent).name == "job"
        assert t.scope(inner.parent).thread == inner.thread
    assert len({j.thread.tid for j in jobs}) == 100
    names = {j.thread.name for j in jobs}
    assert all(n.startswith("MainThread · Task-") for n in names)
    _no_partial_overlaps(t)
    doc = perfetto_rules.read(out)
    assert not any("(overlap" in str(e.get("args", {}).get("name", "")) for e in doc["traceEvents"])
    back = gputrace.load(out)
    assert sorted(sc.depth for sc in back.find("job")) == [0] * 100


def test_a_task_created_inside_a_scope_does_not_write_into_its_parent_s_track() -> None:
    async def child() -> None:
        with gputrace.trace("child"):
            await asyncio.sleep(0.002)

    async def main() -> None:
        with gputrace.trace("parent"):
            task = asyncio.create_task(child())
            await asyncio.sleep(0)
            with gputrace.trace("parent-inner"):
                await asyncio.sleep(0.001)
        await task

    with gputrace.session(backend="cpu", quiet=True) as s:
        asyncio.run(main())
    t = s.trace
    assert t is not None
    (parent,), (inner,), (child_sc,) = t.find("parent"), t.find("parent-inner"), t.find("child")
    assert inner.parent == parent.index
    assert child_sc.thread != parent.thread and child_sc.parent == -1
    _no_partial_overlaps(t)


def test_a_suspended_generator_does_not_adopt_later_scopes() -> None:
    def numbers() -> Iterator[int]:
        with gputrace.trace("gen"):
            yield from range(3)

    with gputrace.session(backend="cpu", quiet=True) as s:
        g = numbers()
        next(g)
        with gputrace.trace("later"):
            pass
        for _ in g:
            with gputrace.trace("consumer"):
                pass
    t = s.trace
    assert t is not None
    (gen,), (later,) = t.find("gen"), t.find("later")
    assert later.parent == -1 and later.depth == 0
    assert all(c.parent == -1 for c in t.find("consumer"))
    assert not gen.flags & Flag.ERROR and "unclosed" not in gen.args
    assert gen.thread.name.endswith("numbers (suspended)")
    _no_partial_overlaps(t)


def test_a_generator_closed_early_is_not_flagged_as_an_exception() -> None:
    def numbers() -> Iterator[int]:
        with gputrace.trace("gen"):
            yield from range(10)

    with gputrace.session(backend="cpu", quiet=True) as s:
        for i in numbers():
            if i == 2:
                break
    t = s.trace
    assert t is not None
    (gen,) = t.find("gen")
    assert not gen.flags & Flag.ERROR and "exception" not in gen.args


def test_async_generators_and_scopes_around_them() -> None:
    async def agen():  # type: ignore[no-untyped-def]
        for i in range(3):
            with gputrace.trace("produce"):
                await asyncio.sleep(0)
                yield i

    async def main() -> list[int]:
        got = []
        with gputrace.trace("main"):
            async for x in agen():
                with gputrace.trace("use"):
                    got.append(x)
        return got

    with gputrace.session(backend="cpu", quiet=True) as s:
        assert asyncio.run(main()) == [0, 1, 2]
    t = s.trace
    assert t is not None
    (main_sc,) = t.find("main")
    for use in t.find("use"):  # a consumer scope belongs to main, not to the suspended producer
        assert use.parent == main_sc.index
    assert len(t.find("produce")) == 3
    _no_partial_overlaps(t)


def test_scopes_outside_asyncio_stay_on_the_thread_track() -> None:
    with gputrace.session(backend="cpu", quiet=True) as s:
        with gputrace.trace("a"), gputrace.trace("b"):
            pass
    t = s.trace
    assert t is not None
    assert [(sc.name, sc.depth) for sc in t] == [("a", 0), ("b", 1)]
    assert [th.name for th in t.threads] == ["MainThread"]


@pytest.mark.wgpu
def test_wgpu_passes_belong_to_the_scope_of_their_own_task() -> None:
    wgpu = pytest.importorskip("wgpu", reason="wgpu-py is not installed")
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:
        pytest.skip(f"no WebGPU adapter here ({exc})")
    if adapter is None or "timestamp-query" not in adapter.features:
        pytest.skip("no WebGPU adapter with timestamp-query here; install mesa-vulkan-drivers")
    device = adapter.request_device_sync(required_features=["timestamp-query"])

    async def job(i: int) -> None:
        with gputrace.trace(f"job{i}"):
            await asyncio.sleep(0.001)  # the other tasks open their scopes meanwhile
            enc = device.create_command_encoder()
            enc.begin_compute_pass(label=f"pass{i}").end()
            device.queue.submit([enc.finish()])
            await asyncio.sleep(0.001)

    async def main() -> None:
        await asyncio.gather(*(job(i) for i in range(3)))

    from gputrace.backends.wgpu import uninstrument

    try:
        with gputrace.session(backend="wgpu", backend_options={"device": device}, quiet=True) as s:
            asyncio.run(main())
    finally:
        uninstrument(device)
    t = s.trace
    assert t is not None
    owner = {
        t.names[int(lab)]: t.scope(int(sc)).name for sc, lab in zip(t.spans.scope, t.spans.label, strict=True)
    }
    assert owner == {"pass0": "job0", "pass1": "job1", "pass2": "job2"}
