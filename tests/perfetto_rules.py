"""The Perfetto/chrome://tracing import rules (docs/trace-format.md), as a checker for written trace files."""

from __future__ import annotations

import gzip
import math
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson

U32 = 2**32 - 1
PERFETTO_KEYS = ("displayTimeUnit", "metadata", "otherData", "systemTraceEvents")


def read(path: Path) -> Any:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return orjson.loads(raw)


def check_file(path: Path) -> list[str]:
    """The rules ``path`` breaks, for a file gputrace wrote (JSON whole or cut short, or
    ``.pftrace``); other files (deliberately broken inputs, other tools' traces) are left out.
    A file gputrace wrote that does not parse breaks the first rule."""
    raw = path.read_bytes()
    if path.name.endswith((".pftrace", ".perfetto-trace")) and not path.name.endswith(".partial"):
        return check_pftrace(raw)
    if raw[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(31)
        raw = d.decompress(raw)
    if not raw.startswith(b'{"displayTimeUnit":"ms","metadata":{"gputrace_stream":'):
        return []  # not written by gputrace
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        from gputrace.exporters.json import repair

        fixed = repair(raw)  # a streamed file cut short (a killed program): what view serves
        if fixed is None:
            return ["written by gputrace, but neither valid JSON nor a streamed file cut short"]
        doc = orjson.loads(fixed)
    return check(doc)


def expected_counts(path: Path) -> dict[str, Any] | None:
    """What Perfetto's importer must build from a file gputrace wrote: slices per pid (X events,
    instants and waits; for .pftrace its begins and instants), tracks with slices per pid, and
    flows bound at both ends; None for a file gputrace did not write."""
    raw = path.read_bytes()
    slices: dict[int, int] = defaultdict(int)
    if path.name.endswith((".pftrace", ".perfetto-trace")):
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

        msg = pb.Trace()
        msg.ParseFromString(raw)
        desc = {
            p.track_descriptor.uuid: p.track_descriptor for p in msg.packet if p.HasField("track_descriptor")
        }

        def pid(u: int) -> int:
            t = desc[u]
            return int(
                t.thread.pid
                if t.HasField("thread")
                else t.process.pid
                if t.HasField("process")
                else pid(t.parent_uuid)
            )

        outs: Counter[int] = Counter()
        ins: Counter[int] = Counter()
        used: dict[int, set[int]] = defaultdict(set)  # a track per descriptor
        for p in msg.packet:
            if p.HasField("track_event") and p.track_event.type in (1, 3):
                slices[pid(p.track_event.track_uuid)] += 1
                used[pid(p.track_event.track_uuid)].add(p.track_event.track_uuid)
                outs.update(p.track_event.flow_ids)
                ins.update(p.track_event.terminating_flow_ids)
        tracks = {k: len(v) for k, v in used.items()}
        return {"slices": dict(slices), "tracks": tracks, "flows": sum((outs & ins).values())}
    if raw[:2] == b"\x1f\x8b":
        raw = zlib.decompressobj(31).decompress(raw)
    if not raw.startswith(b'{"displayTimeUnit":"ms","metadata":{"gputrace_stream":'):
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None  # a file cut short (a crash, a full disk): gputrace repairs it, Perfetto cannot
    outs: dict[int, tuple[float, float, int]] = {}  # bind id -> (ts, -dur, place in the file)
    ins: dict[int, tuple[float, float, int]] = {}
    threads: dict[int, set[int]] = defaultdict(set)
    begun: dict[tuple[int, bytes], tuple[float, str]] = {}  # a wait's (pid, id) -> its start, name
    waits: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for i, e in enumerate(doc.get("traceEvents", [])):
        ph = e.get("ph")
        if ph in ("X", "i", "b"):
            slices[int(e["pid"])] += 1
        if ph in ("X", "i"):
            threads[int(e["pid"])].add(e.get("tid"))
        elif ph in ("b", "e"):
            key = (int(e["pid"]), orjson.dumps(e.get("id2", e.get("id"))))
            if ph == "b":
                begun[key] = (e["ts"], e.get("name", ""))
            elif key in begun:
                ts, name = begun.pop(key)
                waits[(key[0], name)].append((ts, e["ts"]))
        if ph == "X" and "bind_id" in e:
            (outs if e.get("flow_out") else ins)[e["bind_id"]] = (e["ts"], -e.get("dur", 0), i)
    # Perfetto binds a flow's end only after its start, in the order it reads the slices: by
    # time, a longer slice first at one time, then as in the file (seen in its UI v52: a kernel
    # at its launch call's µs, longer than the call or written before it, gets no flow). So it
    # draws no flow into the past either (a GPU start before its CPU slice, flagged
    # start_before_submit): counted as it draws them
    flows = sum(1 for k, t in outs.items() if k in ins and ins[k] > t)
    # a track per thread; the waits of one name in a process take as many tracks as they need
    # lanes, a lane taken again by a wait that starts after its last one ended (as Perfetto's
    # UI v52 lays them out: checked on every file of a test run)
    tracks = {pid: len(t) for pid, t in threads.items()}
    for (pid, _name), spans in waits.items():
        lanes: list[float] = []
        for start, end in sorted(spans):
            free = next((k for k, last in enumerate(lanes) if last < start), None)
            if free is None:
                lanes.append(end)
            else:
                lanes[free] = end
        tracks[pid] = tracks.get(pid, 0) + len(lanes)
    return {"slices": dict(slices), "tracks": tracks, "flows": flows}


def check_pftrace(raw: bytes) -> list[str]:
    """Through Perfetto's own .proto: every event on a described track, begins and ends
    balanced per track, every flow bound at both ends."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    msg = pb.Trace()
    try:
        msg.ParseFromString(raw)
    except Exception as exc:  # a message that does not parse
        return [f"not a Perfetto trace ({type(exc).__name__})"]
    described = {p.track_descriptor.uuid for p in msg.packet if p.HasField("track_descriptor")}
    depth: dict[int, int] = {}
    outs: list[int] = []
    ins: list[int] = []
    bad: list[str] = []
    for p in msg.packet:
        if not p.HasField("track_event"):
            continue
        te = p.track_event
        if te.track_uuid not in described:
            bad.append(f"an event on track {te.track_uuid}, which no descriptor names")
        depth[te.track_uuid] = depth.get(te.track_uuid, 0) + (te.type == 1) - (te.type == 2)
        if depth[te.track_uuid] < 0:
            bad.append(f"an end with no begin on track {te.track_uuid}")
        outs += te.flow_ids
        ins += te.terminating_flow_ids
    if any(depth.values()):
        bad.append("a begin with no end")
    if sorted(outs) != sorted(ins):
        bad.append("a flow not bound at both ends")
    return bad


def check(doc: Any) -> list[str]:
    """Every rule broken by ``doc`` (an empty list means Perfetto imports it whole)."""
    bad: list[str] = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not the object form with a traceEvents list"]
    # Perfetto's JSON tokenizer stops reading at the first top-level key it does not know
    keys = list(doc)
    unknown = [k for k in keys[: keys.index("traceEvents")] if k not in PERFETTO_KEYS]
    if unknown:
        bad.append(f"top-level keys {unknown} before traceEvents: Perfetto ignores everything after them")
    if doc.get("displayTimeUnit") not in ("ms", "ns"):
        bad.append("displayTimeUnit missing")
    if not isinstance(doc.get("gputrace"), dict):
        bad.append("gputrace header missing")
    slices: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    flows: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    asyncs: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    bound: dict[int, list[str]] = defaultdict(list)
    named_threads = set()
    used_threads = set()
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        for k in ("ts", "dur"):
            if k in e:
                v = e[k]
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                    bad.append(f"{k} not a finite number in {e}")
                    continue
                if v < 0:
                    bad.append(f"negative {k} in {e}")
                if abs(v * 1000 - round(v * 1000)) > 1e-6 * max(1.0, abs(v)):
                    bad.append(f"{k} has more than 3 decimals: {v}")
        for k in ("pid", "tid"):
            if k in e and not (isinstance(e[k], int) and 0 <= e[k] <= U32):
                bad.append(f"{k} outside 0..2^32-1 in {e}")
        if any(k in e for k in ("bind_id", "flow_in", "flow_out")):
            if ph != "X":
                bad.append(f"v2 flow fields outside an X slice: {e}")
            elif not isinstance(e.get("bind_id"), int) or ("flow_in" in e) == ("flow_out" in e):
                bad.append(f"v2 flow needs an integer bind_id and one of flow_in/flow_out: {e}")
            else:
                bound[e["bind_id"]].append("in" if e.get("flow_in") else "out")
        if ph == "M" and e.get("name") == "thread_name":
            named_threads.add((e["pid"], e["tid"]))
        if ph == "X":
            if "dur" not in e:
                bad.append(f"X without dur: {e}")
                continue
            t0 = round(e["ts"] * 1000)
            slices[(e["pid"], e["tid"])].append((t0, t0 + round(e["dur"] * 1000)))
            used_threads.add((e["pid"], e["tid"]))
        elif ph in ("s", "t", "f"):
            if not isinstance(e.get("id"), int):
                bad.append(f"flow id not an integer: {e}")
            if ph == "f" and e.get("bp") != "e":
                bad.append(f"flow end without bp=e: {e}")
            flows[(e.get("cat"), e.get("name"), e.get("id"))].append(e)
        elif ph in ("b", "e"):
            # a plain id puts the slice on a global track, outside its process: id2.local only
            loc = e.get("id2", {}).get("local") if isinstance(e.get("id2"), dict) else None
            if loc is None:
                bad.append(f"async event without id2.local: {e}")
            # Perfetto keys an async slice by (pid, hash of cat and id): both ends need the same
            # cat (or none); the name is the begin's, an end may leave it out
            asyncs[(e.get("pid"), e.get("cat") or None, loc)].append(e)
        elif ph == "C":
            args = e.get("args", {})
            if not args or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                for v in args.values()
            ):
                bad.append(f"counter with non-numeric args: {e}")
        if "args" in e and not isinstance(e["args"], dict):
            bad.append(f"args not an object: {e}")
    for key, lst in slices.items():
        lst.sort(key=lambda x: (x[0], -x[1]))
        stack: list[tuple[int, int]] = []
        for st, en in lst:
            while stack and stack[-1][1] <= st:
                stack.pop()
            if stack and en > stack[-1][1]:
                bad.append(f"partially overlapping X slices on track {key}: {stack[-1]} and {(st, en)}")
                break
            stack.append((st, en))
    for key, evs in flows.items():
        phases = sorted(e["ph"] for e in evs)
        if phases != ["f", "s"]:
            bad.append(f"flow {key} is not one s and one f: {phases}")
            continue
        for e in evs:
            t = round(e["ts"] * 1000)
            if not any(st <= t <= en for st, en in slices.get((e["pid"], e["tid"]), [])):
                bad.append(f"flow {e['ph']} of {key} is not inside a slice on its track")
    if flows and bound:
        bad.append("v1 and v2 flows mixed in one file")
    for fid, ends in bound.items():
        if sorted(ends) != ["in", "out"]:
            bad.append(f"v2 flow {fid} is not bound at both ends: {ends}")
    for key, evs in asyncs.items():
        b = [e for e in evs if e["ph"] == "b"]
        en = [e for e in evs if e["ph"] == "e"]
        if len(b) != 1 or len(en) != 1 or en[0]["ts"] < b[0]["ts"]:
            bad.append(f"async {key} is not one b followed by one e (with the same cat)")
        elif not b[0].get("name"):
            bad.append(f"async {key}: its b has no name (the track and slice take the b's)")
        elif en[0].get("name") and en[0]["name"] != b[0]["name"]:
            bad.append(f"async {key}: its e is named {en[0]['name']!r}, its b {b[0]['name']!r} (no match)")
    for key in used_threads - named_threads:
        bad.append(f"track {key} has no thread_name")
    return bad
