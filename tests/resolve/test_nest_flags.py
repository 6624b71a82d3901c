"""Nesting and per-scope flags computed vectorised, against the plain stack walks they replace
(written out here as the reference), on random scopes with fixed seeds: same results, exactly."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest

from gputrace.flags import anomaly_report, flag_overlaps
from gputrace.model import (
    ANOMALY_FLAGS,
    FLAG_NAMES,
    NO_TIME,
    Flag,
    ScopeTable,
    SpanTable,
    Trace,
    flag_names,
    nest,
)
from gputrace.resolver import _intern_all


def reference_nest(s: ScopeTable) -> tuple[list[int], list[int]]:
    """Per thread, over scopes in row order: pop every scope ended by this one's start."""
    parent, depth = [-1] * len(s), [0] * len(s)
    stacks: dict[int, list[int]] = defaultdict(list)
    ends = s.cpu_end_ns.tolist()
    for i, (st, t) in enumerate(zip(s.cpu_start_ns.tolist(), s.thread.tolist(), strict=True)):
        stack = stacks[t]
        while stack and ends[stack[-1]] <= st:
            stack.pop()
        if stack:
            parent[i], depth[i] = stack[-1], len(stack)
        stack.append(i)
    return parent, depth


def reference_overlaps(s: ScopeTable, g: np.ndarray) -> np.ndarray:
    """Per queue in (start, −end) order: a span ending after the enclosing open one overlaps it."""
    flags = np.zeros(len(s), np.int64)
    q = s.queue[g]
    order = np.lexsort((-s.gpu_end_ns[g], s.gpu_start_ns[g], q))
    st, en = s.gpu_start_ns.tolist(), s.gpu_end_ns.tolist()
    stack: list[int] = []
    cur = None
    for row, qq in zip(g[order].tolist(), q[order].tolist(), strict=True):
        if qq != cur:
            stack, cur = [], qq
        while stack and en[stack[-1]] <= st[row]:
            stack.pop()
        if stack and en[row] > en[stack[-1]]:
            flags[row] |= int(Flag.OVERLAP)
            flags[stack[-1]] |= int(Flag.OVERLAP)
            continue
        stack.append(row)
    return flags


def scopes(seed: int, shape: str) -> ScopeTable:
    """Random scopes in the resolver's row order (start, thread, −end) in one of a few shapes."""
    rnd = random.Random(seed)
    n = rnd.randint(1, 400)
    threads = rnd.randint(1, 4)
    rows: list[tuple[int, int, int]] = []
    t = 0
    for _ in range(n):
        th = rnd.randrange(threads)
        if shape == "random":  # partial overlaps too (asyncio tasks share a thread)
            a = rnd.randint(0, 2_000)
            rows.append((a, a + rnd.choice([0, 1, rnd.randint(0, 60), rnd.randint(0, 900)]), th))
        elif shape == "flat":
            t += rnd.randint(0, 30)
            rows.append((t, t + rnd.randint(0, 30), th))
        else:  # "nested": steps holding children, some siblings, a few touching ends
            t += rnd.randint(1, 50)
            step = (t, t + 40, th)
            rows.append(step)
            c = t
            for _ in range(rnd.choice([0, 1, 1, 2, 3, 12])):
                c += rnd.randint(0, 3)
                end = min(c + rnd.randint(0, 5), step[1])
                rows.append((c, end, th))
                c = end
            if rnd.random() < 0.2:
                rows.append((0, 10**9, th))  # a scope around everything
    rows.sort(key=lambda r: (r[0], r[2], -r[1]))
    s = ScopeTable.empty(len(rows))
    s.cpu_start_ns = np.array([r[0] for r in rows], np.int64)
    s.cpu_end_ns = np.array([r[1] for r in rows], np.int64)
    s.thread = np.array([r[2] for r in rows], np.int32)
    return s


@pytest.mark.parametrize("shape", ["flat", "nested", "random"])
@pytest.mark.parametrize("seed", range(25))
def test_nest_equals_the_stack_walk(seed: int, shape: str) -> None:
    s = scopes(seed, shape)
    nest(s)
    parent, depth = reference_nest(s)
    assert s.parent.dtype == np.int64 and s.depth.dtype == np.int32
    assert s.parent.tolist() == parent and s.depth.tolist() == depth


def test_nest_of_rows_out_of_start_order_and_of_nothing() -> None:
    s = ScopeTable.empty(3)
    s.cpu_start_ns = np.array([5, 0, 1], np.int64)  # a loaded file need not be in start order
    s.cpu_end_ns = np.array([6, 10, 2], np.int64)
    nest(s)
    assert (s.parent.tolist(), s.depth.tolist()) == reference_nest(s)
    empty = ScopeTable.empty(0)
    nest(empty)
    assert len(empty.parent) == 0 and len(empty.depth) == 0


@pytest.mark.parametrize("shape", ["flat", "nested", "random"])
@pytest.mark.parametrize("seed", range(25))
def test_overlap_flags_equal_the_stack_walk(seed: int, shape: str) -> None:
    s = scopes(seed, shape)  # CPU windows reused as GPU spans, threads as queues
    s.gpu_start_ns, s.gpu_end_ns, s.queue = s.cpu_start_ns, s.cpu_end_ns, s.thread
    rnd = random.Random(seed)
    g = np.array(sorted(rnd.sample(range(len(s)), rnd.randint(0, len(s)))), np.int64)
    flags = np.zeros(len(s), np.int64)
    flag_overlaps(s, g, flags)
    assert flags.tolist() == reference_overlaps(s, g).tolist()


