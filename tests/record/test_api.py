"""The API as people expect it: a bare ``@gputrace.trace``, ``timing=``, backend options checked."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import pytest

import gputrace
from gputrace.backends import option_names
from gputrace.clock import FakeClock


@gputrace.trace
def double(x: int) -> int:
    return 2 * x


class Model:
    @gputrace.trace
    def forward(self, x: int) -> int:
        return x + 1


@gputrace.trace
async def fetch(x: int) -> int:
    await asyncio.sleep(0)
    return x * 10


@gputrace.trace
def count(n: int) -> Iterator[int]:
    yield from range(n)


def test_bare_decorator_calls_the_function_under_its_qualified_name() -> None:
    with gputrace.session(backend="cpu", clock=FakeClock()) as s:
        got = (double(21), Model().forward(1), asyncio.run(fetch(4)), list(count(3)))
    assert got == (42, 2, 40, [0, 1, 2])
    assert s.trace is not None
    assert [sc.name for sc in s.trace] == ["double", "Model.forward", "fetch", "count"]
    # the wrapped functions keep their names, and work with no session at all
    assert double.__name__ == "double" and double(1) == 2
    assert asyncio.iscoroutinefunction(fetch)


def test_bare_decorator_keeps_exceptions_and_closes_the_scope() -> None:
    @gputrace.trace
    def boom() -> None:
        raise KeyError("x")

    with gputrace.session(backend="cpu") as s, pytest.raises(KeyError):
        boom()
    assert s.trace is not None
    (sc,) = s.trace
    assert sc.name == "test_bare_decorator_keeps_exceptions_and_closes_the_scope.<locals>.boom"
    assert sc.args == {"exception": "KeyError"}


def test_named_decorator_and_context_manager_unchanged() -> None:
    @gputrace.trace("named", k=1)
    def f() -> int:
        return 7

    with gputrace.session(backend="cpu") as s:
        assert f() == 7
        with gputrace.trace("region"):
            pass
    assert s.trace is not None
    assert [(sc.name, sc.args) for sc in s.trace] == [("named", {"k": 1}), ("region", {})]


def test_bare_decorator_takes_no_arguments() -> None:
    with pytest.raises(gputrace.GputraceError, match="bare takes no arguments"):
        gputrace.trace(double, batch=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("backend", "options", "valid"),
    [
        ("cpu", {"timingg": "cupti"}, "it takes none"),
        ("fake", {"offsett_ns": 1}, "drift_ppm, in_order, offset_ns"),
        ("cuda", {"timingg": "cupti"}, "anchor_every_ns, api_filter, buffer_bytes, flush_period_ms, samples"),
        ("wgpu", {"devices": None}, "calibration_samples, device, page_queries, timeout_s, timestamp_period"),
        ("auto", {"timingg": "cupti"}, "calibration_samples, device"),
    ],
)
def test_unknown_backend_option_is_an_error_naming_the_valid_ones(
    backend: str, options: dict[str, object], valid: str
) -> None:
    s = gputrace.session(backend=backend, backend_options=options, quiet=True)
    with pytest.raises(gputrace.GputraceError) as err:
        s.start()
    msg = str(err.value)
    assert f"unknown backend option {next(iter(options))!r}" in msg
    assert valid in msg
    assert "\n" not in msg


def test_option_names_are_each_backends_own() -> None:
    assert option_names("cpu") == ()
    assert set(option_names("cuda")) == {
        "timing", "samples", "buffer_bytes", "flush_period_ms", "api_filter",  # CUPTI
        "sync_timeout_s", "anchor_every_ns",  # events
    }  # fmt: skip
    assert "device" in option_names("wgpu") and "windows" in option_names("fake")


def test_auto_gives_each_candidate_only_its_own_options() -> None:
    # a wgpu option under auto on a machine without cuda and without the program importing wgpu:
    # auto ends on cpu, which takes no option, and must not fail for it
    s = gputrace.session(backend="auto", backend_options={"timeout_s": 5.0}, quiet=True).start()
    try:
        assert s.backend_name in ("cpu", "wgpu", "cuda")
    finally:
        s.stop()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "cpu", "timing": "cupti"}, "the cpu backend has no such choice"),
        ({"backend": "wgpu", "timing": "events"}, "the wgpu backend has no such choice"),
        ({"backend": "cuda", "timing": "fast"}, "unknown timing 'fast'; choose one of auto, cupti, events"),
        (
            {"backend": "cuda", "timing": "events", "backend_options": {"timing": "cupti"}},
            "disagree; give one",
        ),
    ],
)
def test_timing_is_checked_when_the_session_is_made(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(gputrace.GputraceError, match=re.escape(message)):
        gputrace.session(**kwargs)  # type: ignore[arg-type]


def test_timing_reaches_the_cuda_backend_as_its_option() -> None:
    s = gputrace.session(backend="cuda", timing="events")
    assert s.backend_options == {"timing": "events"}
    assert gputrace.session(backend="auto", timing="cupti").backend_options == {"timing": "cupti"}
    assert gputrace.session(backend="cpu", timing="auto").backend_options == {}
