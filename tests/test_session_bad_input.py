"""Bad input given to ``session()``: metadata values that fail to convert, output paths that are
not regular files. The program goes on; what cannot be kept is marked and said once."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import gputrace
from gputrace.errors import GputraceError, GputraceWarning
from gputrace.exporters import canonical


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
    trace = gputrace.load(canonical(path))
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
    header = gputrace.load(canonical(path)).header
    assert header["metadata"] == {"value": "<BadMapping object (conversion failed)>"}


# --- output paths that are not regular files ---------------------------------------------------------
def not_a_file(tmp_path: Path, kind: str) -> Path:
    """A FIFO, a folder, or a character device (a copy of /dev/null's node, made here: real device
    nodes are never touched), inside ``tmp_path``; named "bad" so no fixture opens it as a trace."""
    path = tmp_path / f"bad_out_{kind}.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path


def kind_of(path: Path) -> str:
    mode = os.stat(path).st_mode
    return "fifo" if stat.S_ISFIFO(mode) else "directory" if stat.S_ISDIR(mode) else (
        "device" if stat.S_ISCHR(mode) else "file")  # fmt: skip


@contextmanager
def reader_if_fifo(path: Path) -> Iterator[int | None]:
    """Holds a non-blocking reader on a FIFO, so a writer opening it (a bug) cannot hang the test;
    whatever it wrote can then be read back."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if kind_of(path) == "fifo" else None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def pipe_is_empty(fd: int | None) -> bool:
    if fd is None:
        return True
    try:
        return os.read(fd, 1) == b""
    except BlockingIOError:
        return True


@pytest.mark.parametrize("stream", [False, True], ids=["at-stop", "streamed"])
@pytest.mark.parametrize("fmt", [".json", ".pftrace"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_session_refuses_a_path_that_is_not_a_regular_file(
    tmp_path: Path, kind: str, stream: bool, fmt: str
) -> None:
    path = not_a_file(tmp_path, kind).rename(tmp_path / f"bad_out_{kind}{fmt}")
    with reader_if_fifo(path) as fd:
        with pytest.raises(GputraceError, match=f"{path}: is .*, not a regular file"):
            with gputrace.session(path, backend="cpu", stream=stream, quiet=True):
                pass
        assert pipe_is_empty(fd)
    assert gputrace.session(None, backend="cpu").start().stop() is not None  # nothing was left active
    assert kind_of(path) == kind


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_path_that_became_a_device_by_stop_is_left_alone(tmp_path: Path, kind: str) -> None:
    """Made a FIFO (or a folder, a device) while the session ran: the trace is kept in memory, the
    node stays what it is, the reason is said once."""
    path = tmp_path / "bad_later.json"
    s = gputrace.session(path, backend="cpu", stream=False, quiet=True).start()
    with gputrace.trace("work"):
        pass
    not_a_file(tmp_path, kind).rename(path)
    with reader_if_fifo(path) as fd:
        with pytest.warns(GputraceWarning, match="not a regular file"):
            trace = s.stop()
        assert pipe_is_empty(fd)
    assert kind_of(path) == kind
    assert [trace.names[int(i)] for i in trace.scopes.name] == ["work"]
    assert s.written is None
