"""Chrome traces written by other tools (PyTorch's profiler, say), read as CPU and GPU slices.

Complete slices (``"ph": "X"`` with numeric ``ts``/``dur``) become scopes. Slices whose ``cat``
is a GPU category (``kernel``, ``gpu_memcpy``, ``gpu_memset``, ``gpu``) become GPU work on a
stream (``args.device``/``args.stream`` when present, else pid/tid); when a CPU slice carries the
same ``args.correlation`` (PyTorch's ``cudaLaunchKernel``), that slice is the GPU work's CPU
enqueue window and its start the submission time. Everything else is CPU-only. There is no clock
fit: the other tool already placed GPU times on its CPU clock.

>>> doc = {"traceEvents": [
...     {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
...      "ts": 10.0, "dur": 5.0, "args": {"correlation": 7}},
...     {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 20.0, "dur": 3.5,
...      "args": {"correlation": 7, "device": 0, "stream": 7}}]}
>>> t = from_chrome(doc, "torch.json")
>>> sc = t.find("gemm")[0]
>>> sc.gpu_ns, sc.queue_gap_ns, sc.cpu_ns
(3500, 10000, 5000)
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from gputrace.exporters.opener import TraceFileError
from gputrace.model import (
    FORMAT_VERSION,
    NO_TIME,
    Flag,
    QueueInfo,
    ScopeTable,
    SpanTable,
    ThreadInfo,
    Trace,
    canonical_names,
    nest,
)

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu"})
ROW_COLUMNS = ("thread", "cpu_start_ns", "cpu_end_ns", "submit_ns", "gpu_start_ns", "gpu_end_ns", "queue")
MAX_ABS_US = 1e16  # absolute epoch µs (~1.7e15) are fine; beyond this it is not a time


def _num(v: Any) -> bool:
    return type(v) in (int, float) and abs(v) < MAX_ABS_US


def from_chrome(doc: Any, where: str) -> Trace:
    """A ``Trace`` from another tool's Chrome trace; ``TraceFileError`` if it has no slices."""
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TraceFileError(f"{where}: not a Chrome trace (no traceEvents list).")
    cpu: list[dict[str, Any]] = []
    gpu: list[dict[str, Any]] = []
    ranges = 0
    for e in events:
        if not (isinstance(e, dict) and e.get("ph") == "X" and _num(e.get("ts")) and _num(e.get("dur"))):
            continue
        if e["dur"] < 0 or e.get("cat") == "Trace":  # (Kineto's "PyTorch Profiler (0)": the session)
            continue
        if e.get("cat") == "gpu_user_annotation":  # a CPU range's span on the stream, not work:
            ranges += 1  # the range's GPU figures come from its kernels
            continue
        (gpu if str(e.get("cat", "")).lower() in GPU_CATS else cpu).append(e)
    if not cpu and not gpu:
        raise TraceFileError(
            f"{where}: a Chrome trace not written by gputrace, with no complete (X) slices to summarize."
        )
    threads: dict[tuple[Any, Any], int] = {}
    queues: dict[tuple[Any, Any], int] = {}
    launch: dict[Any, int] = {}  # correlation id -> cpu row
    rows: list[tuple[str, int, int, int, int, int, int, int]] = []  # name, then ROW_COLUMNS
    home = _overhead_threads(cpu)
    for e in cpu:
        key = home.get(id(e)) or (e.get("pid"), e.get("tid"))
        th = threads.setdefault(key, len(threads))
        c0 = round(e["ts"] * 1000.0)
        c1 = c0 + round(e["dur"] * 1000.0)
        args = e.get("args")
        if isinstance(args, dict) and "correlation" in args:
            with contextlib.suppress(TypeError):  # an unhashable correlation id links nothing
                launch.setdefault(args["correlation"], len(rows))
        rows.append((str(e.get("name", "")), th, c0, c1, NO_TIME, NO_TIME, NO_TIME, -1))
    matched = 0
    for e in gpu:
        raw_args = e.get("args")
        gargs: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        dev = gargs.get("device", e.get("pid"))
        qkey = (dev, gargs.get("stream", e.get("tid")))
        q = queues.setdefault(qkey, len(queues))
        g0 = round(e["ts"] * 1000.0)
        g1 = g0 + round(e["dur"] * 1000.0)
        corr = gargs.get("correlation")
        lr = launch.get(corr) if isinstance(corr, (int, str)) else None
        if lr is not None:
            matched += 1
            _, th, c0, c1, _, _, _, _ = rows[lr]
            rows.append((str(e.get("name", "")), th, c0, c1, c0, g0, g1, q))
        else:
            th = threads.setdefault(("gpu", qkey), len(threads))
            rows.append((str(e.get("name", "")), th, g0, g0, NO_TIME, g0, g1, q))
    rows.sort(key=lambda r: (r[2], r[1], -r[3]))
    ids: dict[str, int] = {}
    s = ScopeTable.empty(len(rows))
    cols = list(zip(*rows, strict=True))
    s.name = np.array([ids.setdefault(nm, len(ids)) for nm in cols[0]], np.int32)
    names = list(ids)
    for col, values in zip(ROW_COLUMNS, cols[1:], strict=True):
        setattr(s, col, np.array(values, getattr(s, col).dtype))
    nest(s)
    from gputrace.flags import flag_outliers

    flags = np.zeros(len(rows), np.int64)
    flags[np.unique(s.name, return_index=True)[1]] |= int(Flag.COLD)  # the first call of each name
    flag_outliers(s, s.has_gpu(), flags)
    s.flags = flags.astype(np.uint32)
    spans = SpanTable.empty(0)
    names = canonical_names(names, s, spans)
    # (each dict numbers its keys in the order they were added)
    thread_infos = [
        ThreadInfo(i, f"pid {k[0]} tid {k[1]}" if k[0] != "gpu" else f"GPU stream {k[1]}")
        for i, k in enumerate(threads)
    ]
    queue_infos = [
        QueueInfo(int(k[0]) if isinstance(k[0], int) else i, f"GPU {k[0]}", "chrome", f"stream {k[1]}")
        for i, k in enumerate(queues)
    ]
    gpu_rows = s.has_gpu()  # (every row has a CPU window: a GPU slice's own start, at least)
    start = int(np.concatenate([s.cpu_start_ns, s.gpu_start_ns[gpu_rows]]).min())
    end = int(np.concatenate([s.cpu_end_ns, s.gpu_end_ns[gpu_rows]]).max())
    note = (
        f"{where} was not written by gputrace: read its {len(cpu)} CPU and {len(gpu)} GPU slices "
        f"({matched} GPU slices matched to their launch); no clock fit, anomaly flags are cold "
        "calls and outliers only."
    )
    if ranges:
        note += (
            f" Its {ranges} GPU spans of record_function ranges (gpu_user_annotation) are not read as work."
        )
    header: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "backend": "other tool",
        "source": "chrome",
        "source_note": note,
        "start_ns": start,
        "base_ns": start,
        "end_ns": end,
        "clock": [],
    }
    top = doc if isinstance(doc, dict) else {}
    host = next((top[k] for k in ("host_name", "hostname") if isinstance(top.get(k), str)), None)
    if host:  # PyTorch's profiler writes the host's name at the top level
        header["host"] = {"name": host}
    return Trace(header, names, thread_infos, queue_infos, s, spans, [], {})


def _overhead_threads(cpu: list[dict[str, Any]]) -> dict[int, tuple[Any, Any]]:
    """Kineto writes the profiler's own overhead ("Activity Buffer Request": CUPTI asking for a
    buffer, inside whatever op was running) on a process of its own (pid -1), without the thread
    it stalled; ``key_averages`` counts it as a child of that op. Each such slice goes to the one
    thread whose slices enclose it (``id`` of the event -> (pid, tid)); none where that is not one."""
    over = [e for e in cpu if e.get("cat") == "overhead" and e.get("pid") == -1]
    if not over:
        return {}
    rest = [e for e in cpu if not (e.get("cat") == "overhead" and e.get("pid") == -1)]
    t0 = np.array([e["ts"] for e in rest], float)
    t1 = t0 + np.array([e["dur"] for e in rest], float)
    out = {}
    for e in over:
        inside = np.flatnonzero((t0 <= e["ts"]) & (t1 >= e["ts"] + e["dur"]))
        keys = {(rest[i].get("pid"), rest[i].get("tid")) for i in inside.tolist()}
        if len(keys) == 1:
            out[id(e)] = keys.pop()
    return out
