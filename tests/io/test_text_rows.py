"""The column-wise JSON text builder behind the JSON writer: exact against a per-row reference."""

from __future__ import annotations

import json
from decimal import Decimal

import numpy as np
import pytest

from gputrace.exporters import _text
from gputrace.exporters._text import Rows


def us_text(ns: int) -> str:
    q, r = divmod(abs(ns), 1000)
    frac = f"{r:03d}".rstrip("0")
    return ("-" if ns < 0 else "") + str(q) + ("." + frac if frac else "")


def reference(v, w, tab, idx, has_c) -> str:
    out = []
    for i in range(len(v)):
        x = int(v[i])
        row = '{"t":' + us_text(x)
        if w[i]:
            row += ',"i":' + str(x)
        row += ',"p":' + tab[idx[i]]
        members = []
        if w[i]:
            members.append('"a":' + str(x))
        if not w[i] and x % 3:
            members.append('"b":' + us_text(x))
        if has_c[i]:
            members.append('"c":' + tab[idx[i]])
        if members:
            row += ',"m":{' + ",".join(members) + "}"
        out.append(row + "}")
    return ",".join(out) + ","


@pytest.mark.parametrize("small", [0, 1000], ids=["columns", "cells"])
@pytest.mark.parametrize("seed", range(40))
def test_rows_match_a_per_row_reference(seed: int, small: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_text, "BLOCK", 7)  # several blocks, splices in more than one
    monkeypatch.setattr(_text, "SMALL", small)  # by columns (numpy), or cell by cell
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    big = 10 ** int(rng.integers(0, 19))
    v = rng.integers(-big, big, n, dtype=np.int64) if big > 1 else np.zeros(n, np.int64)
    if seed == 0:
        v[:4] = [np.iinfo(np.int64).max, -np.iinfo(np.int64).max, 0, 999]
    if seed % 2:
        v = np.abs(v)  # no sign anywhere: the paths that need none
    w = rng.random(n) < 0.5
    tab = ['"a"', '"bb"', json.dumps("é" * 120), '""', "[1,2]"]
    idx = rng.integers(0, len(tab), n)
    has_c = rng.random(n) < 0.3
    rows = (
        Rows(n)
        .lit('{"t":')
        .us(v)
        .lit(',"i":', w)
        .num(v, w)
        .lit(',"p":')
        .pick(tab, idx)
        .members(
            ',"m":{',
            [
                ('"a":', "int", v, w),
                ('"b":', "us", v, ~w & (v % 3 != 0)),
                ('"c":', "pick", (tab, idx), has_c),
            ],
        )
        .lit("}")
    )
    got = rows.tobytes().decode()
    assert got == reference(v, w, tab, idx, has_c)
    # exact at every magnitude: the text read as decimals, not through a float
    back = json.loads("[" + got[:-1] + "]", parse_float=Decimal, parse_int=Decimal)
    assert [int(e["t"] * 1000) for e in back] == v.tolist()


def test_constant_columns_collapse_and_empty_rows() -> None:
    assert Rows(0).lit("{").num(np.zeros(0, np.int64)).lit("}").tobytes() == b""
    r = Rows(3).lit('{"pid":').num(np.array([5, 5, 5])).lit("}")
    assert r.cols == [("lit", b'{"pid":5}', None)]
    assert r.tobytes() == b'{"pid":5},' * 3


def varint(x: int) -> bytes:
    x &= (1 << 64) - 1  # negative values as 64-bit two's complement
    out = bytearray()
    while True:
        out.append((x & 0x7F) | (0x80 if x > 0x7F else 0))
        x >>= 7
        if not x:
            return bytes(out)


@pytest.mark.parametrize("seed", range(20))
def test_varints_and_their_lengths_match_a_per_value_reference(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_text, "BLOCK", 5)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 30))
    v = rng.integers(0, 2 ** int(rng.integers(1, 64)), n, dtype=np.int64)
    edges = [0, 127, 128, 16383, 16384, -1, np.iinfo(np.int64).max, np.iinfo(np.int64).min]
    v[: min(n, len(edges))] = edges[:n]
    has = rng.random(n) < 0.7
    r = Rows(n, b"").lit(b"<").var(v, has).lit(b">")
    want = [b"<" + (varint(int(x)) if h else b"") + b">" for x, h in zip(v, has, strict=True)]
    assert r.lengths().tolist() == [len(w) for w in want]
    assert r.tobytes() == b"".join(want)
