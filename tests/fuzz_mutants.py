"""Seeded mutants of the real traces in ``tests/data`` and a worker that runs every command on them.

``mutant(seed)`` turns one of the golden traces into a hostile file, the same bytes for the same
seed: byte flips, truncation, inserted or repeated bytes, gzip (then maybe corrupted), and
structural edits of the JSON (wrong types, huge and non-finite numbers, deep nesting, missing
keys, repeated events, control characters and line breaks, huge strings and a 10 MiB name, events
that are not objects).

``python -m tests.fuzz_mutants DIR`` (the worker, run by ``tests/test_fuzz.py`` in a subprocess
with 1 GiB of address space) runs summarize, diff, merge and view's load path on every mutant in
DIR, each under a 20 s alarm, and prints one JSON line per run plus a last line with its peak
memory.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson

DATA = Path(__file__).parent / "data"
SOURCES = ("handmade.json", "story.json", "story_calibrated.json", "pytorch.json", "rank0.json",
           "before.json")  # fmt: skip
GOOD = str(DATA / "rank1.json")
PER_RUN_TIMEOUT_S = 20

WEIRD: list[Any] = [
    None, True, False, 0, -1, 1.5, -0.0, 2**31, 2**53 + 1, 2**63, 2**64, 2**70, -(2**63) - 1, -(2**70),
    1e15, 1e300, -1e300, 5e-324, "", "0", "10", "NaN", "\x1b[2J", "é", [], [1], [[[]]], {}, {"a": 1},
    {"scope": 0}, "x" * 5000, float("nan"), float("inf"), float("-inf"),
]  # fmt: skip
KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "s", "bp"]
ARG_KEYS = ["scope", "gpu_us", "submit_ts", "uncertainty_us", "flags", "cpu_enqueue_us", "name",
            "sort_index", "exception", "degraded"]  # fmt: skip
HEADER_KEYS = ["format_version", "base_ns", "start_ns", "end_ns", "pid", "rank", "threads", "queues",
               "clock", "clock_pair", "host", "calibration", "spans_cover_children", "processes",
               "backend", "anomalies", "devices"]  # fmt: skip
DEEP = "__DEEP__"
# names that end a line for str.splitlines and terminals: every output must show them escaped
LINE_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
LINE_BREAK_NAMES = ["a\u2028b", "a\u2029b", "a\x85b", "a\x0b\x0cb", "a\x1c\x1d\x1eb", "a\rb"]


def _weird(rng: random.Random) -> Any:
    return copy.deepcopy(rng.choice(WEIRD))  # never one object in two places


def _pick_path(rng: random.Random, doc: Any) -> tuple[Any, Any] | None:
    """A random (container, key) inside ``doc``, preferring events and the header."""
    node = doc
    for _ in range(rng.randint(1, 4)):
        if isinstance(node, dict) and node:
            key: Any = rng.choice(sorted(node))
        elif isinstance(node, list) and node:
            key = rng.randrange(len(node))
        else:
            break
        child = node[key]
        if not isinstance(child, (dict, list)) or not child or rng.random() < 0.3:
            return node, key
        node = child
    return None


def _structural(rng: random.Random, doc: Any) -> None:
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    header = doc.get("gputrace") if isinstance(doc, dict) else None
    kind = rng.choice(["event_field", "arg_field", "header_field", "delete", "repeat", "repeat_all",
                       "not_object", "anywhere", "deep", "name", "drop", "shuffle",
                       "header_list"])  # fmt: skip
    ev = rng.choice(events) if isinstance(events, list) and events else None
    if kind == "event_field" and isinstance(ev, dict):
        ev[rng.choice(KEYS)] = _weird(rng)
    elif kind == "arg_field" and isinstance(ev, dict):
        args = ev.setdefault("args", {})
        if isinstance(args, dict):
            args[rng.choice(ARG_KEYS)] = _weird(rng)
    elif kind == "header_field" and isinstance(header, dict):
        header[rng.choice(HEADER_KEYS)] = _weird(rng)
    elif kind == "delete":
        where = _pick_path(rng, doc)
        if where is not None:
            del where[0][where[1]]
    elif kind == "repeat" and isinstance(events, list) and events:
        events.insert(rng.randrange(len(events) + 1), copy.deepcopy(rng.choice(events)))
    elif kind == "repeat_all" and isinstance(events, list):
        events.extend(copy.deepcopy(events))
    elif kind == "not_object" and isinstance(events, list) and events:
        events[rng.randrange(len(events))] = _weird(rng)
    elif kind == "anywhere":
        where = _pick_path(rng, doc)
        if where is not None:
            where[0][where[1]] = _weird(rng)
    elif kind == "deep" and isinstance(ev, dict):
        ev.setdefault("args", {})
        if isinstance(ev["args"], dict):
            ev["args"]["deep"] = DEEP
    elif kind == "name" and isinstance(ev, dict):
        ev["name"] = rng.choice(["\x1b]0;title\x07", "\x9b31m", "a\u202eb", "\ud800", "x" * 100_000,
                                 "\x00", "", "名前", *LINE_BREAK_NAMES, "n" * (10 << 20)])  # fmt: skip
    elif kind == "drop" and isinstance(events, list) and events:
        del events[rng.randrange(len(events)) :]
    elif kind == "shuffle" and isinstance(events, list):
        rng.shuffle(events)
    elif kind == "header_list" and isinstance(header, dict):
        lst = header.get(rng.choice(["threads", "queues", "clock", "processes"]))
        if isinstance(lst, list) and lst:
            item = rng.choice(lst)
            if isinstance(item, dict) and item:
                item[rng.choice(sorted(item))] = _weird(rng)


def _dumps(rng: random.Random, doc: Any) -> bytes:
    text = json.dumps(doc, allow_nan=True)  # NaN/Infinity tokens and >64-bit integers, as written
    if DEEP in text:
        depth = rng.choice([100, 254, 256, 300, 600, 1000, 1023, 1100, 5000])
        opener = rng.choice(["[", '{"k":'])
        closer = "]" if opener == "[" else "}"
        text = text.replace(f'"{DEEP}"', opener * depth + "1" + closer * depth)
    return text.encode()


def _bytes(rng: random.Random, raw: bytes) -> bytes:
    kind = rng.choice(["flip", "truncate", "insert", "repeat", "zero_run"])
    b = bytearray(raw)
    if kind == "flip":
        for _ in range(rng.randint(1, 8)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == "truncate":
        del b[rng.randrange(len(b) + 1) :]
    elif kind == "insert":
        at = rng.randrange(len(b) + 1)
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    elif kind == "repeat" and b:
        i = rng.randrange(len(b))
        j = min(len(b), i + rng.randint(1, 4096))
        b[j:j] = b[i:j] * rng.randint(1, 4)
    elif kind == "zero_run":
        at = rng.randrange(len(b) + 1)
        b[at:at] = b"\0" * rng.randint(1, 1 << 16)
    return bytes(b)


def mutant(seed: int) -> tuple[str, bytes]:
    """(file name, content) of mutant ``seed``; the same seed gives the same bytes."""
    rng = random.Random(seed)
    source = rng.choice(SOURCES)
    raw = (DATA / source).read_bytes()
    mode = rng.choice(["structural", "structural", "structural", "bytes", "both"])
    if mode in ("structural", "both"):
        doc = orjson.loads(raw)
        for _ in range(rng.randint(1, 3)):
            _structural(rng, doc)
        raw = _dumps(rng, doc)
    if mode in ("bytes", "both"):
        for _ in range(rng.randint(1, 2)):
            raw = _bytes(rng, raw)
    suffix = ".json"
    if rng.random() < 0.2:
        raw = gzip.compress(raw, compresslevel=1, mtime=0)
        suffix = ".json.gz"
        if rng.random() < 0.5:
            raw = _bytes(rng, raw)
    return f"mutant_bad_{seed:05d}_{source.removesuffix('.json')}{suffix}", raw


# --- the worker -----------------------------------------------------------------------------------
class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang


def commands(path: str, out_dir: str, seed: int) -> list[list[str]]:
    fmt = ("table", "json", "csv", "markdown")[seed % 4]
    return [
        ["summarize", path, "-f", fmt],
        ["diff", GOOD, path] if seed % 2 else ["diff", path, GOOD, "-f", "json"],
        ["merge", f"{out_dir}/merged_bad_{seed}.json", path, GOOD],
        ["view", "--check", path],
    ]


def run_one(args: list[str]) -> dict[str, Any]:
    from click.testing import CliRunner

    from gputrace.cli import cli

    t0 = time.perf_counter()
    signal.alarm(PER_RUN_TIMEOUT_S)
    try:
        res = CliRunner().invoke(cli, args)
    except _Hang:  # raised outside click's own handling
        return {"args": args, "hang": True, "seconds": time.perf_counter() - t0}
    finally:
        signal.alarm(0)
    exc = res.exception
    hang = isinstance(exc, _Hang)
    crashed = exc is not None and not isinstance(exc, SystemExit) and not hang
    tb = ""
    if crashed and res.exc_info is not None:
        import traceback

        tb = "".join(traceback.format_exception(*res.exc_info))[-3000:]
    return {
        "args": args,
        "exit": res.exit_code,
        "output": res.output[-2000:],
        "hang": hang,
        "crashed": crashed,
        "traceback": tb,
        "seconds": time.perf_counter() - t0,
    }


def main(directory: str) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    files = sorted(Path(directory).glob("mutant_bad_*"))
    out_dir = Path(directory) / "out"
    out_dir.mkdir(exist_ok=True)
    for f in files:
        seed = int(f.name.split("_")[2])
        for args in commands(str(f), str(out_dir), seed):
            print(json.dumps(run_one(args)), flush=True)
        for m in out_dir.iterdir():
            m.unlink()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_kb": peak_kb}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
