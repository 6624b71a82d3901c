"""Device probe: gputrace's libcupti source against CUPTI's own walk and cupti-python, same buffers.

    python3 benchmarks/probe_libcupti.py [OUTDIR]      # on the H200 (CuPy, nvidia-cuda-cupti, cupti-python)

Starts the source (timed), runs tiny kernels, a memset and two copies, takes CUPTI's raw buffers,
and for every buffer: record offsets from gputrace's bulk walk vs cuptiActivityGetNextRecord;
every decoded field vs cupti-python's ``Activity*.from_ptr`` on the same record. Prints a table;
saves the raw buffers (npz) to OUTDIR as a fixture for the CPU tests.
"""

import ctypes
import os
import sys
import time

import cupy
import numpy as np

t0 = time.perf_counter_ns()
from gputrace.backends import cupti_records as cr  # noqa: E402
from gputrace.backends.cupti_lib import LibCuptiSource  # noqa: E402

outdir = sys.argv[1] if len(sys.argv) > 1 else "."
x = cupy.zeros(256, cupy.float32)
x += 1  # compile outside the window
cupy.cuda.runtime.deviceSynchronize()
t1 = time.perf_counter_ns()
src = LibCuptiSource()
t2 = time.perf_counter_ns()
src.start()
t3 = time.perf_counter_ns()
print(
    f"import {(t1 - t0) / 1e6:.1f} ms (with cupy warm-up); construct {(t2 - t1) / 1e6:.2f} ms; "
    f"start {(t3 - t2) / 1e6:.2f} ms; version {src.version}; sizes {src.decoder.sizes}"
)
N = int(os.environ.get("N", "5000"))
for _ in range(N):
    x += 1
z = cupy.zeros(1 << 16, cupy.uint8)  # memset
h = x.get()  # DtoH
y = cupy.asarray(h)  # HtoD
src.sync()
t4 = time.perf_counter_ns()
bufs = src.take_buffers()
t5 = time.perf_counter_ns()
print(f"flush+take {(t5 - t4) / 1e6:.2f} ms, {len(bufs)} buffers, {sum(v for _, v in bufs)} B")
lib = src.lib.lib
lib.cuptiActivityGetNextRecord.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)]
lib.cuptiActivityGetNextRecord.restype = ctypes.c_int
from cupti import cupti as cp  # noqa: E402

cls = {
    10: cp.ActivityKernel13,
    4: cp.ActivityAPI,
    5: cp.ActivityAPI,
    1: cp.ActivityMemcpy7,
    2: cp.ActivityMemset5,
}
fields = {
    10: [
        ("start", "start"),
        ("end", "end"),
        ("deviceId", "device_id"),
        ("streamId", "stream_id"),
        ("gridX", "grid_x"),
        ("gridY", "grid_y"),
        ("gridZ", "grid_z"),
        ("blockX", "block_x"),
        ("blockY", "block_y"),
        ("blockZ", "block_z"),
        ("correlationId", "correlation_id"),
        ("graphNodeId", "graph_node_id"),
        ("graphId", "graph_id"),
    ],
    4: [
        ("cbid", "cbid"),
        ("start", "start"),
        ("end", "end"),
        ("processId", "process_id"),
        ("threadId", "thread_id"),
        ("correlationId", "correlation_id"),
        ("returnValue", "return_value"),
    ],
    1: [
        ("copyKind", "copy_kind"),
        ("bytes", "bytes"),
        ("start", "start"),
        ("end", "end"),
        ("deviceId", "device_id"),
        ("streamId", "stream_id"),
        ("correlationId", "correlation_id"),
        ("graphNodeId", "graph_node_id"),
        ("graphId", "graph_id"),
    ],
    2: [
        ("bytes", "bytes"),
        ("start", "start"),
        ("end", "end"),
        ("deviceId", "device_id"),
        ("streamId", "stream_id"),
        ("correlationId", "correlation_id"),
        ("graphNodeId", "graph_node_id"),
        ("graphId", "graph_id"),
    ],
}
fields[5] = fields[4]
dtype = {10: cr.KERNEL, 4: cr.API, 5: cr.API, 1: cr.MEMCPY, 2: cr.MEMSET}
stats = {"records": 0, "offset_mismatch": 0, "field_mismatch": 0, "name_mismatch": 0, "compared": {}}
decode_ns = 0
saved = {}
for bi, (arr, valid) in enumerate(bufs):
    buf = arr[:valid]
    saved[f"buf{bi}"] = buf.copy()
    ta = time.perf_counter_ns()
    dec = src.decoder.decode(buf)
    decode_ns += time.perf_counter_ns() - ta
    starts, problem = src.decoder.starts(buf)
    if problem:
        print("PROBLEM", bi, problem)
    base = arr.ctypes.data
    rec = ctypes.c_void_p(None)
    walk = []
    while lib.cuptiActivityGetNextRecord(base, valid, ctypes.byref(rec)) == 0:
        walk.append(rec.value - base)
    stats["records"] += len(walk)
    if list(starts) != walk:
        stats["offset_mismatch"] += 1
        print("offsets differ", bi, len(starts), len(walk))
    for off in walk:
        kind = int(buf[off : off + 4].view("<u4")[0])
        if kind not in cls:
            key = f"other kind {kind}"
            stats["compared"][key] = stats["compared"].get(key, 0) + 1
            continue
        ours = buf[off : off + dtype[kind].itemsize].view(dtype[kind])[0]
        theirs = cls[kind].from_ptr(base + off)
        stats["compared"][kind] = stats["compared"].get(kind, 0) + 1
        for a, b in fields[kind]:
            if int(ours[a]) != int(getattr(theirs, b)):
                stats["field_mismatch"] += 1
                if stats["field_mismatch"] < 5:
                    print("field", kind, a, int(ours[a]), int(getattr(theirs, b)))
        if kind == 10 and ctypes.string_at(int(ours["name"])).decode() != theirs.name:
            stats["name_mismatch"] += 1
ops, calls = cr.columns(
    [src.decoder.decode(a[:v]) for a, v in bufs], src.names, lambda p: ctypes.string_at(p).decode()
)
print(stats)
print(f"decode {decode_ns / max(stats['records'], 1):.3f} ns/record over {stats['records']} records")
print("ops", len(ops), "calls", len(calls), "names", src.names.names[:6])
print(
    "kernels",
    int((ops["kind"] == 0).sum()),
    "memcpy",
    int((ops["kind"] == 1).sum()),
    "memset",
    int((ops["kind"] == 2).sum()),
)
np.savez_compressed(
    os.path.join(outdir, "cupti_buffers_h200.npz"),
    version=src.version,
    sizes=np.array(sorted(src.decoder.sizes.items())),
    names=np.array(src.names.names),
    **saved,
)
src.stop()
