"""``gputrace merge`` never destroys an input, takes each file once, merges whatever ``load``
accepts, and leaves no half-written file behind when a write fails (also for a session)."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

import gputrace
from gputrace.cli import cli
from gputrace.exporters import load
from tests.builders import child_env

DATA = Path(__file__).parents[1] / "data"
ROOT = Path(__file__).parents[2]


@pytest.fixture
def ranks(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    shutil.copy(DATA / "rank0.json", a)
    shutil.copy(DATA / "rank1.json", b)
    return a, b


def merge(*args: str | Path) -> Any:
    return CliRunner().invoke(cli, ["merge", *map(str, args)])


def one_line_failure(res: Any) -> str:
    assert res.exit_code == 2, res.output
    assert isinstance(res.exception, SystemExit), repr(res.exception)
    line: str = res.output.strip()
    assert "\n" not in line and "Traceback" not in line, line
    return line


# --- item: an input is never overwritten, a file is taken once --------------------------------------
@pytest.mark.parametrize("spelling", ["same", "dot", "symlink", "hardlink"])
def test_output_that_is_an_input_is_refused(ranks: tuple[Path, Path], spelling: str) -> None:
    a, b = ranks
    before = a.read_bytes()
    out = {"same": a, "dot": a.parent / "." / a.name, "symlink": a.parent / "link.json",
           "hardlink": a.parent / "hard.json"}[spelling]  # fmt: skip
    if spelling == "symlink":
        out.symlink_to(a)
    elif spelling == "hardlink":
        os.link(a, out)
    line = one_line_failure(merge(out, a, b))
    assert line == (
        f"gputrace: {out}: is also an input, and merging would overwrite it; choose another output file."
    )
    assert a.read_bytes() == before
    assert not list(a.parent.glob("*.partial"))


def test_the_same_file_given_twice_is_refused(ranks: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = ranks
    out = tmp_path / "out.json"
    assert one_line_failure(merge(out, a, a, b)) == (
        f"gputrace: {a}: it is given twice; give each trace to merge once."
    )
    other = f"{tmp_path}/./a.json"
    assert one_line_failure(merge(out, a, b, other)) == (
        f"gputrace: {other}: it is the same file as {a}; give each trace to merge once."
    )
    assert not out.exists()
    with pytest.raises(gputrace.GputraceError, match="given twice"):
        from gputrace.merge import merge_files

        merge_files(out, [str(a), str(a)])


# --- item: what load accepts, merge merges --------------------------------------------------------
def _nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def _with(path: Path, edit: Any) -> Path:
    doc = orjson.loads((DATA / "rank0.json").read_bytes())
    edit(doc)
    import json

    text = json.dumps(doc)  # the standard library writes integers beyond 64 bits
    path.write_text(text.replace('"DEEP"', "[" * 1000 + "1" + "]" * 1000))
    return path


def _first_cpu(doc: dict[str, Any]) -> dict[str, Any]:
    # a scope's CPU slice: an X event without a category in a Python process
    return next(e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu")


EDITS = {
    "cpu_ref_ns_2_64": lambda d: d["gputrace"]["clock"][0].update(cpu_ref_ns=2**64),
    "clock_values_2_70": lambda d: d["gputrace"]["clock"][0].update(first_cpu_ns=2**70, last_cpu_ns=-(2**70)),
    "args_256_deep": lambda d: _first_cpu(d).setdefault("args", {}).update(deep=_nested(256)),
    "args_1000_deep": lambda d: _first_cpu(d).setdefault("args", {}).update(deep="DEEP"),
    "args_big_int": lambda d: _first_cpu(d).setdefault("args", {}).update(n=2**70),
}  # fmt: skip


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_merge_takes_what_load_takes(tmp_path: Path, edit: str) -> None:
    src = _with(tmp_path / "odd_input_bad.json", EDITS[edit])
    assert CliRunner().invoke(cli, ["summarize", str(src)]).exit_code == 0  # load accepts it
    out = tmp_path / "merged.json"
    res = merge(out, src, DATA / "rank1.json")
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    merged = load(out)
    assert len(merged) == 2
    assert CliRunner().invoke(cli, ["summarize", str(out)]).exit_code == 0


def test_non_utf8_file_names_merge_and_view(tmp_path: Path) -> None:
    """A file name that is not UTF-8 (bytes from another system) works and is shown escaped."""
    d = os.fsencode(tmp_path)
    a, out = d + b"/r\xff0.json", d + b"/m\xfe.json"
    with open(a, "wb") as f:
        f.write((DATA / "rank0.json").read_bytes())
    env = child_env()
    r = subprocess.run([sys.executable, "-m", "gputrace", "merge", out, a, str(DATA / "rank1.json")],
                       capture_output=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert b"Traceback" not in r.stderr
    assert r.stderr.startswith(b"wrote " + d + b"/m\\xfe.json: 2 scopes from 2 traces")
    with open(out, "rb") as f:
        merged = orjson.loads(f.read())
    assert merged["gputrace"]["merged"][0]["file"].endswith("/r\\xff0.json")
    for cmd in (["summarize", a], ["view", "--check", a]):
        r = subprocess.run([sys.executable, "-m", "gputrace", *cmd], capture_output=True, env=env, timeout=60)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
    missing = d + b"/gone\xff.json"
    r = subprocess.run([sys.executable, "-m", "gputrace", "view", "--check", missing], capture_output=True,
                       env=env, timeout=60)  # fmt: skip
    assert r.returncode == 2
    assert r.stderr == b"gputrace: " + d + b"/gone\\xff.json: no such file.\n"


# --- item: a failed write leaves nothing behind -----------------------------------------------------
def test_merge_into_a_directory_leaves_no_partial(ranks: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = ranks
    target = tmp_path / "out.json"
    target.mkdir()
    line = one_line_failure(merge(target, a, b))
    why = "is a directory, not a regular file; choose a regular file or a new path."
    assert line == f"gputrace: {target}: {why}"
    assert not list(tmp_path.rglob("*.partial"))


def _fsize_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))


@pytest.mark.parametrize("name", ["out.json", "out.json.gz"])
def test_merge_that_runs_out_of_space_leaves_no_partial(tmp_path: Path, name: str) -> None:
    """The output outgrows what the process may write (as on a full disk): one line, no file."""
    big = tmp_path / "big.json"
    with gputrace.session(big, backend="fake", quiet=True):
        for i in range(2000):
            with gputrace.trace(f"step {i}"):
                pass
    r = subprocess.run(
        [sys.executable, "-m", "gputrace", "merge", str(tmp_path / name), str(big)],
        capture_output=True, text=True, timeout=120, preexec_fn=_fsize_limit,
        env=child_env(),
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"gputrace: {tmp_path / name}: cannot be written (File too large).\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.json"]


def test_full_disk_during_a_session_write_leaves_no_partial(tmp_path: Path, monkeypatch: Any) -> None:
    """ENOSPC halfway through the write: the error is the disk's, and no .partial is left."""
    from gputrace import exporters
    from gputrace.exporters import json as json_format

    real = os.write

    def half_then_enospc(fd: int, data: Any) -> int:
        real(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json_format.os, "write", half_then_enospc)
    res = merge(tmp_path / "m.json", DATA / "rank0.json", DATA / "rank1.json")
    assert (
        one_line_failure(res)
        == f"gputrace: {tmp_path / 'm.json'}: cannot be written (No space left on device)."
    )
    with pytest.raises(OSError, match="No space left"):
        exporters.write(gputrace.load(DATA / "rank0.json"), tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []


def test_tiny_tmpfs_full_disk(tmp_path: Path) -> None:
    """A real full disk (a 64 KiB tmpfs), where this machine lets the test mount one."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
    try:
        big = tmp_path / "big.json"
        with gputrace.session(big, backend="fake", quiet=True):
            for i in range(2000):
                with gputrace.trace(f"step {i}"):
                    pass
        res = merge(mnt / "out.json", big)
        assert (
            one_line_failure(res)
            == f"gputrace: {mnt / 'out.json'}: cannot be written (No space left on device)."
        )
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_session_writing_onto_a_directory_leaves_no_partial(tmp_path: Path) -> None:
    target = tmp_path / "t.json"
    target.mkdir()
    with pytest.raises(gputrace.GputraceError, match="is a directory, not a regular file"):
        with gputrace.session(target, backend="fake", quiet=True):  # refused before it starts
            for _ in range(1000):
                with gputrace.trace("s"):
                    pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
