"""Bad input to summarize/diff/merge: one sentence naming the file, exit code 2, never a traceback."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
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


def repeated(*indices: int) -> bytes:
    """The trace with these events given a second time (a file concatenated or edited)."""
    doc = orjson.loads(orjson.dumps(STORY))
    doc["traceEvents"] += [doc["traceEvents"][i] for i in indices]
    return orjson.dumps(doc)


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
        (with_event(A_GPU, bind_id=40), "names scope 40, but the trace has 6"),
        (with_event(A_GPU, bind_id=-1), "names scope -1"),
        (
            with_event(A_GPU, args={"gpu_us": [1], "uncertainty_us": 0, "flags": []}),
            "gpu_us must be a number",
        ),
        (with_event(A_GPU, tid=9), "stream track that the header does not list"),
        (with_event(A_SLICE, args={"flags": ["bogus"]}), "malformed"),
        (with_event(A_SLICE, name=["unhashable"]), "malformed"),
        (
            with_event(A_GPU, args={"gpu_us": -20, "uncertainty_us": 0, "flags": []}),
            "gpu_us holds a negative value (-20) for scope 0",
        ),
        (repeated(A_SLICE), "the cpu slice 'a' at ts 10 appears twice"),
        (repeated(A_GPU), "scope 0 has two gpu slices"),
        (repeated(*range(2, 12)), "appears twice"),
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


def test_negative_gpu_time_that_gputrace_flagged_is_kept(tmp_path: Path) -> None:
    """gputrace writes a broken timer's value as measured, flagged: such a file still loads."""
    path = tmp_path / "flagged_bad.json"
    path.write_bytes(
        with_event(A_GPU, args={"gpu_us": -20, "uncertainty_us": 0, "flags": ["empty_gpu_span"]})
    )
    res = summarize(path, "-f", "json")
    assert res.exit_code == 0, res.output
    row = next(r for r in orjson.loads(res.output)["rows"] if r["name"] == "a")
    assert row["empty"] == 1


# --- terminal escape injection ----------------------------------------------------------------------
EVIL = "x\x1b]0;owned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\u009b31m\u202eevil\r\n\x00\x7f"
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def evil_trace(path: Path) -> Path:
    doc = orjson.loads(orjson.dumps(STORY))
    for e in doc["traceEvents"]:
        if e.get("name") == "a":
            e["name"] = EVIL
    doc["gputrace"]["backend"] = EVIL
    doc["gputrace"]["host"] = {"name": EVIL, "cpu_count": 2}
    path.write_bytes(orjson.dumps(doc))
    return path


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv", "json"])
def test_summarize_never_prints_a_control_character_from_the_trace(tmp_path: Path, fmt: str) -> None:
    path = evil_trace(tmp_path / "evil_bad.json")
    res = summarize(path, "-f", fmt)
    assert res.exit_code == 0, res.output
    assert not RAW_CONTROL.findall(res.output), RAW_CONTROL.findall(res.output)
    if fmt == "json":  # still the same value, escaped as JSON
        names = [r["name"] for r in orjson.loads(res.output)["rows"]]
        assert EVIL in names
    else:
        assert "x\\x1b]0;owned\\x07\\x1b[2J" in res.output


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
def test_diff_never_prints_a_control_character_from_the_trace(tmp_path: Path, fmt: str) -> None:
    path = evil_trace(tmp_path / "evil_bad.json")
    res = CliRunner().invoke(cli, ["diff", str(DATA / "handmade.json"), str(path), "-f", fmt])
    assert res.exit_code == 0, res.output
    assert not RAW_CONTROL.findall(res.output), RAW_CONTROL.findall(res.output)
    assert "x\\x1b]0;owned" in res.output or (fmt == "json" and "\\u001b]0;owned" in res.output)


def test_error_sentences_escape_controls_too(tmp_path: Path) -> None:
    path = tmp_path / "bad\x1b[31mname.json"
    res = summarize(path)
    assert res.exit_code == 2
    assert res.output == f"gputrace: {tmp_path}/bad\\x1b[31mname.json: no such file.\n"


def test_view_unreadable_file_gives_the_sentence_summarize_gives(tmp_path: Path, monkeypatch: Any) -> None:
    """A file this user may not read (simulated: the tests may run as root, who reads anything)."""
    path = tmp_path / "locked_bad.json"
    path.write_bytes((DATA / "handmade.json").read_bytes())
    real_access, real_os_open, real_io_open = os.access, os.open, io.open

    def denied(p: Any) -> bool:
        return os.fsdecode(p) == str(path) if isinstance(p, (str, bytes, os.PathLike)) else False

    def access(p: Any, mode: int, **kw: Any) -> bool:
        return False if denied(p) else real_access(p, mode, **kw)

    def os_open(p: Any, *a: Any, **kw: Any) -> int:
        if denied(p):
            raise PermissionError(13, "Permission denied", str(p))
        return real_os_open(p, *a, **kw)

    def io_open(p: Any, *a: Any, **kw: Any) -> Any:
        if denied(p):
            raise PermissionError(13, "Permission denied", str(p))
        return real_io_open(p, *a, **kw)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(io, "open", io_open)
    want = f"gputrace: {path}: cannot be read (Permission denied).\n"
    res = summarize(path)
    assert (res.exit_code, res.output) == (2, want)
    res = CliRunner().invoke(cli, ["view", "--no-browser", str(path)])
    assert (res.exit_code, res.output) == (2, want)
