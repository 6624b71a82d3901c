"""Reads of a trace are bounded: special files refused, size capped, gzip inflated under a cap.

Every command that reads a trace (summarize, diff, merge, view) gives the same one sentence and
exit code 2, within seconds and a bounded amount of memory, for files that would otherwise hang
it (a FIFO) or eat all memory (``/dev/zero``, a sparse file, a gzip bomb).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from gputrace.exporters import TraceFileError, load
from gputrace.exporters.opener import human_bytes, parse_size, read_trace
from tests.builders import child_env

DATA = Path(__file__).parents[1] / "data"
ROOT = Path(__file__).parents[2]
GOOD = str(DATA / "handmade.json")
MEMORY_LIMIT = 1 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m gputrace ARGS`` in 1 GiB of address space; a hang fails the test (timeout)."""
    full_env = child_env(OPENBLAS_NUM_THREADS="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "gputrace", *args], capture_output=True, text=True, timeout=timeout,
        env=full_env, preexec_fn=_limit_memory, cwd=ROOT,
    )  # fmt: skip


def every_command(path: str, tmp_path: Path) -> dict[str, list[str]]:
    return {
        "summarize": ["summarize", path],
        "diff": ["diff", GOOD, path],
        "merge": ["merge", str(tmp_path / "out_merged.json"), path],
        "view": ["view", "--check", path],
    }


def assert_refused_everywhere(path: str, tmp_path: Path, sentence: str, **kw: object) -> None:
    for name, args in every_command(path, tmp_path).items():
        r = cli(*args, **kw)  # type: ignore[arg-type]
        assert r.returncode == 2, (name, r.stderr[-2000:])
        assert r.stderr == f"gputrace: {sentence}\n", (name, r.stderr[-2000:])
    assert not (tmp_path / "out_merged.json").exists()


def test_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe_bad.json"  # "bad": the conftest does not open it
    os.mkfifo(fifo)
    assert_refused_everywhere(
        str(fifo),
        tmp_path,
        f"{fifo}: is a FIFO (named pipe), not a trace file; copy it to a regular file first.",
    )


def test_character_device_is_refused_not_read_forever(tmp_path: Path) -> None:
    assert_refused_everywhere(
        "/dev/zero", tmp_path,
        "/dev/zero: is a character device, not a trace file; copy it to a regular file first.",
    )  # fmt: skip


def test_directory_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "dir_bad.json"
    d.mkdir()
    assert_refused_everywhere(str(d), tmp_path, f"{d}: is a directory, not a trace file.")


def test_sparse_file_is_refused_by_its_size_before_reading(tmp_path: Path) -> None:
    sparse = tmp_path / "sparse_bad.json"
    with sparse.open("wb") as f:
        f.truncate(3 << 30)  # 3 GiB of holes: costs no disk, would cost 3 GiB of memory
    assert_refused_everywhere(
        str(sparse), tmp_path,
        f"{sparse}: too large: 3 GiB on disk, more than the limit of 2 GiB "
        "(set GPUTRACE_MAX_TRACE_BYTES to raise it).",
    )  # fmt: skip


def test_the_limit_is_configurable(tmp_path: Path) -> None:
    path = tmp_path / "big_bad.json"
    path.write_bytes(
        (DATA / "story.json").read_bytes() + b" " * (18_925 - (DATA / "story.json").stat().st_size)
    )
    env = {"GPUTRACE_MAX_TRACE_BYTES": "16K"}
    r = cli("summarize", str(path), env=env)
    assert r.returncode == 2
    assert r.stderr == (
        f"gputrace: {path}: too large: 18.48 KiB on disk, more than the limit of 16 KiB "
        "(set GPUTRACE_MAX_TRACE_BYTES to raise it).\n"
    )
    assert cli("summarize", str(path), env={"GPUTRACE_MAX_TRACE_BYTES": "1M"}).returncode == 0
    bad = cli("summarize", str(path), env={"GPUTRACE_MAX_TRACE_BYTES": "lots"})
    assert bad.returncode == 2
    assert (
        bad.stderr
        == "gputrace: GPUTRACE_MAX_TRACE_BYTES must be a size such as 4G or 500000000, not 'lots'.\n"
    )


