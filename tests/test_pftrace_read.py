"""The .pftrace reader's column-wise decoding: its wire helpers against the scalar ones, and
traces read the same whatever the piece size the packets are found in."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import numpy as np
import pytest

import gputrace
from gputrace.exporters import _protowire as pw
from gputrace.exporters import pftrace
from gputrace.model import OpTable
from tests.test_exporter import assert_same, record_story
from tests.test_pftrace import synthetic, through_json
from tests.test_read_fast import cupti_trace


def random_fields(rng: random.Random, n: int) -> tuple[bytes, list[int], list[int]]:
    """``n`` varint fields (key, value), keys of one to three bytes, values of one to ten; the
    bytes and the offsets of every field and every value."""
    out = bytearray()
    fields, values = [], []
    for _ in range(n):
        fields.append(len(out))
        field = rng.choice([1, 2, 10, 11, 15, 16, 36, 42, 127, 2047, 2048, 5000])
        out += pw.pv(field << 3)
        values.append(len(out))
        out += pw.pv(
            rng.choice([0, 1, 10, 127, 128, 300, 1 << 20, 1 << 35, (1 << 64) - 1, rng.getrandbits(64)])
        )
    return bytes(out), fields, values


@pytest.mark.parametrize("seed", range(4))
def test_varints_read_column_wise_match_the_scalar_reader(seed: int) -> None:
    rng = random.Random(seed)
    data, _fields, values = random_fields(rng, 500)
    buf = np.frombuffer(data, np.uint8)
    at = np.array(values, np.intp)
    got, after = pw.read_at(buf, at)
    for i, p in enumerate(values):
        v, end = pw.read_pv(data, p)
        assert (int(got[i]), int(after[i])) == (v, end)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("piece", [1, 2, 7, 64, 1 << 18])
def test_one_byte_keys_found_in_any_piece_size(seed: int, piece: int) -> None:
    rng = random.Random(seed)
    data, fields, _values = random_fields(rng, 800)
    buf = np.frombuffer(data, np.uint8)
    for key in (1 << 3, 10 << 3, 15 << 3):  # (16 << 3 and up take two bytes)
        want = [f for f in fields if data[f] == key]
        got = pw.one_byte_keys(buf, key, piece=piece)
        assert got is not None and got.tolist() == want
    # not whole pairs of varints: an odd count, or a varint cut at the end
    assert pw.one_byte_keys(buf[: fields[-1] + 1], 8, piece=piece) is None
    assert pw.one_byte_keys(np.frombuffer(data + b"\x08\x80", np.uint8), 8, piece=piece) is None
    assert pw.one_byte_keys(np.zeros(0, np.uint8), 8, piece=piece).tolist() == []  # type: ignore[union-attr]


def test_events_sorted_by_chunk_and_track_as_one_64_bit_key_sorts_them() -> None:
    rng = np.random.default_rng(1)
    for track_top, chunk_top, n in ((5, 1, 1000), (5, 4, 1000), (70_000, 3, 2000), (9, 100_000, 2000)):
        track = rng.integers(0, track_top, n)
        chunk = np.sort(rng.integers(0, chunk_top, n))
        want = np.argsort(track + chunk * (1 << 32), kind="stable")
        assert np.array_equal(pftrace._by_chunk_and_track(chunk, track), want)


@pytest.fixture(params=["steps then at once", "at once", "steps"])
def tiny_pieces(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Packets found a few bytes at a time (every piece boundary falls inside some packet), and
    the fields after their heads read a field at a time, all at once, or first one then the other
    (a small trace is read all at once otherwise)."""
    monkeypatch.setattr(pw, "one_byte_keys", functools.partial(pw.one_byte_keys, piece=37))
    step_min, share = {"steps then at once": (1, 4), "at once": (10**9, 1), "steps": (1, 10**9)}[
        request.param
    ]
    monkeypatch.setattr(pftrace, "STEP_MIN", step_min)
    monkeypatch.setattr(pftrace, "STEP_SHARE", share)


@pytest.mark.parametrize("seed", range(3))
def test_traces_read_the_same_in_tiny_pieces(tmp_path: Path, seed: int, tiny_pieces: None) -> None:
    trace = through_json(synthetic(200, seed), tmp_path)
    back = pftrace.read(pftrace.write(trace, tmp_path / "t.pftrace"))
    assert_same(trace, back)


def test_session_and_per_operation_traces_read_the_same_in_tiny_pieces(
    tmp_path: Path, tiny_pieces: None
) -> None:
    story = record_story(tmp_path / "t.json")
    assert_same(story, pftrace.read(pftrace.write(story, tmp_path / "t.pftrace")))
    cupti_trace(tmp_path / "c.json")  # user args (debug annotations), operations, marks
    trace = gputrace.load(tmp_path / "c.json")
    back = pftrace.read(pftrace.write(trace, tmp_path / "c.pftrace"))
    assert_same(trace, back)
    assert back.scopes.args and len(back.ops)
    for col in OpTable.COLUMNS:
        assert np.array_equal(getattr(trace.ops, col), getattr(back.ops, col)), col
