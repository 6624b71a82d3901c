"""Text from a trace file (scope names, hosts, devices, file names) made safe to print.

A trace is untrusted input: a scope name can hold ESC and a whole CSI or OSC sequence (colours,
cursor moves, a window title, a clipboard write through OSC 52) or Unicode bidi overrides that
reorder what the user reads. Everything gputrace prints from a trace goes through ``printable``
(or ``json_safe_text`` for JSON output), which shows such characters as visible escapes:

>>> printable("conv\\x1b]0;pwned\\x07")
'conv\\\\x1b]0;pwned\\\\x07'
>>> printable("ok \\u202eevil"), printable("tab\\there"), printable("one\\u2028row")
('ok \\\\u202eevil', 'tab\\\\x09here', 'one\\\\u2028row')
>>> printable("\\udcff.json")  # a non-UTF-8 file name byte, as Python's surrogateescape gives it
'\\\\xff.json'
>>> json_safe_text('{"name": "a\\x9b2J"}')  # C1 controls become JSON escapes, still valid JSON
'{"name": "a\\\\u009b2J"}'
"""

from __future__ import annotations

import os
import re

# C0 controls, DEL, C1 controls, the Unicode line and paragraph separators (terminals, editors
# and str.splitlines break lines at them, as at \x0b, \x0c, \x1c-\x1e and \x85), bidi
# embeddings/overrides/isolates, and surrogates
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
# in JSON text the encoder already escapes C0 inside strings, and newlines outside them are layout
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    cp = ord(m.group())
    if cp < 0x100:
        return f"\\x{cp:02x}"
    if 0xDC80 <= cp <= 0xDCFF:  # surrogateescape: the original byte of a non-UTF-8 name
        return f"\\x{cp - 0xDC00:02x}"
    return f"\\u{cp:04x}"


def printable(text: str) -> str:
    """``text`` with control, bidi and surrogate characters shown as ``\\xNN`` / ``\\uNNNN``."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def printable_lines(text: str) -> str:
    """Several lines of text, each made ``printable``; only ``\\n`` still ends a line."""
    return "\n".join(map(printable, text.split("\n")))


NAME_CHARS = 1000  # the longest name the recorder keeps; longer ones come from hand-made files


def printable_cut(text: str, limit: int = NAME_CHARS) -> str:
    """``text`` made ``printable``, at most ``limit`` characters (``…`` marks a cut), for a table
    cell: a name of megabytes is unreadable there, and each copy of a row would hold it."""
    shown = printable(text[: limit + 1])  # escaping only what can be shown
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def json_safe_text(text: str) -> str:
    """JSON text with the characters ``printable`` escapes written as ``\\uNNNN`` (same value)."""
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def path_text(path: str | os.PathLike[str]) -> str:
    """A file name as text that encodes as UTF-8 (undecodable bytes shown as ``\\xNN``)."""
    return printable(os.fsdecode(path))