def _bomb(path: Path, head: bytes, fill: bytes, size: int) -> None:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = fill * ((1 << 20) // len(fill))
    with path.open("wb") as f:
        f.write(c.compress(head))
        for _ in range(size >> 20):
            f.write(c.compress(block))
        f.write(c.flush())


def test_gzip_bomb_of_zeros_stops_at_its_first_block(tmp_path: Path) -> None:
    bomb = tmp_path / "zeros_bad.json.gz"
    _bomb(bomb, b"", b"\0", 256 << 20)  # 256 MiB inside 250 KB
    assert_refused_everywhere(
        str(bomb), tmp_path, f"{bomb}: not valid JSON (the gzip data does not hold a JSON document)."
    )


def test_gzip_bomb_that_looks_like_json_stops_at_the_ratio_cap(tmp_path: Path) -> None:
    bomb = tmp_path / "spaces_bad.json.gz"
    _bomb(bomb, b'{"traceEvents": [', b" ", 320 << 20)  # 320 MiB of spaces in ~320 KB
    size = human_bytes(bomb.stat().st_size)
    r = cli("summarize", str(bomb))
    assert r.returncode == 2
    assert r.stderr == (
        f"gputrace: {bomb}: too large: its {size} of gzip data expand past 256 MiB, more than 40-fold, "
        "which no trace does (set GPUTRACE_MAX_TRACE_BYTES to read it anyway).\n"
    )
    # with the limit set explicitly, that limit is what stops it
    r = cli("summarize", str(bomb), env={"GPUTRACE_MAX_TRACE_BYTES": "64M"})
    assert r.stderr == (
        f"gputrace: {bomb}: too large: it decompresses to more than the limit of 64 MiB "
        "(set GPUTRACE_MAX_TRACE_BYTES to raise it).\n"
    )


def test_gzip_members_and_corruption(tmp_path: Path) -> None:
    raw = (DATA / "handmade.json").read_bytes()
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    gz = z.compress(raw) + z.flush()
    two = tmp_path / "two_bad.json.gz"  # handmade.json is no Perfetto-valid file
    z1, z2 = zlib.compressobj(6, zlib.DEFLATED, 31), zlib.compressobj(6, zlib.DEFLATED, 31)
    two.write_bytes(z1.compress(raw[:100]) + z1.flush() + z2.compress(raw[100:]) + z2.flush())
    assert len(load(two)) == len(load(DATA / "handmade.json"))  # concatenated members, as gzip(1)
    padded = tmp_path / "padded_bad.json.gz"
    padded.write_bytes(gz + b"\0" * 64)
    assert read_trace(padded)[0] == raw
    for name, content in (("cut_bad.json.gz", gz[:-9]), ("junk_bad.json.gz", gz + b"junk")):
        p = tmp_path / name
        p.write_bytes(content)
        with pytest.raises(TraceFileError, match="the gzip data is truncated or corrupt"):
            load(p)


def test_a_real_sized_trace_reads_whole(tmp_path: Path) -> None:
    """The cap is far above real traces: 40 MB of JSON and its gzip read back byte for byte."""
    raw = b'{"traceEvents": [' + b",".join([b'{"ph": "i", "ts": 1}'] * 2_000_000) + b"]}"
    path = tmp_path / "many_bad.json"
    path.write_bytes(raw)
    assert read_trace(path)[0] == raw
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    path.write_bytes(z.compress(raw) + z.flush())
    assert read_trace(path)[0] == raw


def test_sizes_parse() -> None:
    assert parse_size("2GiB") == parse_size("2G") == 2 << 30
    assert parse_size(" 100 ") == 100
    for bad in ("", "-1", "G", "1Q", "nan"):
        with pytest.raises(Exception, match="must be a size"):
            parse_size(bad)


def test_the_viewers_path_caps_a_gzip_bomb_as_load_does(tmp_path: Path) -> None:
    """A ~600 KB gzip file that starts like a trace and inflates to 600 MB: the viewer's server
    reads it through the same opener as ``load``, so it is refused at the cap (it once took the
    viewer's path to 1.26 GB). The cap is set low here so the peak shows it."""
    import subprocess
    import sys
    import zlib

    bomb = tmp_path / "bomb.json.gz"
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = b" " * (1 << 20)
    bomb.write_bytes(
        z.compress(b'{"traceEvents":[') + b"".join(z.compress(block) for _ in range(600)) + z.flush()
    )
    assert bomb.stat().st_size < 1 << 20
    code = (
        "import sys\nfrom gputrace.errors import GputraceError\n"
        "from gputrace.exporters.json import servable\n"
        "try:\n    servable(sys.argv[1])\nexcept GputraceError as exc:\n    print('refused:', exc)\n"
        # VmHWM, this process's own peak (ru_maxrss keeps the parent's from before exec)
        "print(next(x for x in open('/proc/self/status') if x.startswith('VmHWM')).split()[1])\n"
    )
    env = dict(os.environ, GPUTRACE_MAX_TRACE_BYTES="64M")  # the cap the viewer's path must keep
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")  # this tree's gputrace
    out = subprocess.run(
        [sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("refused:") and "too large" in lines[0]
    assert int(lines[-1]) * 1024 < 300 << 20  # peak memory: about the 64 MiB cap, not the 600 MB inside
