"""Gzip traces inflate by ISA-L (python-isal) where it is installed, by zlib elsewhere: the same
bytes, the same caps, the same sentences, the same recovery of a cut stream, either way."""

from __future__ import annotations

import importlib.util
import sys
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from gputrace import readlimits
from gputrace.exporters import json as json_format
from gputrace.readlimits import TraceReadError, gunzip_trace, read_trace_bytes
from tests.test_read_fast import assert_identical

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.not_a_trace  # copies of test data and synthetic streams, some broken
needs_isal = pytest.mark.skipif(
    importlib.util.find_spec("isal") is None, reason="python-isal is not installed here (zlib reads gzip)"
)

Read = Callable[[], object]


def gz(raw: bytes, level: int = 6) -> bytes:
    z = zlib.compressobj(level, zlib.DEFLATED, 31)
    return z.compress(raw) + z.flush()


def both_ways(monkeypatch: pytest.MonkeyPatch, read: Read) -> tuple[object, object]:
    """``read()`` with ISA-L, then with zlib only; each a value or the exception it raised."""
    out = []
    for isal in (True, False):
        with monkeypatch.context() as m:
            if not isal:
                m.setattr(readlimits, "_isal", lambda: None)
            try:
                out.append(read())
            except TraceReadError as exc:
                out.append(("raised", str(exc)))
    return out[0], out[1]


@needs_isal
def test_isal_inflates_whole_streams(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where python-isal is installed, zlib is not what reads a whole stream."""
    raw = (DATA / "story.json").read_bytes()
    path = tmp_path / "t.json.gz"
    path.write_bytes(gz(raw))

    def no_zlib(*args: object) -> bytes:
        raise AssertionError("zlib read a whole stream")

    monkeypatch.setattr(readlimits, "_gunzip_zlib", no_zlib)
    assert read_trace_bytes(path) == raw
    assert gunzip_trace(path.read_bytes(), path) == (raw, False)


@needs_isal
@pytest.mark.parametrize("name", ["cuda_h200.json.gz", "story.json", "handmade.json", "rank0.json"])
def test_golden_traces_read_the_same_both_ways(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    path = DATA / name
    if not name.endswith(".gz"):
        path = tmp_path / (name + ".gz")
        path.write_bytes(gz((DATA / name).read_bytes()))
    with_isal, with_zlib = both_ways(monkeypatch, lambda: json_format.read(path))
    assert_identical(with_isal, with_zlib)  # type: ignore[arg-type]


@needs_isal
def test_members_padding_and_level_read_the_same_both_ways(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    raw = (DATA / "story.json").read_bytes()
    cases = {
        "one": gz(raw),
        "fast": gz(raw, 1),
        "members": gz(raw[:1000]) + gz(raw[1000:5000]) + gz(raw[5000:]),
        "padded": gz(raw) + b"\0" * 64,
        "empty member": gz(b"") + gz(raw),
    }
    for label, data in cases.items():
        path = tmp_path / f"{label}.json.gz"
        path.write_bytes(data)
        a, b = both_ways(monkeypatch, lambda: read_trace_bytes(path))  # noqa: B023
        assert a == b == raw, label


@needs_isal
def test_damaged_streams_get_the_same_sentence_both_ways(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    raw = (DATA / "story.json").read_bytes()
    good = gz(raw)
    crc = bytearray(good)
    crc[-6] ^= 1  # the CRC-32 in the trailer
    size = bytearray(good)
    size[-2] ^= 1  # the length in the trailer
    body = bytearray(good)
    body[len(good) // 2 : len(good) // 2 + 8] = b"\xff" * 8
    cases = {"cut": good[:-9], "junk": good + b"junk", "crc": crc, "size": size, "body": body}
    for label, data in cases.items():
        path = tmp_path / f"{label}.json.gz"
        path.write_bytes(bytes(data))
        a, b = both_ways(monkeypatch, lambda: read_trace_bytes(path))  # noqa: B023
        assert a == b, label
        assert a == ("raised", f"{path}: the gzip data is truncated or corrupt."), label


@needs_isal
def test_a_stream_cut_anywhere_keeps_the_same_bytes_both_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed file cut by a killed program keeps what zlib recovers, byte for byte."""
    raw = (DATA / "story.json").read_bytes() * 20
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    parts = [z.compress(raw[i : i + 4096]) + z.flush(zlib.Z_SYNC_FLUSH) for i in range(0, len(raw), 4096)]
    data = b"".join(parts) + z.flush()
    for cut in (30, 1000, len(data) // 3, len(data) // 2 + 7, len(data) - 9, len(data) - 1):
        a, b = both_ways(monkeypatch, lambda: gunzip_trace(data[:cut], "cut.json.gz"))  # noqa: B023
        assert a == b, cut
        assert isinstance(a, tuple) and a[1] is True and raw.startswith(a[0]), cut


@needs_isal
def test_the_caps_stop_a_bomb_the_same_way_both_ways(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The size cap and the not-JSON check stop a bomb at the same point with either inflater."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    spaces = tmp_path / "spaces.json.gz"
    spaces.write_bytes(
        z.compress(b'{"traceEvents": [')
        + b"".join(z.compress(b" " * (1 << 20)) for _ in range(40))
        + z.flush()
    )
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = tmp_path / "zeros.json.gz"
    zeros.write_bytes(b"".join(z.compress(b"\0" * (1 << 20)) for _ in range(40)) + z.flush())
    seen: list[int] = []
    real = readlimits._check_json_start

    def spy(head: bytes, p: Path) -> None:
        seen.append(len(head))
        real(head, p)

    monkeypatch.setattr(readlimits, "_check_json_start", spy)
    a, b = both_ways(monkeypatch, lambda: read_trace_bytes(spaces, limit=8 << 20))
    size = readlimits.human_bytes(spaces.stat().st_size)
    ratio = "more than 40-fold, which no trace does (set GPUTRACE_MAX_TRACE_BYTES to read it anyway)"
    assert a == b == ("raised", f"{spaces}: too large: its {size} of gzip data expand past 8 MiB, {ratio}.")
    a, b = both_ways(monkeypatch, lambda: read_trace_bytes(zeros, limit=32 << 20))
    assert a == b == ("raised", f"{zeros}: not valid JSON (the gzip data does not hold a JSON document).")
    assert max(seen) <= 1 << 20  # the check looks at the first block (1 MiB) only, either way
    # a stream just under the cap reads whole; one byte more is refused
    whole = tmp_path / "whole.json.gz"
    whole.write_bytes(gz(b"[" + b" " * 999_998 + b"]"))
    a, b = both_ways(monkeypatch, lambda: read_trace_bytes(whole, limit=1_000_000))
    assert a == b and isinstance(a, (bytes, bytearray)) and len(a) == 1_000_000
    a, b = both_ways(monkeypatch, lambda: read_trace_bytes(whole, limit=999_999))
    assert a == b and isinstance(a, tuple) and a[0] == "raised" and "too large" in a[1]


def test_without_python_isal_zlib_reads_every_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    raw = (DATA / "story.json").read_bytes()
    path = tmp_path / "t.json.gz"
    path.write_bytes(gz(raw))
    monkeypatch.setitem(sys.modules, "isal", None)  # import isal fails, as where it is not installed
    readlimits._isal.cache_clear()
    try:
        assert readlimits._isal() is None
        assert read_trace_bytes(path) == raw
        assert gunzip_trace(path.read_bytes()[:-20], path)[1] is True
        assert len(json_format.read(path)) == len(json_format.read(DATA / "story.json"))
    finally:
        readlimits._isal.cache_clear()
