"""A small fault injector: make one function or method raise at its 1st, Nth or every call.

    with inject(FakeBackend, "collect", "every") as fault:
        ...
    assert fault.fired

``target`` is a class or a module; ``name`` the attribute to wrap. The wrapper counts calls and
raises ``InjectedFault`` (a ``RuntimeError``, as a driver would) on the chosen ones; the other
calls go through unchanged. The attribute is restored on exit, whatever happened.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType, ModuleType
from typing import Any

NTH = 3  # the "Nth call" of the suite


class InjectedFault(RuntimeError):
    """Raised by an injected fault."""


@dataclass
class Fault:
    where: str
    mode: str  # "first", "nth" or "every"
    calls: int = 0
    fired: int = 0

    def hit(self) -> bool:
        self.calls += 1
        if self.mode == "every" or (self.mode == "first" and self.calls == 1):
            return True
        return self.mode == "nth" and self.calls == NTH


@contextmanager
def inject(target: Any, name: str, mode: str) -> Iterator[Fault]:
    """Make ``target.name`` raise at the calls ``mode`` picks, for the duration of the block."""
    if mode not in ("first", "nth", "every"):
        raise ValueError(mode)
    own = name in vars(target)
    # not ``own``: inherited, and removing the wrapper afterwards restores it
    raw = vars(target)[name] if own else inspect.getattr_static(target, name)
    fault = Fault(f"{getattr(target, '__name__', target)}.{name}", mode)
    original = getattr(target, name)
    if isinstance(raw, (staticmethod, classmethod)) or not callable(original):
        raise TypeError(f"cannot inject into {fault.where}")

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if fault.hit():
            fault.fired += 1
            raise InjectedFault(f"injected fault in {fault.where} (call {fault.calls})")
        return original(*args, **kwargs)

    setattr(target, name, wrapper)
    try:
        yield fault
    finally:
        if own:
            setattr(target, name, raw)
        else:
            delattr(target, name)


# Faults at the Nth call of any function of a module --------------------------------------------------
# ``inject`` wraps one attribute; a function imported by name elsewhere (``from x import f``) or
# called through a closure escapes it. These count calls by code object instead (a trace hook
# on every thread), so every function a module defines, methods and nested functions included,
# can be made to fail at the Nth call wherever it is called from.
def functions_of(*modules: ModuleType) -> list[CodeType]:
    """The code objects of every function ``modules`` define (methods and nested ones too)."""
    out: dict[CodeType, None] = {}

    def add(code: CodeType) -> None:
        if code in out:
            return
        out[code] = None
        for const in code.co_consts:
            if isinstance(const, CodeType):
                add(const)

    def visit(obj: Any, module: str, depth: int) -> None:
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                if f is not None:
                    visit(f, module, depth)
            return
        code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
        if isinstance(code, CodeType) and getattr(obj, "__module__", None) == module:
            add(code)
        elif isinstance(obj, type) and obj.__module__ == module and depth < 3:
            for v in vars(obj).values():
                visit(v, module, depth + 1)

    for m in modules:
        for v in vars(m).values():
            visit(v, m.__name__, 0)
    return [c for c in out if c.co_name not in ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>")]


def code_name(code: CodeType) -> str:
    mod = Path(code.co_filename).stem
    return f"{mod}.{code.co_qualname if hasattr(code, 'co_qualname') else code.co_name}"


class CallFaults:
    """Counts calls of ``codes`` on every thread; raises ``InjectedFault`` at call ``at`` (over
    all of them together), or never with ``at=0`` (counting only)."""

    def __init__(self, codes: Any, at: int = 0) -> None:
        self.codes = frozenset(codes)
        self.at = at
        self.calls: Counter[CodeType] = Counter()
        self.total = 0
        self.fired = 0
        self.where = ""
        self._lock = threading.Lock()

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or frame.f_code not in self.codes:
            return
        with self._lock:
            self.calls[frame.f_code] += 1
            self.total += 1
            hit = self.total == self.at
            if hit:
                self.fired += 1
                self.where = code_name(frame.f_code)
        if hit:
            raise InjectedFault(f"injected fault in {self.where} (call {self.at})")

    def __enter__(self) -> CallFaults:
        self._old = (sys.getprofile(), threading.getprofile() if hasattr(threading, "getprofile") else None)
        threading.setprofile(self._hook)  # type: ignore[arg-type]
        sys.setprofile(self._hook)  # type: ignore[arg-type]
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.setprofile(self._old[0])
        threading.setprofile(self._old[1])  # type: ignore[arg-type]
