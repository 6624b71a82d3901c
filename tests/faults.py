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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
