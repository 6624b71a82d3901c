"""The one place every trace file is read from: regular files only, a size cap, capped inflate.

A trace is read whole before it is parsed, so what it may cost is decided before the read
(docs/reliability.md, "Reading trace files"): a FIFO, device, socket or directory is refused
without being opened for reading; a file larger on disk than the limit is refused by its size;
gzip is inflated as a stream that stops as soon as the output passes the limit, or after its
first block when it does not start like JSON. The limit is 2 GiB (a million scopes take about
1 GB), set by ``GPUTRACE_MAX_TRACE_BYTES``; without it, a gzip file may also expand at most
40-fold past 256 MiB (traces compress 5–25-fold), so a small bomb stops early.

>>> parse_size("512M"), parse_size("2G"), parse_size("1000")
(536870912, 2147483648, 1000)
>>> human_bytes(2 << 30), human_bytes(1536), human_bytes(12)
('2 GiB', '1.5 KiB', '12 bytes')
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from gputrace.errors import GputraceError
from gputrace.outpath import FILE_KINDS

Progress = Callable[[str], None]  # told what a long read is doing (``gputrace.progress``)

ENV_VAR = "GPUTRACE_MAX_TRACE_BYTES"
DEFAULT_MAX_BYTES = 2 << 30
_CHUNK = 1 << 20
MAX_GZIP_RATIO = 40  # real traces compress 5–25-fold; 40 × 20 MB stays under 1 GB of memory
GZIP_RATIO_FLOOR = 256 << 20  # (the ratio is checked past this size only)
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
EXPORTS = (".pftrace", ".perfetto-trace")  # formats gputrace writes but does not read back
SUFFIXES = (".json", ".json.gz", *EXPORTS)  # the names that pick a format (any other name: JSON)


class TraceFileError(GputraceError):
    """A file that cannot be read as a trace; the message names the file and the problem."""


class NotAGputraceTrace(TraceFileError):
    """Valid JSON (maybe a Chrome trace from another tool), but not written by gputrace."""

    def __init__(self, message: str, document: Any = None) -> None:
        super().__init__(message)
        self.document = document


def canonical(path: str | os.PathLike[str]) -> Path:
    """The file gputrace reads for ``path``: ``path`` itself, or, for an export (``x.pftrace``),
    the ``x.json.gz`` a session writes beside it."""
    p = Path(path)
    ext = next((e for e in EXPORTS if p.name.lower().endswith(e)), None)
    return p if ext is None else p.with_name(p.name[: -len(ext)] + ".json.gz")


def parse_size(text: str) -> int:
    """Bytes from ``"2147483648"``, ``"512M"``, ``"2G"``, ``"2GiB"`` (binary units)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    try:
        value = float(t[: len(t) - len(unit)].strip()) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not (0 < value < 1 << 62):
        raise GputraceError(f"{ENV_VAR} must be a size such as 4G or 500000000, not {text!r}.")
    return int(value)


def max_trace_bytes() -> int:
    text = os.environ.get(ENV_VAR, "").strip()
    return parse_size(text) if text else DEFAULT_MAX_BYTES


def human_bytes(n: int) -> str:
    """``n`` bytes in KiB/MiB/GiB with up to two decimals (trailing zeros dropped)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} bytes"


def _limit_note(limit: int) -> str:
    return f"more than the limit of {human_bytes(limit)} (set {ENV_VAR} to raise it)"


def read_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a regular file as they are on disk, at most ``max_trace_bytes()``."""
    p = Path(path)
    cap = max_trace_bytes()
    try:
        # O_NONBLOCK: a FIFO put in the file's place after the check below must not block open()
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise TraceFileError(f"{p}: no such file.") from None
    except OSError as exc:  # (a directory opens for reading: fstat tells it below)
        raise TraceFileError(f"{p}: cannot be read ({exc.strerror or exc}).") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            what = next((w for test, w in FILE_KINDS if test(st.st_mode)), "not a regular file")
            how = "" if stat.S_ISDIR(st.st_mode) else "; copy it to a regular file first"
            raise TraceFileError(f"{p}: is {what}, not a trace file{how}.")
        size = st.st_size
        if size > cap:
            raise TraceFileError(f"{p}: too large: {human_bytes(size)} on disk, {_limit_note(cap)}.")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:  # buffered: read(n) returns n bytes unless at the end
        try:
            first = f.read(size + 1)  # one read of the expected size: no copy for the usual case
            if len(first) <= size:
                return first
            buf = bytearray(first)  # the file grows while it is read
            while len(buf) <= cap:
                block = f.read(min(_CHUNK, cap + 1 - len(buf)))
                if not block:
                    return bytes(buf)
                buf += block
            raise TraceFileError(f"{p}: too large: {_limit_note(cap)}.")
        except OSError as exc:
            raise TraceFileError(f"{p}: cannot be read ({exc.strerror or exc}).") from None


def read_trace(path: str | os.PathLike[str]) -> tuple[bytes, bool]:
    """The bytes of a trace file, inflated when it is gzip (capped), and whether its
    gzip stream ends early (a streamed file cut by a killed program: kept up to where it ends)."""
    return inflate(read_file(path), Path(path))


def inflate(raw: bytes, p: Path) -> tuple[bytes, bool]:
    """Every gzip member of ``raw`` (``raw`` itself if it is not gzip), stopping as soon as the
    output passes the cap; a stream that ends early is kept up to its end (returned with True)."""
    if raw[:2] != b"\x1f\x8b":
        return raw, False
    limit = max_trace_bytes()
    ratio_cap = max(GZIP_RATIO_FLOOR, MAX_GZIP_RATIO * len(raw))  # (lifted when the variable is set)
    cap = limit if os.environ.get(ENV_VAR, "").strip() else min(limit, ratio_cap)
    out = bytearray()
    data = memoryview(raw)
    checked = False
    while data:
        d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        try:
            while True:
                block = d.decompress(data, min(_CHUNK, cap + 1 - len(out)))
                data = memoryview(d.unconsumed_tail)
                out += block
                if len(out) > cap and cap < limit:
                    raise TraceFileError(
                        f"{p}: too large: its {human_bytes(len(raw))} of gzip data expand past "
                        f"{human_bytes(cap)}, more than {MAX_GZIP_RATIO}-fold, which no trace does "
                        f"(set {ENV_VAR} to read it anyway)."
                    )
                if len(out) > cap:
                    raise TraceFileError(f"{p}: too large: it decompresses to {_limit_note(cap)}.")
                if not checked and block.strip():
                    if bytes(block.lstrip()[:1]) not in (b"{", b"["):  # no need to inflate the rest
                        raise TraceFileError(
                            f"{p}: not valid JSON (the gzip data does not hold a JSON document)."
                        )
                    checked = True
                if d.eof or (not data and not block):
                    break
        except zlib.error:
            if out:
                return cast(bytes, out), True
            raise TraceFileError(f"{p}: the gzip data is truncated or corrupt.") from None
        if not d.eof:
            return cast(bytes, out), True
        data = memoryview(d.unused_data)
        if bytes(data[:2]) != b"\x1f\x8b":
            if bytes(data).strip(b"\x00"):  # zero padding after the last member is allowed
                raise TraceFileError(f"{p}: the gzip data is truncated or corrupt.")
            break
    # (a bytearray reads like bytes for every reader: a copy would double the peak memory)
    return cast(bytes, out), False