def test_flag_names_for_every_combination() -> None:
    bits = [(int(b), n) for b, n in FLAG_NAMES.items()]
    for value in range(1 << len(bits)):
        want = [n for b, n in bits if value & b]
        assert flag_names(value) == want
        assert flag_names(np.uint32(value)) == want
        assert flag_names(value | (1 << 20)) == want  # bits no flag uses are ignored
    names = flag_names(3)
    names.append("mine")  # a caller's list is its own
    assert flag_names(3) == ["cold", "empty_gpu_span"]


def test_anomaly_report_items_hold_each_scopes_numbers() -> None:
    s = ScopeTable.empty(3)
    s.name = np.array([0, 1, 0], np.int32)
    s.cpu_start_ns = np.array([100, 200, 300], np.int64)
    s.cpu_end_ns = np.array([150, 260, 390], np.int64)
    s.submit_ns = np.array([110, NO_TIME, 305], np.int64)
    s.gpu_start_ns = np.array([120, NO_TIME, 300], np.int64)
    s.gpu_end_ns = np.array([170, NO_TIME, 500], np.int64)
    s.uncertainty_ns = np.array([7, 0, 9], np.int64)
    s.flags = np.array([int(Flag.COLD | Flag.OVERLAP), int(Flag.EMPTY), int(Flag.COLD)], np.uint32)
    t = Trace({"base_ns": 0}, ["a", "b"], [], [], s, SpanTable.empty(0), [], {})
    rep = anomaly_report(t)
    assert rep["counts"] == {"cold": 2, "empty_gpu_span": 1, "overlap": 1}
    assert rep["truncated"] == 0
    first, second = rep["items"]
    assert first["scope"] == 0 and first["name"] == "a" and first["kinds"] == ["overlap"]
    assert (first["cpu_start_ns"], first["cpu_ns"], first["gpu_ns"]) == (100, 50, 50)
    assert (first["queue_gap_ns"], first["uncertainty_ns"]) == (10, 7)
    assert second["kinds"] == ["empty_gpu_span"] and second["gpu_ns"] is None
    assert second["queue_gap_ns"] is None and len(second["explain"]) == 1
    assert all(isinstance(v, int) for v in (first["scope"], first["cpu_ns"], first["uncertainty_ns"]))
    assert not (int(s.flags[2]) & int(ANOMALY_FLAGS))  # cold alone is a state, not an anomaly


def test_names_are_interned_once_each_in_any_type() -> None:
    asked: list[object] = []
    ids: dict[str, int] = {}

    def intern(n: object) -> int:
        asked.append(n)
        return ids.setdefault(n if isinstance(n, str) else str(n), len(ids))

    got = _intern_all(["b", "a", "b", "b", "a"], intern)
    assert got.tolist() == [0, 1, 0, 0, 1] and asked == ["b", "a"]
    # names of other types that compare equal across types keep their own text
    mixed = _intern_all([1, True, 1.0, "1"], intern)  # type: ignore[list-item]
    assert [list(ids)[i] for i in mixed.tolist()] == ["1", "True", "1.0", "1"]


def reference_outliers(s: ScopeTable, has_gpu: np.ndarray, flags: np.ndarray) -> None:
    """A pass per name over every row (the rule of ``flag_outliers``, written out plainly)."""
    from gputrace.flags import OUTLIER_MIN_CALLS, OUTLIER_MIN_REL, OUTLIER_SIGMAS

    dur = np.where(has_gpu, s.gpu_end_ns - s.gpu_start_ns, s.cpu_end_ns - s.cpu_start_ns)
    warm = (flags & int(Flag.COLD)) == 0
    names, counts = np.unique(s.name[warm], return_counts=True)
    for nm in names[counts >= OUTLIER_MIN_CALLS].tolist():
        rows = np.flatnonzero(warm & (s.name == nm))
        gpu_rows = rows[has_gpu[rows]]
        rows = gpu_rows if len(gpu_rows) >= OUTLIER_MIN_CALLS else rows[~has_gpu[rows]]
        if len(rows) < OUTLIER_MIN_CALLS:
            continue
        x = dur[rows].astype(np.float64)
        med = float(np.median(x))
        mad = float(np.median(np.abs(x - med)))
        limit = max(OUTLIER_SIGMAS * 1.4826 * mad, OUTLIER_MIN_REL * abs(med))
        flags[rows[np.abs(x - med) > limit]] |= int(Flag.OUTLIER)


@pytest.mark.parametrize("seed", range(20))
def test_outlier_flags_equal_a_pass_per_name(seed: int) -> None:
    from gputrace.flags import flag_outliers

    rnd = random.Random(seed)
    n = rnd.randint(0, 600)
    s = ScopeTable.empty(n)
    s.name = np.array([rnd.randrange(rnd.choice([1, 3, 40])) for _ in range(n)], np.int32)
    s.cpu_start_ns = np.arange(n, dtype=np.int64) * 1_000
    s.cpu_end_ns = s.cpu_start_ns + np.array([rnd.choice([100, 110, 5_000]) for _ in range(n)], np.int64)
    has_gpu = np.array([rnd.random() < 0.7 for _ in range(n)], bool)
    s.gpu_start_ns = np.where(has_gpu, s.cpu_start_ns + 50, NO_TIME)
    dur = np.array([rnd.choice([2_000, 2_100, 1_900, 90_000]) for _ in range(n)], np.int64)
    s.gpu_end_ns = np.where(has_gpu, s.gpu_start_ns + dur, NO_TIME)
    flags = np.array([rnd.choice([0, 0, 0, int(Flag.COLD)]) for _ in range(n)], np.int64)
    want = flags.copy()
    flag_outliers(s, has_gpu, flags)
    reference_outliers(s, has_gpu, want)
    assert flags.tolist() == want.tolist()
