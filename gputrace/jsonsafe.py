"""Turn any Python value from the user's program (scope args, marks, header metadata) into one a
trace file can hold, never by failing: what JSON says exactly is kept, everything else becomes a
short ``repr``, with bounded length, item count and depth.

>>> import math
>>> from decimal import Decimal
>>> from pathlib import PurePosixPath
>>> jsonsafe({"p": PurePosixPath("/tmp/x"), 1: {2, 3}, "n": 2**70, "f": math.nan, "d": Decimal("1.5")})
{'p': '/tmp/x', '1': [2, 3], 'n': '1180591620717411303424', 'f': 'NaN', 'd': "Decimal('1.5')"}
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from gputrace.errors import report_internal

MAX_DEPTH = 32
MAX_ITEMS = 1000  # per list or dict; the rest is summarised as one string item
MAX_STR = 4096  # characters of a string kept
MAX_REPR = 200  # characters of the repr of an object JSON cannot hold
INT_MIN, INT_MAX = -(2**63), 2**64 - 1


def clean_str(s: str, limit: int = MAX_STR) -> str:
    """``s`` bounded to ``limit`` characters, with lone surrogates (not UTF-8) replaced."""
    if len(s) > limit:
        s = s[:limit] + f"…(+{len(s) - limit} chars)"
    if not s.isascii():  # (backslashreplace changes only what UTF-8 cannot encode)
        s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s


def short_repr(value: Any, limit: int = MAX_REPR) -> str:
    """A bounded ``repr`` that never raises (a broken ``__repr__`` gives the type name)."""
    try:
        r = repr(value)  # (a __repr__ returning a non-str makes repr raise TypeError)
    except Exception:
        try:
            r = f"<{type(value).__qualname__} object (repr failed)>"
        except Exception:
            r = "<object (repr failed)>"
    return clean_str(r, limit)


def _child_key(k: Any, failures: list[str] | None) -> str:
    try:
        if isinstance(k, str):
            return clean_str(k, MAX_REPR)
        if isinstance(k, bool) or k is None:
            return "true" if k is True else "false" if k is False else "null"
        if isinstance(k, (int, float)):
            return clean_str(str(k), MAX_REPR)
        return short_repr(k)
    except Exception as exc:
        return _failed(k, exc, failures)


def is_plain(d: dict[Any, Any]) -> bool:
    """True if ``d`` is already JSON-safe and flat (short ASCII str keys; str, int, finite
    float, bool or None values): the common case, checked faster than it is converted."""
    for k, v in d.items():
        if type(k) is not str or len(k) > MAX_REPR or not k.isascii():
            return False
        t = type(v)
        if t is str:
            if len(v) > MAX_STR or not v.isascii():
                return False
        elif t is int:
            if not INT_MIN <= v <= INT_MAX:
                return False
        elif t is float:
            if v - v != 0.0:  # NaN or an infinity
                return False
        elif v is not None and t is not bool:
            return False
    return True


def jsonsafe(value: Any, depth: int = 0, failures: list[str] | None = None) -> Any:
    """``value`` as plain JSON data (see the module doc). Never raises.

    A value whose conversion fails (a ``str`` subclass whose ``__str__`` raises, a list or dict
    subclass whose ``__iter__``, ``items`` or ``__len__`` raises) becomes a placeholder naming
    its type; the values beside it are kept. Each failure is described in ``failures`` if given.

    >>> class Broken(list):
    ...     def __iter__(self): raise RuntimeError("no")
    >>> why: list[str] = []
    >>> jsonsafe({"ok": 1, "bad": Broken([1])}, failures=why), why
    ({'ok': 1, 'bad': '<Broken object (conversion failed)>'}, ['Broken (RuntimeError: no)'])
    """
    return _child(value, depth, set(), failures)


MAX_FAILURES = 10  # failures described per call; the placeholders mark every one


def _failed(value: Any, exc: Exception, failures: list[str] | None) -> str:
    try:
        name = clean_str(str(type(value).__qualname__), 80)
    except Exception:
        name = "object"
    if failures is not None and len(failures) < MAX_FAILURES:
        try:
            text = clean_str(str(exc), 120)
        except Exception:
            text = ""
        why = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
        failures.append(f"{name} ({why})")
    return f"<{name} object (conversion failed)>"  # what stands in the file for it


def _child(value: Any, depth: int, seen: set[int], failures: list[str] | None) -> Any:
    try:
        return _convert(value, depth, seen, failures)
    except Exception as exc:  # one bad item must not cost its siblings
        return _failed(value, exc, failures)


def _convert(value: Any, depth: int, seen: set[int], failures: list[str] | None = None) -> Any:
    if value is None or type(value) is bool:
        return value
    if isinstance(value, str):
        return clean_str(value if type(value) is str else str(value))
    if isinstance(value, int):  # int subclasses (IntEnum, …): the number
        n = int(value)
        return n if INT_MIN <= n <= INT_MAX else str(n) if abs(n) < 10**MAX_REPR else short_repr(n)
    if isinstance(value, float):
        x = float(value)
        return x if math.isfinite(x) else "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")
    if depth >= MAX_DEPTH:
        return short_repr(value, 80)
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        if id(value) in seen:
            return "<recursion>"
        seen.add(id(value))
        try:
            if isinstance(value, dict):
                out: dict[str, Any] = {}
                for i, (k, v) in enumerate(value.items()):
                    if i >= MAX_ITEMS:
                        out["…"] = f"{len(value) - MAX_ITEMS} more items"
                        break
                    out[_child_key(k, failures)] = _child(v, depth + 1, seen, failures)
                return out
            items = value
            if isinstance(value, (set, frozenset)):
                try:
                    items = sorted(value)
                except Exception:
                    items = list(value)
            kept = zip(range(MAX_ITEMS), items, strict=False)
            lst = [_child(v, depth + 1, seen, failures) for _, v in kept]
            if len(value) > MAX_ITEMS:
                lst.append(f"… {len(value) - MAX_ITEMS} more items")
            return lst
        finally:
            seen.discard(id(value))
    # numpy scalars become Python numbers, arrays a short summary, dtypes their name (numpy's
    # scalar types, below, are types: written by their name)
    if isinstance(value, np.generic):
        try:
            item = value.item()
        except Exception:
            return short_repr(value)
        plain = isinstance(item, (bool, int, float, str)) or item is None
        return jsonsafe(item) if plain else short_repr(value)
    if isinstance(value, np.ndarray):
        try:
            return f"ndarray(shape={value.shape}, dtype={value.dtype}) {short_repr(value, 120)}"
        except Exception:
            return short_repr(value)
    if isinstance(value, np.dtype):
        return str(value)
    if isinstance(value, os.PathLike):
        try:
            return clean_str(os.fspath(value))  # type: ignore[arg-type]
        except Exception:
            return short_repr(value)
    if isinstance(value, type):
        return clean_str(value.__qualname__, MAX_REPR)
    return short_repr(value)


def safe_header(header: dict[str, Any]) -> dict[str, Any]:
    """``jsonsafe(header)``; where that fails, key by key (each failing key tried once more), a key
    that still fails left out and named in ``problems``: a placeholder where a reader expects a
    queue or a clock fit would make the file unreadable. Never raises."""
    failures: list[str] = []
    try:
        out = jsonsafe(header, failures=failures)
        if isinstance(out, dict) and not failures:
            return out
    except Exception as exc:
        report_internal("header", f"converting the trace header failed ({type(exc).__name__}: {exc}).")
    out, left_out = {}, []
    for k, v in list(header.items()):
        for _attempt in range(2):
            why: list[str] = []
            try:
                conv = jsonsafe(v, failures=why)
            except Exception as exc:
                why.append(f"{type(exc).__name__}: {exc}")
            if not why:
                out[str(k)] = conv
                break
        else:
            left_out.append(str(k))
    if left_out:
        problems = out.get("problems")
        why_text = f"header fields left out (they could not be converted): {', '.join(left_out)}"
        out["problems"] = [*(problems if isinstance(problems, list) else []), why_text]
    return out


def safe_metadata(metadata: Any) -> dict[str, Any]:
    """``metadata`` as JSON data for the header; a value that fails to convert becomes a marked
    placeholder, reported once."""
    if type(metadata) is dict and not metadata:  # (a subclass's own __len__ may fail)
        return {}
    failures: list[str] = []
    try:
        got = jsonsafe(metadata, failures=failures)
    except Exception as exc:  # (jsonsafe never raises; a fault inside it must not fail start)
        failures.append(f"{type(exc).__name__}: {exc}")
        got = "<metadata (conversion failed)>"
    if failures:
        report_internal(
            "metadata",
            f"a metadata value could not be converted ({failures[0]}); the trace holds a placeholder for it.",
        )
    return got if isinstance(got, dict) else {"value": got}


MAX_WRITE_DEPTH = 200  # orjson writes at most 255 levels; deeper values are replaced by a note


def dumps(value: Any) -> bytes:
    """JSON bytes of ``value``; what orjson refuses (integers beyond 64 bits, nesting deeper than
    it writes, text that is not UTF-8, other objects) is made writable instead of failing:
    integers as floats (as a reader took them), deep nesting by a note, objects by a short repr."""
    import orjson  # (here: ``import gputrace`` need not load it)

    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except (orjson.JSONEncodeError, TypeError):
        return orjson.dumps(_writable(value), option=orjson.OPT_SERIALIZE_NUMPY)


def _writable(value: Any, depth: int = 0) -> Any:
    if isinstance(value, (bool, float)) or value is None:
        return value
    if isinstance(value, int):
        return value if INT_MIN <= value <= INT_MAX else float(value)
    if isinstance(value, str):
        return clean_str(value, len(value))  # whole, with lone surrogates replaced
    if isinstance(value, (dict, list, tuple)):
        if depth >= MAX_WRITE_DEPTH:
            return f"(nested deeper than {MAX_WRITE_DEPTH} levels, not kept)"
        if isinstance(value, dict):
            return {_writable(str(k)): _writable(v, depth + 1) for k, v in value.items()}
        return [_writable(v, depth + 1) for v in value]
    if isinstance(value, (np.generic, np.ndarray)):
        return _writable(value.tolist(), depth)
    return short_repr(value)
