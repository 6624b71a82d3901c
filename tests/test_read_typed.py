"""The JSON reader's fast path decodes the numbers it gathers as typed fields (an integer, a
float) and takes the defaults of absent operation fields from its structs. A value of another
type makes the fast path decline the file; the plain path then reads it (or names the value),
so a trace reads the same either way, whatever its values.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

import gputrace
from gputrace.exporters import json as json_format
from gputrace.loader import TraceFileError
from tests.test_read_fast import assert_identical, cupti_trace, fast, plain

Edit = Callable[[dict[str, Any]], None]


def _edited(tmp_path: Path, match: Callable[[dict[str, Any]], bool], edit: Edit) -> Path:
    good = tmp_path / "good.json"
    cupti_trace(good)
    doc = orjson.loads(good.read_bytes())
    e = next(e for e in doc["traceEvents"] if match(e))
    edit(e)
    out = tmp_path / "bad.json"  # (altered by hand: the Perfetto rules check passes it over)
    out.write_bytes(orjson.dumps(doc))
    return out


def _is_scope_slice(e: dict[str, Any]) -> bool:
    return e.get("ph") == "X" and e.get("name") == "step" and "cat" not in e


def _is_gpu_slice(e: dict[str, Any]) -> bool:
    return e.get("ph") == "X" and e.get("name") == "step" and e.get("pid", 0) >= 1 << 30


def _is_kernel(e: dict[str, Any]) -> bool:
    return e.get("ph") == "X" and e.get("cat") == "kernel"


def _set(**kv: Any) -> Edit:
    return lambda e: e.update(kv)


def _pid_as_float(e: dict[str, Any]) -> None:
    e["pid"] = float(e["pid"])


def _op_as_float(e: dict[str, Any]) -> None:
    e["args"]["op"] = float(e["args"]["op"])


def _drop_id2(e: dict[str, Any]) -> None:
    del e["id2"]


def _drop_op_fields(e: dict[str, Any]) -> None:
    for k in ("bytes", "grid", "block", "call", "graph id", "graph node id"):
        e["args"].pop(k, None)


def _dur_as_int(e: dict[str, Any]) -> None:
    e["dur"] = int(e["dur"]) + 1


@pytest.mark.parametrize(
    ("match", "edit"),
    [
        (_is_scope_slice, _pid_as_float),  # the plain path compares it with the GPU pids
        (_is_scope_slice, _set(ts=True)),  # numpy takes a bool among floats as 1.0
        (_is_kernel, _op_as_float),  # operations then sort as Python orders them
        (lambda e: e.get("ph") == "b", _drop_id2),  # no id2: not a wait (passed over)
        (_is_scope_slice, _set(bind_id="3")),  # a CPU slice's bind_id is not read
    ],
    ids=["float-pid", "bool-ts", "float-op", "wait-without-id2", "cpu-string-bind-id"],
)
def test_a_value_the_typed_fields_refuse_reads_as_the_plain_path_reads_it(
    tmp_path: Path, match: Callable[[dict[str, Any]], bool], edit: Edit
) -> None:
    path = _edited(tmp_path, match, edit)
    assert fast(path) is None  # declined: decoded typed, the value does not fit
    assert_identical(gputrace.load(path), plain(path))


@pytest.mark.parametrize(
    ("match", "edit"),
    [
        (_is_kernel, _drop_op_fields),  # absent: the defaults the plain path takes
        (_is_kernel, _dur_as_int),  # an integer where a float is typed: the same number
        (_is_scope_slice, _dur_as_int),
    ],
    ids=["op-defaults", "int-op-dur", "int-slice-dur"],
)
def test_values_the_typed_fields_take_read_the_same_both_ways(
    tmp_path: Path, match: Callable[[dict[str, Any]], bool], edit: Edit
) -> None:
    path = _edited(tmp_path, match, edit)
    got = fast(path)
    assert got is not None, "the fast path declined a file it reads"
    assert_identical(got, plain(path))


@pytest.mark.parametrize(
    ("match", "edit"),
    [
        (_is_scope_slice, _set(tid=1.5)),
        (_is_gpu_slice, _set(bind_id="3")),
        (_is_scope_slice, _set(dur=None)),
    ],
    ids=["float-tid", "gpu-string-bind-id", "null-dur"],
)
def test_a_value_neither_path_takes_gets_the_plain_paths_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, match: Callable[[dict[str, Any]], bool], edit: Edit
) -> None:
    path = _edited(tmp_path, match, edit)
    assert fast(path) is None
    with pytest.raises(TraceFileError) as fast_err:
        gputrace.load(path)
    monkeypatch.setattr(json_format, "_fast", lambda: None)
    with pytest.raises(TraceFileError) as plain_err:
        gputrace.load(path)
    assert str(fast_err.value) == str(plain_err.value)
    assert "malformed" in str(fast_err.value)


def test_an_async_slice_of_another_tool_is_no_wait_either_way(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    cupti_trace(good)
    doc = orjson.loads(good.read_bytes())
    wait = next(e for e in doc["traceEvents"] if e.get("ph") == "b")
    other = {**wait, "name": "download", "ts": wait["ts"] - 1.0}  # no cat, not "queued…"
    # after the wait: taken for one, it would move the scope's submission
    doc["traceEvents"].insert(doc["traceEvents"].index(wait) + 1, other)
    path = tmp_path / "bad.json"  # (altered by hand)
    path.write_bytes(orjson.dumps(doc))
    got = fast(path)
    assert got is not None
    want = plain(path)
    assert_identical(got, want)
    assert_identical(got, fast(good) or plain(good))  # the wait's submission is unchanged


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"ph":"b","name":"queued', b'"ph":"b","name":"\\u0071ueued'),  # escaped: still a wait
        (b'"ph":"b","name":"queued \xc2\xb7 ', b'"ph":"b","name":"queued \\u00b7 '),  # same name
        (b'"ph":"b","name":"queued \xc2\xb7 ', b'"ph":"b","name":7,"x":"'),  # a number: no wait
    ],
    ids=["escaped", "other-spelling", "number"],
)
def test_a_waits_name_reads_by_its_value_not_its_spelling(tmp_path: Path, old: bytes, new: bytes) -> None:
    good = tmp_path / "good.json"
    cupti_trace(good)
    raw = good.read_bytes()
    assert old in raw
    path = tmp_path / "bad.json"  # (altered by hand: the first wait's name only)
    path.write_bytes(raw.replace(old, new, 1))
    got = fast(path)
    assert got is not None
    assert_identical(got, plain(path))
