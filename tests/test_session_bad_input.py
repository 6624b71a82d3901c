"""Bad input given to ``session()``: metadata values that fail to convert, output paths that are
not regular files. The program goes on; what cannot be kept is marked and said once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gputrace
from gputrace.errors import GputraceWarning


class BadStr(str):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class BadIter(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise RuntimeError("no iter")


class BadLen(list):  # type: ignore[type-arg]
    def __len__(self) -> int:
        raise RuntimeError("no len")


class BadItems(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("no items")


class BadMapping(dict):  # type: ignore[type-arg]
    def __len__(self) -> int:
        raise RuntimeError("no len")

    def items(self) -> Any:
        raise RuntimeError("no items")


BAD = {"str": BadStr("x"), "iter": BadIter([1]), "len": BadLen([1]), "items": BadItems(a=1)}


@pytest.mark.parametrize("stream", [False, True], ids=["at-stop", "streamed"])
@pytest.mark.parametrize("kind", sorted(BAD))
@pytest.mark.parametrize("fmt", [".json", ".json.gz", ".pftrace"])
def test_metadata_that_fails_to_convert_becomes_a_marked_placeholder(
    tmp_path: Path, kind: str, stream: bool, fmt: str
) -> None:
    path = tmp_path / f"t{fmt}"
    bad = BAD[kind]
    meta = {"run": 7, "bad": bad, "nested": {"deep": [1, bad, "ok"]}}
    with pytest.warns(GputraceWarning, match="metadata value could not be converted") as got:
        with gputrace.session(path, backend="cpu", metadata=meta, stream=stream, quiet=True):
            with gputrace.trace("work"):
                pass
    assert len([w for w in got if "metadata" in str(w.message)]) == 1  # said once
    trace = gputrace.load(path)
    assert len(trace) == 1
    marker = f"<{type(bad).__qualname__} object (conversion failed)>"
    assert trace.header["metadata"] == {"run": 7, "bad": marker, "nested": {"deep": [1, marker, "ok"]}}
    problems = [p for p in trace.header["problems"] if "metadata" in p]
    assert len(problems) == 1 and type(bad).__qualname__ in problems[0], trace.header["problems"]


@pytest.mark.parametrize("stream", [False, True], ids=["at-stop", "streamed"])
def test_metadata_mapping_itself_broken(tmp_path: Path, stream: bool) -> None:
    path = tmp_path / "t.json"
    with pytest.warns(GputraceWarning, match="metadata"):
        with gputrace.session(path, backend="cpu", metadata=BadMapping(a=1), stream=stream, quiet=True):
            with gputrace.trace("work"):
                pass
    header = gputrace.load(path).header
    assert header["metadata"] == {"value": "<BadMapping object (conversion failed)>"}
