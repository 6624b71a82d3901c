"""Size and speed of the Perfetto protobuf format (.pftrace) beside the JSON, on big traces.

    python3 benchmarks/bench_pftrace.py [--scopes 200000] [--repeat 3]

Traces (built in memory, no GPU needed):
- ``cpu``: CPU scopes only (one thread, every other scope nested in the previous one);
- ``tiny``: the shape of the CUDA 20k tiny-kernel session (one GPU scope per ~11 µs iteration:
  3 µs CPU window, submission 1 µs in, kernel 5 µs after submission for 0.9 µs, 4.6 µs alignment
  uncertainty, 4 % of scopes flagged as outliers), on ``time.perf_counter_ns``-sized times;
- ``story``: ``tests/data/story.json`` (nesting, two streams, marks, args) tiled end to end.

For each: bytes per scope (and per GPU scope), whole-file write, streamed write (chunks of 10k
scopes, as a session appends them) and read back, in scopes per second (best of ``--repeat``), in
this process's CPU time: the development machines are shared, and waiting for a core is not the
format's cost. The load average is printed with the table.
Then, where the ``perfetto`` package is installed, the same tiny-kernel packets built through its
protobuf trace builder, for the factor between a well-kept writer and this one.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gputrace  # noqa: E402
from gputrace.exporters import chrome, pftrace  # noqa: E402
from gputrace.model import (  # noqa: E402
    NO_TIME,
    Flag,
    QueueInfo,
    ScopeTable,
    SpanTable,
    ThreadInfo,
    Trace,
    nest,
)

T0 = 1_234_567_890_123  # a perf_counter_ns-sized start


def _header(n_gpu: int) -> dict[str, Any]:
    h = dict(gputrace.load(ROOT / "tests" / "data" / "story.json").header)
    h.update(base_ns=T0, start_ns=T0, pid=4242, clock=[] if not n_gpu else h.get("clock", []))
    return h


def cpu_trace(n: int) -> Trace:
    s = ScopeTable.empty(n)
    i = np.arange(n, dtype=np.int64)
    top = i // 2 * 2
    s.cpu_start_ns = T0 + top * 1_000 + (i % 2) * 150
    s.cpu_end_ns = np.where(i % 2 == 0, s.cpu_start_ns + 900, s.cpu_start_ns + 500)
    s.name = (i % 10).astype(np.int32)
    nest(s)
    names = [f"scope{k}" for k in range(10)]
    return Trace(_header(0), names, [ThreadInfo(4242, "MainThread")], [], s, SpanTable.empty(), [], {})


def tiny_trace(n: int) -> Trace:
    s = ScopeTable.empty(n)
    i = np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(0)
    jitter = rng.integers(0, 400, n)
    s.cpu_start_ns = T0 + i * 11_000 + jitter
    s.cpu_end_ns = s.cpu_start_ns + 3_000 + rng.integers(0, 200, n)
    s.submit_ns = s.cpu_start_ns + 1_000
    s.gpu_start_ns = s.submit_ns + 5_000 + rng.integers(0, 64, n) * 32
    s.gpu_end_ns = s.gpu_start_ns + 896
    s.queue = np.zeros(n, np.int32)
    s.uncertainty_ns = np.full(n, 4_600, np.int64)
    s.flags = np.where(rng.random(n) < 0.04, np.uint32(int(Flag.OUTLIER)), np.uint32(0)).astype(np.uint32)
    s.flags[0] |= np.uint32(int(Flag.COLD))
    sp = SpanTable.empty(n)
    sp.scope = i
    sp.label = np.ones(n, np.int32)
    sp.queue = s.queue.copy()
    sp.submit_ns = s.submit_ns.copy()
    sp.gpu_start_ns = s.gpu_start_ns.copy()
    sp.gpu_end_ns = s.gpu_end_ns.copy()
    q = [QueueInfo(0, "NVIDIA H200", "cuda", "stream 0x7f00")]
    return Trace(_header(n), ["x += 1", ""], [ThreadInfo(4242, "MainThread")], q, s, sp, [], {})


def story_trace(n: int) -> Trace:
    base = gputrace.load(ROOT / "tests" / "data" / "story.json")
    reps = max(1, n // len(base))
    b = base.scopes
    span = int(max(b.cpu_end_ns.max(), b.gpu_end_ns.max()) - b.cpu_start_ns.min()) + 1_000
    s = ScopeTable.empty(len(b) * reps)
    k = np.repeat(np.arange(reps, dtype=np.int64), len(b))
    for col in b.COLUMNS:
        v = np.tile(getattr(b, col), reps)
        if col.endswith("_ns") and col != "uncertainty_ns":
            v = np.where(v != NO_TIME, v + k * span, NO_TIME)
        setattr(s, col, v)
    nest(s)
    s.args = {r * len(b) + i: a for r in range(reps) for i, a in b.args.items()}
    sp = base.spans
    rs = np.repeat(np.arange(reps, dtype=np.int64), len(sp))
    spans = SpanTable(
        np.tile(sp.scope, reps) + rs * len(b), np.tile(sp.label, reps), np.tile(sp.queue, reps),
        np.where(np.tile(sp.submit_ns, reps) != NO_TIME, np.tile(sp.submit_ns, reps) + rs * span, NO_TIME),
        np.tile(sp.gpu_start_ns, reps) + rs * span, np.tile(sp.gpu_end_ns, reps) + rs * span,
    )  # fmt: skip
    marks = [
        type(m)(m.name, m.ts_ns + r * span, m.thread, m.kind, m.args) for r in range(reps) for m in base.marks
    ]
    return Trace(base.header, base.names, base.threads, base.queues, s, spans, marks, base.clock_fits)


def best(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def stream_write(trace: Trace, path: Path, chunk: int) -> None:
    w = pftrace.StreamWriter(path, pftrace._file_header(trace))
    n = len(trace)
    for a in range(0, n, chunk):
        w.append(pftrace.slice_rows(trace, a, min(n, a + chunk), -(2**62) if a == 0 else 2**62, 2**62))
    w.close(pftrace._file_header(trace))


def builder_rate(trace: Trace, n: int) -> float | None:
    """Scopes/s of the perfetto package's protobuf builder for the same packets (no interning
    bookkeeping, no ordering: a lower bound on its cost)."""
    try:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder
    except ImportError:
        return None
    s = trace.scopes
    cols = [c[:n].tolist() for c in (s.cpu_start_ns, s.cpu_end_ns, s.submit_ns, s.gpu_start_ns, s.gpu_end_ns)]
    unc = s.uncertainty_ns[:n].tolist()
    t = time.process_time()
    b = TraceProtoBuilder()
    BEGIN, END, COUNTER = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END, TrackEvent.TYPE_COUNTER
    for r, (c0, c1, sub, g0, g1) in enumerate(zip(*cols, strict=True)):
        for ts, typ, track in (
            (c0, BEGIN, 2),
            (c1, END, 2),
            (g0, BEGIN, 4),
            (g1, END, 4),
            (sub, BEGIN, 6),
            (g0, END, 6),
        ):
            p = b.add_packet()
            p.timestamp = ts
            p.trusted_packet_sequence_id = 1
            e = p.track_event
            e.type = typ
            e.track_uuid = track
            if typ == BEGIN:
                e.name_iid = 1
            if track == 2 and typ == BEGIN:
                e.flow_ids.append(r + 1)
            if track == 4 and typ == BEGIN:
                e.terminating_flow_ids.append(r + 1)
                d = e.debug_annotations.add()
                d.name_iid = 1
                d.int_value = unc[r]
        for ts, v in ((sub, 1), (g1, 0)):
            p = b.add_packet()
            p.timestamp = ts
            p.trusted_packet_sequence_id = 1
            p.track_event.type = COUNTER
            p.track_event.track_uuid = 8
            p.track_event.counter_value = v
    b.serialize()
    return n / (time.process_time() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scopes", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows = []
    traces = {
        "cpu": cpu_trace(args.scopes),
        "tiny": tiny_trace(args.scopes),
        "story": story_trace(args.scopes),
    }
    for label, trace in traces.items():
        n = len(trace)
        n_gpu = int(trace.scopes.has_gpu().sum())
        p = tmp / f"{label}.pftrace"
        w = best(lambda trace=trace, p=p: pftrace.write(trace, p), args.repeat)
        size = p.stat().st_size
        ws = best(lambda trace=trace: stream_write(trace, tmp / "s.pftrace", 10_000), args.repeat)
        r = best(lambda p=p: pftrace.read(p), args.repeat)
        back = pftrace.read(p)
        assert len(back) == n and np.array_equal(back.scopes.gpu_end_ns, trace.scopes.gpu_end_ns)
        j = tmp / f"{label}.json"
        jw = best(lambda trace=trace, j=j: chrome.write(trace, j), 1)
        jr = best(lambda j=j: gputrace.load(j), 1)
        rows.append((label, n, n_gpu, size / n, size / max(n_gpu, 1) if n_gpu else float("nan"),
                     j.stat().st_size / n, n / w, n / ws, n / r, n / jw, n / jr))  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; speeds in process CPU time")
    print(f"{'trace':6} {'scopes':>8} {'gpu':>8} {'B/scope':>8} {'B/gpu':>7} {'json B/s':>9} "
          f"{'write/s':>10} {'stream/s':>10} {'read/s':>10} {'json w/s':>10} {'json r/s':>10}")  # fmt: skip
    for lab, n, g, bs, bg, jb, w, ws, r, jw, jr in rows:
        print(f"{lab:6} {n:8d} {g:8d} {bs:8.1f} {bg:7.1f} {jb:9.0f} {w:10,.0f} {ws:10,.0f} {r:10,.0f} "
              f"{jw:10,.0f} {jr:10,.0f}")  # fmt: skip
    rate = builder_rate(traces["tiny"], 20_000)
    if rate is not None:
        ours = rows[1][6]
        print(f"perfetto package trace builder, same tiny-kernel packets: {rate:,.0f} scopes/s "
              f"(this writer: {ours:,.0f} scopes/s, {ours / rate:.1f}x)")  # fmt: skip
    print("goals: .pftrace <= 150 B per GPU scope; write >= 1 M CPU scopes/s and >= 300k GPU scopes/s; "
          "read >= 500k scopes/s")  # fmt: skip


if __name__ == "__main__":
    main()
