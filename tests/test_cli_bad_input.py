"""Bad input to summarize/diff/merge: one sentence naming the file, exit code 2, never a traceback."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputrace.cli import cli

DATA = Path(__file__).parent / "data"
STORY = orjson.loads((DATA / "handmade.json").read_bytes())


def summarize(path: Path, *extra: str) -> Result:
    return CliRunner().invoke(cli, ["summarize", str(path), *extra])


def assert_clean_failure(res: Result, path: Path, expected: str) -> None:
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit)  # not an uncaught exception
    line = res.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"gputrace: {path}") and expected in line, line


def mangled(**header: Any) -> bytes:
    doc = orjson.loads(orjson.dumps(STORY))
    doc["gputrace"].update(header)
    return orjson.dumps(doc)


def with_event(i: int, **fields: Any) -> bytes:
    doc = orjson.loads(orjson.dumps(STORY))
    doc["traceEvents"][i].update(fields)
    return orjson.dumps(doc)


A_SLICE = 2  # the first cpu slice of handmade.json
A_GPU = 8  # its gpu slice


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        (b"", "the file is empty"),
        ((DATA / "handmade.json").read_bytes()[:700], "truncated JSON"),
        (b"\x00\x01binary\xff", "not valid JSON"),
        (b"[1, 2, 3]", "no complete (X) slices"),
        (b'{"hello": "world"}', "not a Chrome trace"),
        (b'{"traceEvents": [{"ph": "i", "ts": 1}]}', "no complete (X) slices"),
        (gzip.compress(b'{"traceEvents": []}')[:-4], "gzip data is truncated"),
        (mangled(format_version=7), "format version 7"),
        (mangled(base_ns="soon"), "malformed"),
        (with_event(A_SLICE, ts="10"), "a cpu slice's ts must be a number, not str"),
        (with_event(A_SLICE, ts=None), "must be a number, not NoneType"),
        (with_event(A_SLICE, dur=-5), "negative"),
        (with_event(A_SLICE, ts=1e300), "absurd value"),
        (with_event(A_SLICE, tid=99), "thread 99, which the header does not list"),
        (with_event(A_GPU, args={"scope": 40, "gpu_us": 1}), "names scope 40, but the trace has 6"),
        (with_event(A_GPU, args={"scope": -1, "gpu_us": 1}), "names scope -1"),
        (with_event(A_GPU, args={"scope": 0, "gpu_us": [1]}), "gpu_us must be a number"),
        (with_event(A_GPU, tid=9), "stream track that the header does not list"),
        (with_event(A_SLICE, args={"flags": ["bogus"]}), "malformed"),
        (with_event(A_SLICE, name=["unhashable"]), "malformed"),
    ],
    ids=lambda v: v if isinstance(v, str) else "content",
)
def test_each_kind_of_bad_input(tmp_path: Path, content: bytes | None, expected: str) -> None:
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_bytes(content)
    assert_clean_failure(summarize(path), path, expected)
    other = CliRunner().invoke(cli, ["diff", str(DATA / "handmade.json"), str(path)])
    assert_clean_failure(other, path, expected)
    merged = CliRunner().invoke(cli, ["merge", str(tmp_path / "out.json"), str(path)])
    assert merged.exit_code == 2 and "Traceback" not in merged.output


def test_directory_is_not_a_trace(tmp_path: Path) -> None:
    assert_clean_failure(summarize(tmp_path), tmp_path, "is a directory")


# --- fuzz: any mangling of a good trace ends in a summary or one clean sentence ------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip
KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "scope", "gpu_us", "submit_ts",
        "uncertainty_us", "flags", "id", "s", "bp"]  # fmt: skip
HEADER_KEYS = ["base_ns", "start_ns", "end_ns", "pid", "threads", "queues", "clock", "host",
               "calibration", "format_version", "rank", "clock_pair"]  # fmt: skip


def _mutate(doc: Any, draw: Any) -> None:
    events = doc["traceEvents"]
    kind = draw(st.sampled_from(["event", "args", "delete", "header", "drop", "swap"]))
    i = draw(st.integers(0, len(events) - 1))
    ev = events[i]
    if not isinstance(ev, dict):  # swapped out by an earlier mutation
        kind = "drop"
    if kind == "event":
        ev[draw(st.sampled_from(KEYS))] = draw(json_values)
    elif kind == "args" and isinstance(ev.get("args"), dict):
        ev["args"][draw(st.sampled_from(KEYS))] = draw(json_values)
    elif kind == "delete" and ev:
        ev.pop(draw(st.sampled_from(sorted(ev))))
    elif kind == "header":
        doc["gputrace"][draw(st.sampled_from(HEADER_KEYS))] = draw(json_values)
    elif kind == "drop":
        del events[i]
    elif kind == "swap":
        events[i] = draw(json_values)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), source=st.sampled_from(["handmade.json", "story.json", "pytorch.json"]))
def test_fuzzed_traces_never_raise(tmp_path: Path, data: st.DataObject, source: str) -> None:
    doc = orjson.loads((DATA / source).read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        if doc.get("traceEvents"):
            _mutate(doc, data.draw) if "gputrace" in doc else _mutate({**doc, "gputrace": {}}, data.draw)
    raw = json.dumps(doc).encode()  # the standard library writes integers beyond 64 bits too
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    path = tmp_path / "bad_fuzz.json"
    path.write_bytes(raw)
    fmt = data.draw(st.sampled_from(["table", "json", "csv", "markdown"]))
    res = summarize(path, "-f", fmt)
    assert res.exit_code in (0, 2), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    if res.exit_code == 2:
        line = res.output.strip()
        assert line.startswith(f"gputrace: {path}") and "\n" not in line, line
