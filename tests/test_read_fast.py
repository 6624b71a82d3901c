"""The JSON reader's fast path (msgspec structs) reads every file exactly as the plain path does.

The fast path is an optimisation only: a file it does not expect (cut short, damaged, another
tool's) goes through the plain path, so the trace or the one-sentence error stays the same.
"""

from __future__ import annotations

import gc
import gzip
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import gputrace
from gputrace.backends.cupti import CuptiBackend
from gputrace.backends.cupti_fake import FakeActivitySource
from gputrace.clock import FakeClock
from gputrace.exporters import json as json_format
from gputrace.figures import with_launch_submissions
from gputrace.loader import TraceFileError
from gputrace.model import OpTable, ScopeTable
from gputrace.records import OP_MEMCPY
from tests.test_exporter import record_story

DATA = Path(__file__).parent / "data"
FOREIGN = ("durations.json", "pytorch.json", "torch_h200.json.gz", "torch_h200_key_averages.json")
GOLDEN = sorted(p for p in DATA.glob("*.json*") if p.name not in FOREIGN)


def plain(path: Path) -> gputrace.Trace:
    """The plain path, finished as ``gputrace.load`` finishes every format's reading."""
    raw, cut = json_format.read_raw(path)
    doc, truncated = json_format._document(raw, cut, path, None)
    return with_launch_submissions(json_format.from_document(doc, str(path), truncated=truncated))


def fast(path: Path) -> gputrace.Trace | None:
    raw, cut = json_format.read_raw(path)
    assert not cut
    got = json_format._read_fast(raw, str(path), None)
    return None if got is None else with_launch_submissions(got)


def assert_identical(a: gputrace.Trace, b: gputrace.Trace) -> None:
    assert a.header == b.header
    assert a.names == b.names and a.threads == b.threads and a.queues == b.queues
    for col in ScopeTable.COLUMNS:
        assert np.array_equal(getattr(a.scopes, col), getattr(b.scopes, col)), col
    assert a.scopes.args == b.scopes.args
    for col in ("scope", "label", "queue", "submit_ns", "gpu_start_ns", "gpu_end_ns"):
        assert np.array_equal(getattr(a.spans, col), getattr(b.spans, col)), col
    for col in OpTable.COLUMNS:
        assert np.array_equal(getattr(a.ops, col), getattr(b.ops, col)), col
    assert a.marks == b.marks and a.clock_fits == b.clock_fits


def cupti_trace(path: Path) -> None:
    clock = FakeClock(1_000_000, 1_000)
    src = FakeActivitySource(clock)
    with gputrace.session(path, backend=CuptiBackend(clock, source=src), clock=clock, quiet=True):
        for i in range(30):
            with gputrace.trace("step", i=i):
                src.launch(f"k{i % 3}", gpu_ns=500 + i, grid=(i + 1, 2, 1))
                if i % 7 == 0:
                    src.launch("copy", kind=OP_MEMCPY, nbytes=4096)
            gputrace.mark("tick", i=i)
        src.launch("loose")


@pytest.mark.parametrize("path", GOLDEN, ids=[p.name for p in GOLDEN])
def test_golden_files_read_the_same_both_ways(path: Path) -> None:
    got = fast(path)
    assert got is not None, "the fast path declined a file gputrace wrote"
    assert_identical(got, plain(path))


@pytest.mark.parametrize("name", ["story.json", "story.json.gz", "cupti.json", "cupti.json.gz"])
def test_fresh_traces_read_the_same_both_ways(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    (cupti_trace if name.startswith("cupti") else record_story)(path)
    got = fast(path)
    assert got is not None
    assert_identical(got, plain(path))
    assert_identical(gputrace.load(path), got)
    if name.startswith("cupti"):
        assert len(got.ops) == 30 + 5 + 1


def test_without_msgspec_every_file_still_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    cupti_trace(path)
    want = gputrace.load(path)
    monkeypatch.setattr(json_format, "_fast", lambda: None)
    assert_identical(gputrace.load(path), want)


def _edit_first(path: Path, out: Path, match: dict[str, object], change: dict[str, object]) -> None:
    doc = orjson.loads(path.read_bytes())
    e = next(e for e in doc["traceEvents"] if all(e.get(k) == v for k, v in match.items()))
    e.update(change)
    out.write_bytes(orjson.dumps(doc))


@pytest.mark.parametrize(
    ("match", "change"),
    [
        ({"ph": "X", "name": "step"}, {"ts": "12"}),  # a string where a number belongs
        ({"ph": "X", "name": "step"}, {"dur": -1.0}),
        ({"ph": "X", "cat": "kernel"}, {"args": {"op": 0}}),  # an operation without its fields
        ({"ph": "b"}, {"id2": {"local": 10**6}}),  # a wait naming no scope
    ],
)
def test_a_damaged_file_gets_the_plain_paths_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, match: dict[str, object], change: dict[str, object]
) -> None:
    good = tmp_path / "good.json"
    cupti_trace(good)
    bad = tmp_path / "bad.json"
    _edit_first(good, bad, match, change)
    assert fast(bad) is None
    with pytest.raises(TraceFileError) as fast_err:
        gputrace.load(bad)
    monkeypatch.setattr(json_format, "_fast", lambda: None)
    with pytest.raises(TraceFileError) as plain_err:
        gputrace.load(bad)
    assert str(fast_err.value) == str(plain_err.value)
    assert "malformed" in str(fast_err.value)


