"""Fault census: a fault at call N of every function of the streamer, resolver, exporters and
jsonsafe, for every format, streamed and written at stop; and a short ENOSPC in the middle of a
streamed session. Prints one table of what reached the program and what was lost.

    PYTHONPATH=. python3 benchmarks/fault_census.py [--per-target 3] [--seed 0]

A run counts as a "user exception" when ``start``, the program's scopes, ``sync`` or ``stop``
raised, or when the next session could not start; "unloadable" when ``gputrace.load`` refused
the file; "lost scopes" are scopes neither in the file nor counted as lost in its header.
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gputrace  # noqa: E402
from gputrace import jsonsafe, resolver, streaming  # noqa: E402
from gputrace.backends.fake import FakeBackend  # noqa: E402
from gputrace.clock import session_clock  # noqa: E402
from gputrace.exporters import (  # noqa: E402
    _text,
    canonical,
    pftrace,
    plan,
)
from gputrace.exporters import json as json_format  # noqa: E402
from gputrace.recorder import active_recorder  # noqa: E402
from tests.faults import CallFaults, code_name, functions_of  # noqa: E402

STEPS = 12
# A fault at the very entry of a thread's target has no caller inside gputrace that could catch
# it (its first statement is a ``try``); only the injector can raise there.
NO_CALLER = {"streaming.Streamer.start_timer.<locals>.loop"}
# The session's own guards (in jsonsafe): a fault at their very entry is one in the session's
# lifecycle, which calls them and which this census does not fault (what they call, it does).
GUARDS = {"jsonsafe.safe_header", "jsonsafe.safe_metadata"}
FORMATS = (".json", ".json.gz", ".pftrace")
MODULES = (
    streaming,
    resolver,
    jsonsafe,
    json_format,
    pftrace,
    plan,
    _text,
)


def program() -> int:
    total = 0
    for i in range(STEPS):
        with gputrace.trace("step", i=i):
            total += i
        if i % 4 == 3:
            gputrace.sync()
    return total


def lost_counted(t: gputrace.Trace) -> int:
    lost = t.header.get("lost")
    return int(lost.get("scopes", 0)) if isinstance(lost, dict) else 0


def outcome(path: Path, seen: list[str]) -> dict[str, Any]:
    """What the program saw, and what the file gputrace reads for ``path`` holds (a .pftrace
    session's: the .json.gz beside it): scopes lost without being counted, and counted."""
    out: dict[str, Any] = {"seen": seen, "unloadable": "", "lost": 0, "counted": 0}
    try:
        t = gputrace.load(canonical(path))
        out["lost"] = STEPS - len(t.find("step")) - lost_counted(t)
        out["counted"] = lost_counted(t)
    except Exception as exc:
        out["unloadable"] = f"{type(exc).__name__}: {exc}"
        out["lost"] = STEPS
    return out


def run_once(path: Path, stream: bool, faults: CallFaults) -> dict[str, Any]:
    """One session with ``faults`` armed; what the program saw and what the file holds."""
    seen: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with faults:
            try:
                s = gputrace.session(
                    path, backend=FakeBackend(session_clock), quiet=True, stream=stream, flush_s=3600
                )
                s.start()
            except Exception as exc:
                seen.append(f"start: {type(exc).__name__}: {exc}")
                s = None
            if s is not None:
                try:
                    if program() != sum(range(STEPS)):
                        seen.append("program: wrong result")
                except Exception as exc:
                    seen.append(f"program: {type(exc).__name__}: {exc}")
                try:
                    s._load_at_stop = False  # as ``with session(...)`` does: no read-back at stop
                    s.stop()
                except Exception as exc:
                    seen.append(f"stop: {type(exc).__name__}: {exc}")
        try:
            with gputrace.session(backend="cpu", quiet=True):
                pass
        except Exception as exc:
            seen.append(f"next session: {type(exc).__name__}: {exc}")
            rec = active_recorder()
            if rec is not None:
                rec.deactivate()
    return outcome(path, seen)


def enospc_once(path: Path, at_chunk: int) -> dict[str, Any]:
    """A streamed session whose file write fails with ENOSPC at chunk ``at_chunk`` (once)."""
    real = os.write
    realv = getattr(os, "writev", None)
    fd_of: dict[str, int] = {"n": 0}

    def full(fd: int, data: Any) -> int:
        if fd >= 0 and Path(f"/proc/self/fd/{fd}").resolve() == path.resolve():
            fd_of["n"] += 1
            if fd_of["n"] == at_chunk:
                # part of the chunk goes out, then the disk is full
                done = real(fd, bytes(memoryview(data).cast("B")[: max(1, len(data) // 2)]))
                if done:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    def fullv(fd: int, bufs: Any) -> int:
        return full(fd, b"".join(bytes(b) for b in bufs))

    os.write = full  # type: ignore[assignment]
    if realv is not None:
        os.writev = fullv  # type: ignore[assignment]
    seen: list[str] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                with gputrace.session(path, backend=FakeBackend(session_clock), quiet=True, flush_s=3600):
                    program()
            except Exception as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
    finally:
        os.write = real  # type: ignore[assignment]
        if realv is not None:
            os.writev = realv  # type: ignore[assignment]
    return outcome(path, seen)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-target", type=int, default=3, help="call indices tried per function")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=8, help="examples of each failure kind printed")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    codes = [c for c in functions_of(*MODULES) if code_name(c) not in NO_CALLER | GUARDS]
    totals = {"runs": 0, "seen": 0, "unloadable": 0, "lost": 0, "counted": 0, "targets": set()}
    examples: dict[str, list[str]] = {"seen": [], "unloadable": [], "lost": []}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            for stream in (True, False):
                path = Path(tmp) / f"t{fmt}"
                census = CallFaults(codes, at=0)
                run_once(path, stream, census)
                for code, calls in sorted(census.calls.items(), key=lambda kv: code_name(kv[0])):
                    picks = sorted({1, calls, *rng.sample(range(1, calls + 1), min(calls, args.per_target))})
                    for n in picks[: max(args.per_target, 1)]:
                        f = CallFaults([code], at=n)
                        r = run_once(path, stream, f)
                        if not f.fired:
                            continue
                        totals["runs"] += 1
                        totals["targets"].add((code_name(code), fmt, stream))
                        what = f"{code_name(code)}#{n} {fmt} stream={stream}"
                        if r["seen"]:
                            totals["seen"] += 1
                            examples["seen"].append(f"{what}: {r['seen'][0]}")
                        if r["unloadable"]:
                            totals["unloadable"] += 1
                            examples["unloadable"].append(f"{what}: {r['unloadable']}")
                        totals["counted"] += r["counted"]
                        if r["lost"] > 0:
                            totals["lost"] += r["lost"]
                            examples["lost"].append(f"{what}: {r['lost']} lost")
        enospc = {"files": 0, "unloadable": 0, "lost": 0, "seen": 0, "counted": 0}
        for fmt in FORMATS:
            for at in (2, 3, 4, 5, 6):
                path = Path(tmp) / f"full{at}{fmt}"
                r = enospc_once(path, at)
                enospc["files"] += 1
                enospc["unloadable"] += bool(r["unloadable"])
                enospc["lost"] += r["lost"]
                enospc["seen"] += bool(r["seen"])
                enospc["counted"] += r.get("counted", 0)
                if r["unloadable"]:
                    examples["unloadable"].append(f"ENOSPC at write {at} {fmt}: {r['unloadable']}")
    secs = time.perf_counter() - t0
    print(f"fault census: {len(codes)} functions, {STEPS} scopes a session ({secs:.0f} s)\n")
    print(
        "| what | runs | user-visible exceptions | unloadable files | lost scopes, uncounted "
        "| lost scopes, counted in the header |"
    )
    print("|---|---|---|---|---|---|")
    print(
        f"| a fault at call N ({len(totals['targets'])} function × format × mode) | {totals['runs']} "
        f"| {totals['seen']} | {totals['unloadable']} | {totals['lost']} | {totals['counted']} |"
    )
    print(
        f"| ENOSPC once, mid-session ({len(FORMATS)} formats × 5 chunks) | {enospc['files']} "
        f"| {enospc['seen']} | {enospc['unloadable']} | {enospc['lost']} | {enospc['counted']} |"
    )
    for kind, items in examples.items():
        if items:
            print(f"\n{kind} ({len(items)}), first {args.show}:")
            for line in items[: args.show]:
                print("  ", line[:300])


if __name__ == "__main__":
    main()
