"""A profiler never breaks the program it profiles, and never loses the trace silently.

Args of any type, stops while other threads are inside scopes, forks, signals during the write,
and GPU times lost to a failing collection or calibration.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import OrderedDict, deque
from decimal import Decimal
from enum import Enum
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

import gputrace
from gputrace.backends.base import Collected
from gputrace.backends.fake import FakeBackend
from gputrace.clock import FakeClock
from gputrace.jsonsafe import MAX_DEPTH, jsonsafe
from gputrace.model import Flag
from tests.builders import child_env

ROOT = Path(__file__).resolve().parents[2]


class Color(Enum):
    RED = 1


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def _deep(n: int) -> Any:
    v: Any = 0
    for _ in range(n):
        v = [v]
    return v


def _cycle() -> Any:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


# The everyday values a program passes as scope args, and what the trace keeps of each.
EVERYDAY: list[tuple[str, Any, Any]] = [
    ("int", 3, 3),
    ("float", 2.5, 2.5),
    ("str", "x", "x"),
    ("bool", True, True),
    ("none", None, None),
    ("list", [1, "a"], [1, "a"]),
    ("tuple", (1, 2), [1, 2]),
    ("dict", {"a": 1}, {"a": 1}),
    ("np.float32 dtype", np.float32, "float32"),
    ("np.dtype", np.dtype("int16"), "int16"),
    ("Path", Path("/tmp/x.bin"), "/tmp/x.bin"),
    ("set", {3, 1, 2}, [1, 2, 3]),
    ("bytes", b"\x00ab", "b'\\x00ab'"),
    ("Decimal", Decimal("1.25"), "Decimal('1.25')"),
    ("int-keyed dict", {1: "a", 2: "b"}, {"1": "a", "2": "b"}),
    ("2**64", 2**64, "18446744073709551616"),
    ("2**70", 2**70, str(2**70)),
    ("-2**70", -(2**70), str(-(2**70))),
    ("np.int64", np.int64(7), 7),
    ("np.float64", np.float64(0.5), 0.5),
    ("np.bool_", np.bool_(True), True),
    ("np.uint64 max", np.uint64(2**64 - 1), 2**64 - 1),
    ("nan", math.nan, "NaN"),
    ("inf", -math.inf, "-Infinity"),
    ("complex", 1 + 2j, "(1+2j)"),
    ("Fraction", Fraction(1, 3), "Fraction(1, 3)"),
    ("Enum", Color.RED, "<Color.RED: 1>"),
    ("OrderedDict", OrderedDict(a=1), {"a": 1}),
    ("deque", deque([1]), "deque([1])"),
    ("lone surrogate", "a\udc80b", "a\\udc80b"),
]


@pytest.mark.parametrize(("label", "value", "want"), EVERYDAY, ids=[e[0] for e in EVERYDAY])
def test_jsonsafe_keeps_what_json_can_say_and_reprs_the_rest(label: str, value: Any, want: Any) -> None:
    assert jsonsafe(value) == want


def test_jsonsafe_bounds_depth_length_and_survives_cycles_and_bad_reprs() -> None:
    deep = jsonsafe(_deep(1000))
    d, depth = deep, 0
    while isinstance(d, list):
        d, depth = d[0], depth + 1
    assert depth == MAX_DEPTH and isinstance(d, str)
    assert jsonsafe(_cycle()) == {"self": "<recursion>"}
    assert jsonsafe(BadRepr()) == "<BadRepr object (repr failed)>"
    assert len(jsonsafe(list(range(5000)))) == 1001
    assert len(jsonsafe("x" * 100_000)) < 5000
    arr = jsonsafe(np.zeros((3, 4), np.float32))
    assert arr.startswith("ndarray(shape=(3, 4), dtype=float32)") and len(arr) < 300
    orjson.dumps(jsonsafe({"all": [v for _, v, _ in EVERYDAY] + [_deep(600), _cycle(), BadRepr()]}))


def test_args_of_every_everyday_type_reach_the_file_and_load_back(tmp_path: Path) -> None:
    out = tmp_path / "args.json"
    with gputrace.session(out, backend="cpu", quiet=True) as s:
        for label, value, _ in EVERYDAY:
            with gputrace.trace(label, v=value):
                pass
        with gputrace.trace("deep", v=_deep(300)), gputrace.trace("cycle", v=_cycle()):
            pass
        with gputrace.trace("array", v=np.arange(10_000)), gputrace.trace("bad", v=BadRepr()):
            pass
        gputrace.mark("mark", when=np.float32(1.5), where=Path("/x"))
    assert s.written == out
    t = gputrace.load(out)
    got = {sc.name: sc.args["v"] for sc in t}
    for label, _, want in EVERYDAY:
        assert got[label] == want, label
    assert got["cycle"] == {"self": "<recursion>"}
    assert got["array"].startswith("ndarray(shape=(10000,), dtype=int64)")
    assert t.marks[0].args == {"when": 1.5, "where": "/x"}


def test_odd_scope_names_and_metadata_never_fail_the_write(tmp_path: Path) -> None:
    out = tmp_path / "names.json"
    with gputrace.session(out, backend="cpu", quiet=True, metadata={"cfg": {1: np.float32}}):
        with gputrace.trace(42), gputrace.trace("bad\udc80name"):  # type: ignore[arg-type]
            pass
        with gputrace.trace(["unhashable"]):  # type: ignore[arg-type]
            pass
    t = gputrace.load(out)
    assert sorted(sc.name for sc in t) == sorted(["42", "bad\\udc80name", "['unhashable']"])
    assert t.header["metadata"] == {"cfg": {"1": "float32"}}


# stop while other threads are inside scopes --------------------------------------------------------
@pytest.mark.parametrize("with_args", [False, True])
def test_stopping_while_threads_are_inside_scopes_never_reaches_them(with_args: bool) -> None:
    errors: list[BaseException] = []
    stop = threading.Event()

    def work() -> None:
        try:
            while not stop.is_set():
                if with_args:
                    with gputrace.trace("w", i=1), gputrace.trace("inner"):
                        pass
                else:
                    with gputrace.trace("w"), gputrace.trace("inner"):
                        pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(2)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: every window between two reads gets hit
    for th in threads:
        th.start()
    try:
        for _ in range(25):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                s = gputrace.session(backend="cpu", quiet=True).start()
                time.sleep(0.002)
                t = s.stop()
            assert not caught, [str(w.message) for w in caught]
            for sc in t:  # every scope kept is whole: closed, or open and flagged unclosed
                assert sc.cpu_end_ns >= sc.cpu_start_ns
                assert bool(sc.args.get("unclosed")) == bool(sc.flags & Flag.DEGRADED)
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        for th in threads:
            th.join()
    assert not errors, errors


# fork ----------------------------------------------------------------------------------------------
def _child_work(i: int) -> int:
    with gputrace.trace("child-work", i=i):
        return i * 2


FORK_PROGRAM = """
import os, sys, multiprocessing as mp, gputrace
sys.path.insert(0, {tests!r})
from test_reliability import _child_work
out = sys.argv[1]
with gputrace.session(out, backend="cpu") as s:
    with gputrace.trace("parent-before"):
        pass
    pid = os.fork()
    if pid == 0:
        with gputrace.trace("in-child"):
            pass
    else:
        assert os.waitpid(pid, 0)[1] == 0
        with mp.get_context("fork").Pool(2) as pool:
            assert pool.map(_child_work, range(4)) == [0, 2, 4, 6]
        with gputrace.trace("parent-after"):
            pass