def test_a_cut_file_reads_as_truncated_and_the_same_both_ways(tmp_path: Path) -> None:
    path = tmp_path / "c.json.gz"
    cupti_trace(path)
    data = path.read_bytes()
    raw = gzip.decompress(data)
    cut = tmp_path / "cut.json"
    cut.write_bytes(raw[: raw.rindex(b",\n", 0, len(raw) - 1000) + 30])  # inside the last chunk
    cut_gz = tmp_path / "cut.json.gz"
    cut_gz.write_bytes(data[: len(data) - 200])  # the gzip stream ends early
    for p in (cut, cut_gz):
        raw_p, was_cut = json_format.read_raw(p)
        assert was_cut == (p is cut_gz)
        got = json_format._read_fast(raw_p, str(p), None, cut=was_cut)
        assert got is not None, "the fast path declined a cut streamed file"
        want = plain(p)
        assert_identical(got, want)
        assert_identical(gputrace.load(p), want)
        assert got.header["truncated"] is True and 0 < len(got) <= 30


def test_the_collector_is_restored_after_a_read(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    record_story(path)
    assert gc.isenabled()
    gputrace.load(path)
    assert gc.isenabled()
    (tmp_path / "bad.json").write_bytes(b'{"traceEvents": [')
    with pytest.raises(TraceFileError):
        gputrace.load(tmp_path / "bad.json")
    assert gc.isenabled()
    gc.disable()
    try:
        gputrace.load(path)
        assert not gc.isenabled()  # left off when it was off
    finally:
        gc.enable()


def test_pftrace_field_reader_matches_the_wire_module() -> None:
    """The .pftrace reader's inline field loop reads (and refuses) every message as
    ``_protowire.fields`` does: random messages, cut ones, and stray bytes of any wire type."""
    import random

    from gputrace.exporters import _protowire as pw
    from gputrace.exporters.pftrace import _fields

    rng = random.Random(11)

    def message() -> bytes:
        out = b""
        for _ in range(rng.randint(0, 8)):
            f, wt = rng.randint(1, 3000), rng.choice([0, 1, 2, 5])
            if wt == 0:
                out += pw.fv(f, rng.choice([0, 1, 127, 128, 300, 2**40, 2**64 - 1]))
            elif wt == 2:
                out += pw.fb(f, bytes(rng.randint(0, 255) for _ in range(rng.choice([0, 3, 130]))))
            elif wt == 1:
                out += pw.fd(f, rng.random())
            else:
                out += pw.pv((f << 3) | 5) + b"abcd"
        return out

    def outcome(fn: Any, data: bytes | memoryview) -> Any:
        try:
            return list(fn(data))
        except Exception as exc:
            return type(exc), str(exc)

    for _ in range(1500):
        m = message()
        if m and rng.random() < 0.3:
            m = m[: rng.randint(0, len(m) - 1)]
        if rng.random() < 0.2:
            m += bytes([rng.randint(0, 255)])
        for data in (m, memoryview(m)):
            assert outcome(_fields, data) == outcome(pw.fields, data), m


def test_bytes_that_are_not_utf8_only_where_nothing_is_read_do_not_spoil_the_file(tmp_path: Path) -> None:
    """The fast path reads past what gputrace does not use (a queued slice's end, another tool's
    keys) without decoding it, so stray bytes there no longer make the whole file unreadable;
    in any value that is read they still do, with the plain path's sentence."""
    good = tmp_path / "good.json"
    record_story(good)
    raw = good.read_bytes()
    assert raw.count(b'{"ph":"e",') > 0
    spoiled = tmp_path / "spoiled.json"
    spoiled.write_bytes(raw.replace(b'{"ph":"e",', b'{"ph":"e","x\xff":1,', 1))
    assert_identical(gputrace.load(spoiled), gputrace.load(good))
    read_value = tmp_path / "read.json"
    read_value.write_bytes(raw.replace(b'"name":"step"', b'"name":"st\xffep"', 1))
    with pytest.raises(TraceFileError, match="not valid JSON"):
        gputrace.load(read_value)


def test_a_streamed_file_cut_anywhere_reads_the_same_both_ways(tmp_path: Path) -> None:
    """Cut at any byte (a killed program), a streamed file gives the plain path's trace (up to
    its last whole chunk) or its sentence, by the fast path too."""
    import random

    path = tmp_path / "s.json"
    clock = FakeClock(1_000_000, 1_000)
    src = FakeActivitySource(clock)
    with gputrace.session(path, backend=CuptiBackend(clock, source=src), clock=clock, quiet=True):
        for i in range(40):
            with gputrace.trace("step", i=i):
                src.launch("k", gpu_ns=500 + i)
            if i % 5 == 4:
                gputrace.sync()
    raw = path.read_bytes()
    rng = random.Random(3)
    for n in sorted(rng.sample(range(len(raw)), 40)):
        cut = tmp_path / f"cut{n}.json"
        cut.write_bytes(raw[:n])
        try:
            want: Any = plain(cut)
        except TraceFileError as exc:
            want = str(exc)
        try:
            got: Any = gputrace.load(cut)
        except TraceFileError as exc:
            got = str(exc)
        if isinstance(want, str):
            assert got == want
        else:
            assert_identical(got, want)
            assert got.header["truncated"] is True
