"""Bounded reading of trace files: a size cap, gzip streamed under the cap, regular files only.

A trace file is read whole into memory before it is parsed, so what it may cost is decided
before the read: files that are not regular files (FIFOs, devices, sockets, directories) are
refused without being opened for reading (a FIFO would block forever, ``/dev/zero`` never
ends); a file larger on disk than the limit is refused by its size (a sparse file too); gzip is
decompressed as a stream and stops as soon as the output passes the limit (a "gzip bomb" costs
at most the limit, and one that does not start like JSON stops after its first block): by
ISA-L where python-isal is installed, by zlib otherwise, under the same limits either way.

The limit is 2 GiB of (decompressed) JSON, well above real traces (a million scopes take about
1 GB); ``GPUTRACE_MAX_TRACE_BYTES`` changes it (bytes, or with a K, M, G or T suffix). A gzip
file may also expand at most 40-fold past 256 MiB (traces compress 5–25-fold), so a small bomb
stops early; setting the variable lifts that check.

>>> parse_size("512M"), parse_size("2G"), parse_size("1000")
(536870912, 2147483648, 1000)
>>> human_bytes(2 << 30), human_bytes(1536), human_bytes(12)
('2 GiB', '1.5 KiB', '12 bytes')
"""

from __future__ import annotations

import errno
import functools
import os
import stat
import zlib
from pathlib import Path
from typing import Any, BinaryIO, cast

from gputrace.errors import GputraceError

ENV_VAR = "GPUTRACE_MAX_TRACE_BYTES"
DEFAULT_MAX_BYTES = 2 << 30
_CHUNK = 1 << 20
# Traces compress 5–25-fold; a gzip file that expands more than this is a bomb, not a trace.
# (Past the floor only, and only while GPUTRACE_MAX_TRACE_BYTES is not set.)
MAX_GZIP_RATIO = 40  # real traces compress 5–25-fold; 40 × 20 MB stays under 1 GB of memory
GZIP_RATIO_FLOOR = 256 << 20
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class TraceReadError(GputraceError):
    """A file that cannot be read as a trace's bytes; the message is one sentence naming it."""


