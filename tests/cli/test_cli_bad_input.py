"""Bad input to summarize/diff/merge: one sentence naming the file, exit code 2, never a traceback."""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputrace.cli import cli
from tests.builders import child_env

DATA = Path(__file__).parents[1] / "data"
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


# --- line breaks in names: every text output keeps one row per line ----------------------------------
# Every character at which str.splitlines (and terminals, editors, pagers) may end a line, besides \n.
LINE_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
BROKEN = "row" + "".join(f"{c}{i}" for i, c in enumerate(LINE_BREAKS))  # 'row\r0\x0b1…\u20298'
RAW_BREAK = re.compile(f"[{LINE_BREAKS}]")
ROOT = Path(__file__).parents[2]


def broken_trace(path: Path) -> Path:
    doc = orjson.loads(orjson.dumps(STORY))
    for e in doc["traceEvents"]:
        if e.get("name") == "a":
            e["name"] = BROKEN
    doc["gputrace"]["backend"] = BROKEN
    doc["gputrace"]["host"] = {"name": BROKEN, "cpu_count": 2}
    path.write_bytes(orjson.dumps(doc))
    return path


def gputrace_cli(*args: str | Path, cwd: Path | None = None) -> tuple[int, str]:
    """The real command in its own process: stdout and stderr as the terminal gets them (warnings,
    notices and the program's output included)."""
    env = child_env()
    res = subprocess.run([sys.executable, "-m", "gputrace", *map(str, args)], capture_output=True,
                         cwd=cwd, env=env, timeout=120)  # fmt: skip
    return res.returncode, (res.stdout + res.stderr).decode("utf-8", "surrogateescape")


def outputs(tmp_path: Path) -> dict[str, tuple[tuple[int, ...], tuple[int, str]]]:
    """Each text output of each command, with a name or file name holding every line break."""
    trace = broken_trace(tmp_path / f"t_bad{BROKEN}.json")  # hand-made: not held to the Perfetto rules
    plain = DATA / "handmade.json"
    bad = tmp_path / f"bad{BROKEN}.json"
    bad.write_bytes(b"{")
    prog = tmp_path / f"prog{BROKEN}.py"
    prog.write_text("import gputrace\nwith gputrace.trace('x'):\n    pass\nprint('done')\n")
    runs: dict[str, tuple[tuple[int, ...], tuple[str | Path, ...]]] = {
        **{f"summarize {f}": ((0,), ("summarize", trace, "-f", f)) for f in ("table", "markdown", "csv")},
        "summarize json": ((0,), ("summarize", trace, "-f", "json")),
        "summarize --group": ((0,), ("summarize", trace, "--group")),
        **{f"diff {f}": ((0,), ("diff", plain, trace, "-f", f)) for f in ("table", "markdown", "json")},
        "diff --fail-above": ((0, 1), ("diff", trace, plain, "--fail-above", "0")),
        "summarize error": ((2,), ("summarize", bad)),
        "diff error": ((2,), ("diff", bad, plain)),
        "merge": ((0,), ("merge", tmp_path / f"m_bad{BROKEN}.json", trace, plain)),
        "summarize merged": ((0,), ("summarize", tmp_path / f"m_bad{BROKEN}.json")),  # the per-rank view
        "merge error": ((2,), ("merge", tmp_path / "m2.json", bad)),
        "view --check": ((0,), ("view", "--check", trace)),
        "view error": ((2,), ("view", "--check", bad)),
        "calibrate": ((0,), ("calibrate", "--backend", "cpu", "--quick", "--no-save", "-o",
                             tmp_path / f"cal{BROKEN}.json")),
        "run": ((0,), ("run", "--backend", "cpu", "-o", tmp_path / f"r{BROKEN}.json", prog)),
        "run warning": ((0,), ("run", "--backend", "cpu", "-o", tmp_path / f"no{BROKEN}" / "r.json", prog)),
        "run error": ((2,), ("run", "--backend", "cpu", tmp_path / f"none{BROKEN}.py")),
        "run option error": ((2,), ("run", "--backend", "cpu", "--trace-function", f"__main__:f{BROKEN}",
                                    prog)),
    }  # fmt: skip
    return {k: (codes, gputrace_cli(*cmd, cwd=tmp_path)) for k, (codes, cmd) in runs.items()}


def test_line_breaks_in_names_never_reach_the_terminal_raw(tmp_path: Path) -> None:
    """A name holding U+2028, U+2029, \\x85, \\x0b, \\x0c, \\x1c-\\x1e or \\r is shown escaped in every
    text output, so a table row stays one line and a message stays one sentence."""
    got = outputs(tmp_path)
    for what, (codes, (rc, text)) in got.items():
        assert rc in codes, (what, rc, text[-2000:])
        assert "Traceback" not in text, (what, text[-2000:])
    raw = {what: sorted(set(RAW_BREAK.findall(text))) for what, (_, (_, text)) in got.items()}
    assert not {k: v for k, v in raw.items() if v}, f"{sum(map(bool, raw.values()))} of {len(raw)}: {raw}"
    unseen = [what for what, (_, (_, text)) in got.items() if "\\u2028" not in text]
    assert not unseen, unseen  # each output did print the name (escaped)