if pid == 0:
    print("child", s.trace is not None and len(s.trace), s.written)
    sys.stdout.flush()
    os._exit(0)
print("parent", len(s.trace), s.written == __import__("pathlib").Path(out))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_records_nothing_and_never_touches_the_parent_s_file(tmp_path: Path) -> None:
    out = tmp_path / "fork.json"
    code = FORK_PROGRAM.format(tests=str(ROOT / "tests" / "record"))
    for _ in range(3):  # the parent's file was lost in most runs before
        done = subprocess.run(
            [sys.executable, "-c", code, str(out)],
            capture_output=True,
            text=True,
            timeout=60,
            env=child_env(),
        )
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split("\n")[:2]) == ["child 0 None", "parent 2 True"]
        # one notice per forked process (the child, and each pool worker that ran a scope or not)
        notices = [ln for ln in done.stderr.splitlines() if "was forked inside a session" in ln]
        assert 1 <= len(notices) <= 3 and "Traceback" not in done.stderr
        t = gputrace.load(out)
        assert [sc.name for sc in t] == ["parent-before", "parent-after"]


# signals under `gputrace run` ------------------------------------------------------------------------
def _run_in_background(script: Path, out: Path, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gputrace", "run", "-o", str(out), "--backend", "cpu", str(script)],
        cwd=cwd,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_line(stream: Any, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if text in line:
            return
        if not line:
            time.sleep(0.01)
    raise AssertionError(f"{text!r} never printed")


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_sigterm_ends_a_program_with_a_live_thread_promptly_and_writes_the_trace(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    script.write_text(
        "import threading, time, gputrace\n"
        "def spin():\n"
        "    while True:\n"
        "        with gputrace.trace('tick'):\n"
        "            time.sleep(0.01)\n"
        "threading.Thread(target=spin).start()  # not a daemon\n"
        "with gputrace.trace('main'):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
    )
    out = tmp_path / "busy.json"
    proc = _run_in_background(script, out, tmp_path)
    _wait_for_line(proc.stdout, "ready")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == -signal.SIGTERM
    t = gputrace.load(out)
    assert t.find("main") and t.find("main")[0].flags & Flag.ERROR


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("second", ["SIGTERM", "SIGINT"])
def test_a_second_signal_during_the_write_does_not_lose_the_trace(tmp_path: Path, second: str) -> None:
    script = tmp_path / "slow.py"
    script.write_text(
        "import sys, time, gputrace\n"
        "from gputrace import streaming\n"
        "real = streaming.Streamer.close\n"
        "def slow(self, header):\n"
        "    print('writing', flush=True)\n"
        "    time.sleep(1.5)\n"
        "    return real(self, header)\n"
        "streaming.Streamer.close = slow\n"
        "for i in range(100):\n"
        "    with gputrace.trace('step', i=i):\n"
        "        pass\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    out = tmp_path / "slow.json"
    proc = _run_in_background(script, out, tmp_path)
    _wait_for_line(proc.stdout, "ready")
    proc.send_signal(signal.SIGTERM)
    _wait_for_line(proc.stdout, "writing")
    proc.send_signal(getattr(signal, second))
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert len(gputrace.load(out).find("step")) == 100


# GPU times lost: degraded, not "empty" -----------------------------------------------------------
class FailingCollect(FakeBackend):
    def collect(self) -> Collected:
        raise RuntimeError("readback exploded")


class FailingCalibrate(FakeBackend):
    def calibrate(self) -> list[Any]:
        raise RuntimeError("no sample")


@pytest.mark.parametrize("cls", [FailingCollect, FailingCalibrate])
def test_lost_gpu_times_are_flagged_degraded_with_the_reason_not_empty(cls: type) -> None:
    clock = FakeClock(0, 100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gputrace.session(backend=cls(clock), clock=clock, quiet=True) as s:
            with gputrace.trace("k"):
                pass
    assert len([w for w in caught if issubclass(w.category, gputrace.GputraceWarning)]) == 1
    (sc,) = list(s.trace or [])
    assert sc.flags & Flag.DEGRADED and not sc.flags & Flag.EMPTY
    assert ("readback exploded" if cls is FailingCollect else "no sample") in sc.args["degraded"]
    assert s.trace is not None and s.trace.header["problems"]


def test_a_forked_pool_worker_gets_a_notice_not_silence() -> None:
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    code = (
        "import multiprocessing as mp, sys, gputrace\n"
        f"sys.path.insert(0, {str(ROOT / 'tests' / 'record')!r})\n"
        "from test_reliability import _child_work\n"
        "with gputrace.session(backend='cpu', quiet=True) as s:\n"
        "    with mp.get_context('fork').Pool(1) as p:\n"
        "        print(p.map(_child_work, [1]))\n"
        "with gputrace.session(backend='cpu') as s:\n"
        "    with mp.get_context('fork').Pool(1) as p:\n"
        "        print(p.map(_child_work, [2]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[2]", "[4]"]
    assert done.stderr.count("was forked inside a session") == 1  # quiet sessions stay quiet


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_program_that_forks_under_gputrace_run_keeps_one_trace(tmp_path: Path) -> None:
    script = tmp_path / "forks.py"
    script.write_text(
        "import os, gputrace\n"
        "with gputrace.trace('before'):\n"
        "    pass\n"
        "pid = os.fork()\n"
        "with gputrace.trace('child' if pid == 0 else 'parent'):\n"
        "    pass\n"
        "if pid:\n"
        "    os.waitpid(pid, 0)\n"
    )
    out = tmp_path / "forks.json"
    done = subprocess.run(
        [sys.executable, "-m", "gputrace", "run", "-o", str(out), "--backend", "cpu", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("trace written to") == 1  # the parent's; the child writes nothing
    assert done.stderr.count("was forked inside a session") == 1
    assert [sc.name for sc in gputrace.load(out)] == ["before", "parent"]
