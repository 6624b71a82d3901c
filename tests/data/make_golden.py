"""Regenerate the golden trace files next to this script: ``python3 tests/data/make_golden.py``.

Files written by the exporter come from the scripted fake backend and a ``FakeClock`` that only
moves when told (``step_ns=0``), so every CPU and GPU time in them is known exactly:

- ``story.json``: 8 iterations of ``step`` (CPU only) around ``matmul`` (stream 0: cold 50 µs,
  then 20, 21, 22, 23, 200 (an outlier), 20, 21 µs; 3 µs CPU enqueue; starts 5 µs after submission
  unless the stream is busy) and ``copy`` (stream "copy", 4 µs), then one ``noop`` (an empty GPU
  span). ``story_calibrated.json`` is the same with a ``calibration`` header.
- ``before.json`` / ``after.json``: ``conv`` 50 % slower in B, ``relu`` within noise, ``old`` only in
  A, ``new`` only in B.
- ``rank0.json`` / ``rank1.json``: one ``allreduce`` each, at the same realtime instant but on
  session clocks 4 s apart; same pid and tid (as on two hosts) to exercise the renumbering.

Hand-made: ``handmade.json`` (a small trace written as gputrace writes it; numbers in
``HANDMADE`` below) and ``pytorch.json`` (a Chrome trace shaped like PyTorch's profiler output).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

import gputrace
from gputrace.backends.fake import FakeBackend
from gputrace.clock import FakeClock
from gputrace.exporters.json import write

HERE = Path(__file__).resolve().parent

MATMUL_US = [50, 20, 21, 22, 23, 200, 20, 21]
CALIBRATION = {"backend": "fake", "launch_cpu_ns": 2_500.0, "launch_gpu_ns": 2_500.0, "samples": 100}
FIXED_HOST = {"name": "golden", "cpu_count": 4, "loadavg_start": [0.5, 0.4, 0.3],
              "loadavg_end": [0.6, 0.4, 0.3]}  # fmt: skip


def _fixed(trace: gputrace.Trace, **header: Any) -> gputrace.Trace:
    """Replace what depends on the machine that generated the file (pid, host, argv, clock pair)."""
    h = trace.header
    h.pop("calibration", None)  # a calibration saved on this machine must not leak in
    h.update(
        pid=1000,
        rank=None,
        argv=["make_golden.py"],
        host=dict(FIXED_HOST),
        clock_pair={"monotonic_ns": 1_000_000_000, "realtime_ns": 1_700_000_000_000_000_000},
    )
    h.update(header)
    trace.threads[:] = [type(t)(1000 + i, t.name) for i, t in enumerate(trace.threads)]
    return trace


def story() -> gputrace.Trace:
    def script(name: str, i: int) -> tuple[int, int | None]:
        if name == "matmul":
            return 5_000, MATMUL_US[i] * 1_000
        if name == "copy":
            return 2_000, 4_000
        if name == "noop":
            return 1_000, 0
        return 0, None  # "step": the GPU does not time it

    clock = FakeClock(1_000_000_000, 0)
    fb = FakeBackend(clock, offset_ns=123_456, script=script)
    with gputrace.session(backend=fb, clock=clock, quiet=True) as s:
        for _ in range(8):
            with gputrace.trace("step"):
                clock.advance(1_000)
                with gputrace.trace("matmul"):
                    clock.advance(3_000)
                with gputrace.trace("copy", stream="copy"):
                    clock.advance(2_000)
                clock.advance(1_000)
            clock.advance(100_000)
        with gputrace.trace("noop"):
            clock.advance(500)
    assert s.trace is not None
    return _fixed(s.trace)


def diff_pair() -> tuple[gputrace.Trace, gputrace.Trace]:
    def run(after: bool) -> gputrace.Trace:
        def script(name: str, i: int) -> tuple[int, int | None]:
            if name == "conv":
                return 2_000, (30_000 if after else 20_000) + (i % 3) * 100
            if name == "relu":
                return 2_000, (5_100 + ((i + 1) % 4) * 200) if after else 5_000 + (i % 4) * 200
            return 2_000, 1_000

        clock = FakeClock(1_000_000_000, 0)
        with gputrace.session(backend=FakeBackend(clock, script=script), clock=clock, quiet=True) as s:
            for _ in range(8):
                for name in ("conv", "relu", "new" if after else "old"):
                    with gputrace.trace(name):
                        clock.advance(2_000)
                clock.advance(60_000)
        assert s.trace is not None
        return _fixed(s.trace)

    return run(False), run(True)


def ranks() -> list[gputrace.Trace]:
    out = []
    # rank 0: session clock 1.000 s = realtime R; rank 1: session clock 5.000 s = realtime R + 0.5 ms
    for rank, start, pair in ((0, 1_000_000_000, (1_000_000_000, 0)),
                              (1, 4_999_500_000, (5_000_000_000, 500_000))):  # fmt: skip
        clock = FakeClock(start, 0)
        fb = FakeBackend(clock, script=lambda n, i: (1_000, 10_000))
        with gputrace.session(backend=fb, clock=clock, quiet=True) as s:
            clock.advance(100_000)
            with gputrace.trace("allreduce"):  # rank 0 at 1.0001 s, rank 1 at 4.9996 s: one instant
                clock.advance(5_000)
            gputrace.mark("done")
        assert s.trace is not None
        mono, real = pair
        out.append(_fixed(s.trace, rank=rank, clock_pair={
            "monotonic_ns": mono, "realtime_ns": 1_700_000_000_000_000_000 + real}))  # fmt: skip
    return out


# The hand-made trace: "a" on the GPU (cold 50 µs, then 30, 36, 33 µs), "b" CPU only (7, 9 µs).
HANDMADE: dict[str, Any] = {
    "displayTimeUnit": "ms",
    "gputrace": {
        "format_version": 2, "version": "hand", "backend": "fake", "base_ns": 1_000_000,
        "start_ns": 1_000_000, "end_ns": 1_600_000, "pid": 7, "rank": None,
        "clock_pair": {"monotonic_ns": 1_000_000, "realtime_ns": 1_700_000_000_000_000_000},
        "host": {"name": "hand", "cpu_count": 2, "loadavg_start": [1.9, 1.0, 0.5],
                 "loadavg_end": [2.5, 1.2, 0.6]},
        "threads": [{"tid": 7, "name": "MainThread"}],
        "queues": [{"device": 0, "device_name": "Hand GPU", "backend": "fake", "label": "stream 0"}],
        "clock": [{"device": 0, "method": "offset+slope", "gpu_ref_ns": 0, "cpu_ref_ns": 1_000,
                   "offset_ns": 1_000, "slope": 1.0, "drift_ppm": 0.0, "residual_ns": 100.0,
                   "uncertainty_ns": 500.0, "samples": 2, "first_cpu_ns": 1_000_000,
                   "last_cpu_ns": 1_600_000}],
        "anomalies": {"counts": {"cold": 2}, "items": [], "truncated": 0},
    },
    "traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "args": {"name": "python 7"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "MainThread"}},
        {"ph": "X", "cat": "cpu", "name": "a", "pid": 7, "tid": 7, "ts": 10, "dur": 5,
         "args": {"flags": ["cold"]}},
        {"ph": "X", "cat": "cpu", "name": "a", "pid": 7, "tid": 7, "ts": 110, "dur": 5},
        {"ph": "X", "cat": "cpu", "name": "a", "pid": 7, "tid": 7, "ts": 210, "dur": 5},
        {"ph": "X", "cat": "cpu", "name": "a", "pid": 7, "tid": 7, "ts": 310, "dur": 5},
        {"ph": "X", "cat": "cpu", "name": "b", "pid": 7, "tid": 7, "ts": 400, "dur": 7,
         "args": {"flags": ["cold"]}},
        {"ph": "X", "cat": "cpu", "name": "b", "pid": 7, "tid": 7, "ts": 500, "dur": 9},
        *[
            {"ph": "X", "cat": "gpu", "name": "a", "pid": 1 << 30, "tid": 1, "ts": ts, "dur": dur,
             "bind_id": i, "flow_in": True,
             "args": {"submit_ts": sub, "submit_to_start_us": ts - sub, "gpu_us": dur, "cpu_enqueue_us": 5,
                      "uncertainty_us": 0.5, "flags": ["cold"] if i == 0 else []}}
            for i, (ts, dur, sub) in enumerate([(20, 50, 11), (125, 30, 111), (230, 36, 211),
                                                (330, 33, 311)])
        ],
    ],
}  # fmt: skip

# PyTorch profiler shape: cpu_op / cuda_runtime on the host, kernels on device 0 stream 7,
# linked by args.correlation; an ac2g flow and a counter that a reader must ignore.
PYTORCH: dict[str, Any] = {
    "schemaVersion": 1,
    "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 11, "tid": 11, "ts": 1000.0,
         "dur": 20.0, "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 11,
         "ts": 1005.0, "dur": 6.0, "args": {"correlation": 101}},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 1015.0,
         "dur": 40.0, "args": {"correlation": 101, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 11, "tid": 11, "ts": 1100.0,
         "dur": 18.0, "args": {"External id": 2}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 11,
         "ts": 1104.0, "dur": 5.0, "args": {"correlation": 102}},
        {"ph": "X", "cat": "kernel", "name": "sgemm", "pid": 0, "tid": 7, "ts": 1120.0,
         "dur": 44.0, "args": {"correlation": 102, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "pid": 0, "tid": 7,
         "ts": 1170.0, "dur": 3.0, "args": {"device": 0, "stream": 7}},
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 101, "pid": 11, "tid": 11, "ts": 1005.0},
        {"ph": "C", "name": "GPU Memory", "pid": 0, "ts": 1000.0, "args": {"bytes": 1024}},
    ],
}  # fmt: skip


def main() -> None:
    s = story()
    write(s, HERE / "story.json")
    s.header["calibration"] = dict(CALIBRATION)
    write(s, HERE / "story_calibrated.json")
    a, b = diff_pair()
    write(a, HERE / "before.json")
    write(b, HERE / "after.json")
    for i, t in enumerate(ranks()):
        write(t, HERE / f"rank{i}.json")
    for name, doc in (("handmade.json", HANDMADE), ("pytorch.json", PYTORCH)):
        (HERE / name).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")


if __name__ == "__main__":
    main()