# --- output paths that are not regular files: refused before anything is written ---------------------
def not_a_file(tmp_path: Path, kind: str) -> Path:
    """A FIFO, a folder, a character device (a copy of /dev/null's node, made here: the real
    device nodes are never touched) or a symbolic link to that device, inside ``tmp_path``."""
    path = tmp_path / f"bad_out_{kind}.json"  # "bad": the shared fixture never opens it to check it
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        node = tmp_path / "null_copy"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        if kind == "device":
            path = node
        else:
            path.symlink_to(node)
    return path


def still_there(path: Path, kind: str) -> bool:
    mode = os.stat(path).st_mode
    return {"fifo": stat.S_ISFIFO, "directory": stat.S_ISDIR}.get(kind, stat.S_ISCHR)(mode)


OUT_KINDS = ["fifo", "directory", "device", "link-to-device"]
KIND_WORDS = {"fifo": "a FIFO (named pipe)", "directory": "a directory", "device": "a character device",
              "link-to-device": "a character device"}  # fmt: skip


@pytest.mark.parametrize("kind", OUT_KINDS)
@pytest.mark.parametrize("command", ["merge", "calibrate", "run"])
def test_every_writing_command_refuses_an_output_that_is_not_a_regular_file(
    tmp_path: Path, command: str, kind: str
) -> None:
    out = not_a_file(tmp_path, kind)
    prog = tmp_path / "prog.py"
    prog.write_text("print('the program ran')\n")
    args: dict[str, tuple[str | Path, ...]] = {
        "merge": ("merge", out, DATA / "handmade.json", DATA / "story.json"),
        "calibrate": ("calibrate", "--backend", "cpu", "--quick", "--no-save", "-o", out),
        "run": ("run", "--backend", "cpu", "-o", out, prog),
    }
    rc, text = gputrace_cli(*args[command], cwd=tmp_path)  # a FIFO opened for writing would hang: timeout
    assert rc == 2, text
    why = f"is {KIND_WORDS[kind]}, not a regular file; choose a regular file or a new path."
    assert text == f"gputrace: {out}: {why}\n"
    assert still_there(out, kind)
    if kind == "directory":
        assert os.listdir(out) == []  # nothing was written into it either


@pytest.mark.parametrize("kind", OUT_KINDS)
def test_merge_files_refuses_too(tmp_path: Path, kind: str) -> None:
    from gputrace.errors import GputraceError
    from gputrace.merge import merge_files

    out = not_a_file(tmp_path, kind)
    with pytest.raises(GputraceError, match="not a regular file"):
        merge_files(out, [str(DATA / "handmade.json"), str(DATA / "story.json")])
    assert still_there(out, kind)


# --- a name of 10 MiB: memory stays a small multiple of the file -------------------------------------
PEAK_CHILD = """
import sys
sys.argv = ["gputrace", *sys.argv[1:]]
from gputrace.cli import cli
try:
    cli(prog_name="gputrace")
except SystemExit as exc:
    code = exc.code
print("exit", code, "VmHWM", [x for x in open("/proc/self/status") if x.startswith("VmHWM")][0].split()[1],
      file=sys.stderr)
"""  # VmHWM, not ru_maxrss: that one inherits the high-water mark of pytest's process through exec


def peak_kib(args: list[str], folder: Path) -> int:
    env = child_env()
    with (folder / "stdout").open("wb") as out:  # not into this process
        res = subprocess.run([sys.executable, "-c", PEAK_CHILD, *args], stdout=out, stderr=subprocess.PIPE,
                             cwd=folder, env=env, timeout=300)  # fmt: skip
    last = res.stderr.decode().strip().splitlines()[-1].split()
    assert last[:2] == ["exit", "0"], res.stderr.decode()[-2000:]
    return int(last[3])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak memory from /proc")
def test_a_name_of_10_mib_costs_a_small_multiple_of_the_file(tmp_path: Path) -> None:
    doc = orjson.loads(orjson.dumps(STORY))
    doc["traceEvents"][6]["name"] = "n" * (10 << 20)  # the CPU scope "b"
    big = tmp_path / "long_name_bad.json"
    big.write_bytes(orjson.dumps(doc))
    small = DATA / "handmade.json"
    runs = {
        "diff": ["diff", str(small), "{}"],
        "diff markdown": ["diff", str(small), "{}", "-f", "markdown"],
        "diff json": ["diff", "{}", str(small), "-f", "json"],
        "summarize": ["summarize", "{}"],
        "summarize markdown": ["summarize", "{}", "-f", "markdown"],
        "summarize csv": ["summarize", "{}", "-f", "csv"],
        "summarize json": ["summarize", "{}", "-f", "json"],
        "merge": ["merge", str(tmp_path / "merged_bad.json"), "{}", str(DATA / "story.json")],
    }
    file_kib = big.stat().st_size / 1024
    over = {}
    for what, args in runs.items():
        base = peak_kib([a.format(small) for a in args], tmp_path)
        over[what] = round((peak_kib([a.format(big) for a in args], tmp_path) - base) / file_kib, 1)
        if what == "diff":  # the table shows the name cut, as summarize's table does
            row = (tmp_path / "stdout").read_text().splitlines()[-1]
            assert row.startswith("n" * 39 + "…") and len(row) < 200, row[:300]
    assert max(over.values()) <= 8, over  # diff's table was 28× (each row padded to the name)