def parse_size(text: str) -> int:
    """Bytes from ``"2147483648"``, ``"512M"``, ``"2G"``, ``"2GiB"`` (binary units)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS else ""
    number = t[: len(t) - len(unit)].strip()
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        value = -1.0
    if not (0 < value < 1 << 62):
        raise GputraceError(f"{ENV_VAR} must be a size such as 4G or 500000000, not {text!r}.")
    return int(value)


def _limit_is_set() -> bool:
    return bool(os.environ.get(ENV_VAR, "").strip())


def max_trace_bytes() -> int:
    """The read limit: ``GPUTRACE_MAX_TRACE_BYTES`` if set, else 2 GiB."""
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


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _refuse_special(p: Path, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise TraceReadError(f"{p}: is a directory, not a trace file.")
    if not stat.S_ISREG(mode):
        what = next((w for test, w in _KINDS if test(mode)), "not a regular file")
        raise TraceReadError(f"{p}: is {what}, not a trace file; copy it to a regular file first.")


def read_trace_bytes(
    path: str | os.PathLike[str], limit: int | None = None, *, decompress: bool = True
) -> bytes:
    """The bytes of a trace file, decompressed when it is gzip, never more than ``limit``.

    Raises ``TraceReadError`` with one sentence for a missing, unreadable, special, too large or
    corrupt gzip file. ``limit`` defaults to ``max_trace_bytes()``.
    """
    p = Path(path)
    cap = max_trace_bytes() if limit is None else limit
    try:
        # O_NONBLOCK: a FIFO put in the file's place after the check below must not block open()
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise TraceReadError(f"{p}: no such file.") from None
    except IsADirectoryError:
        raise TraceReadError(f"{p}: is a directory, not a trace file.") from None
    except OSError as exc:
        raise TraceReadError(f"{p}: cannot be read ({exc.strerror or exc}).") from None
    try:
        st = os.fstat(fd)
        _refuse_special(p, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:  # buffered: read(n) returns n bytes unless at the end
        try:
            if st.st_size > cap:
                raise TraceReadError(
                    f"{p}: too large: {human_bytes(st.st_size)} on disk, {_limit_note(cap)}."
                )
            raw = _read_all(f, st.st_size, cap, p)
            if decompress and raw[:2] == b"\x1f\x8b":
                if limit is None and not _limit_is_set():
                    return _gunzip(raw, min(cap, max(GZIP_RATIO_FLOOR, MAX_GZIP_RATIO * len(raw))), p)
                return _gunzip(raw, cap, p)
            return raw
        except OSError as exc:
            if exc.errno == errno.EISDIR:
                raise TraceReadError(f"{p}: is a directory, not a trace file.") from None
            raise TraceReadError(f"{p}: cannot be read ({exc.strerror or exc}).") from None


def _read_all(f: BinaryIO, size: int, cap: int, p: Path) -> bytes:
    """Read to the end, at most ``cap`` bytes (the file may grow while it is read)."""
    first = f.read(size + 1)  # one read of the expected size: no copy for the usual case
    if len(first) <= size:
        return first
    buf = bytearray(first)
    while len(buf) <= cap:
        block = f.read(min(_CHUNK, cap + 1 - len(buf)))
        if not block:
            return bytes(buf)
        buf += block
    raise TraceReadError(f"{p}: too large: {_limit_note(cap)}.")


def gzip_cap(compressed: int) -> int:
    """The most a gzip file of ``compressed`` bytes may expand to (see ``read_trace_bytes``)."""
    cap = max_trace_bytes()
    if not _limit_is_set():
        return min(cap, max(GZIP_RATIO_FLOOR, MAX_GZIP_RATIO * compressed))
    return cap


def gunzip_trace(raw: bytes, path: str | os.PathLike[str]) -> tuple[bytes, bool]:
    """Decompress a gzip trace under the same caps as ``read_trace_bytes``; a stream that ends
    early (a streamed file cut by a killed program) is kept up to where it ends: returns the
    bytes and whether it was cut."""
    cut: list[bool] = []
    return _gunzip(raw, gzip_cap(len(raw)), Path(path), cut), bool(cut)


@functools.cache
def _isal() -> Any:
    """ISA-L's inflate (python-isal's ``igzip_lib``), or None where it is not installed."""
    try:
        from isal import igzip_lib
    except ImportError:
        return None
    return igzip_lib


def _gunzip(raw: bytes, cap: int, p: Path, cut: list[bool] | None = None) -> bytes:
    """Decompress every gzip member of ``raw``, stopping as soon as the output passes ``cap``.
    With ``cut`` given, a stream that ends early is returned up to its end (``cut`` gets True).

    ISA-L inflates whole, valid streams (2–3 times as fast as zlib on traces); a stream it does
    not read to its end (cut short or corrupt) is read again by zlib, as it always was, so cut
    files keep exactly what zlib recovers and errors keep their messages."""
    igzip = _isal()
    if igzip is not None:
        whole = _gunzip_isal(igzip, raw, cap, p)
        if whole is not None:
            return whole
    return _gunzip_zlib(raw, cap, p, cut)


def _take_block(out: bytearray, block: bytes, checked: bool, p: Path, raw_len: int, cap: int) -> bool:
    """Append an inflated block under the cap; the first bytes that are not whitespace must start
    like JSON. Returns whether they were checked."""
    out += block
    if len(out) > cap:
        raise TraceReadError(_too_large_gzip(p, raw_len, cap))
    if not checked and block.strip():
        _check_json_start(block, p)
        return True
    return checked


def _gunzip_isal(igzip: Any, raw: bytes, cap: int, p: Path) -> bytes | None:
    """``_gunzip`` by ISA-L under the same cap and checks; None where a member is not whole."""
    out = bytearray()
    data = memoryview(raw)
    checked = False
    while data:
        d = igzip.IgzipDecompressor(flag=igzip.DECOMP_GZIP)
        try:
            block = d.decompress(data, min(_CHUNK, cap + 1 - len(out)))
            while True:
                checked = _take_block(out, block, checked, p, len(raw), cap)
                if d.eof or d.needs_input or not block:
                    break
                block = d.decompress(b"", min(_CHUNK, cap + 1 - len(out)))
        except (igzip.IsalError, EOFError, ValueError):  # (zlib then says what is wrong)
            return None
        if not d.eof:
            return None
        data = memoryview(d.unused_data)
        if bytes(data[:2]) != b"\x1f\x8b":
            if bytes(data).strip(b"\x00"):
                return None
            break
    return _no_copy(out)


def _gunzip_zlib(raw: bytes, cap: int, p: Path, cut: list[bool] | None = None) -> bytes:
    """``_gunzip`` by zlib: the reference, and what reads cut or corrupt streams."""
    out = bytearray()
    data = memoryview(raw)
    checked = False
    while data:
        d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        pending = data
        try:
            while True:
                block = d.decompress(pending, min(_CHUNK, cap + 1 - len(out)))
                pending = memoryview(d.unconsumed_tail)
                checked = _take_block(out, block, checked, p, len(raw), cap)
                if d.eof or (not pending and not block):
                    break
        except zlib.error:
            if cut is not None and out:
                cut.append(True)
                return _no_copy(out)
            raise TraceReadError(f"{p}: the gzip data is truncated or corrupt.") from None
        if not d.eof:
            if cut is not None:
                cut.append(True)
                return _no_copy(out)
            raise TraceReadError(f"{p}: the gzip data is truncated or corrupt.")
        data = memoryview(d.unused_data)
        if bytes(data[:2]) != b"\x1f\x8b":
            if bytes(data).strip(b"\x00"):  # zero padding after the last member is allowed
                raise TraceReadError(f"{p}: the gzip data is truncated or corrupt.")
            break
    return _no_copy(out)


def _too_large_gzip(p: Path, compressed: int, cap: int) -> str:
    if cap < max_trace_bytes() and not _limit_is_set():
        return (
            f"{p}: too large: its {human_bytes(compressed)} of gzip data expand past "
            f"{human_bytes(cap)}, more than {MAX_GZIP_RATIO}-fold, which no trace does (set {ENV_VAR} "
            "to read it anyway)."
        )
    return f"{p}: too large: it decompresses to {_limit_note(cap)}."


def _check_json_start(head: bytes, p: Path) -> None:
    """A trace is JSON: no need to inflate the rest of a bomb to know that it is not."""
    if bytes(head.lstrip()[:1]) not in (b"{", b"["):
        raise TraceReadError(f"{p}: not valid JSON (the gzip data does not hold a JSON document).")


def _no_copy(out: bytearray) -> bytes:
    """The decompressed bytes as they are: copying up to the cap again would double the peak
    memory; every reader only reads them (a bytearray reads like bytes, orjson included)."""
    return cast(bytes, out)
