"""Record tests/data/torch_h200.json.gz and torch_h200_key_averages.json on the H200 (torch.profiler).

    python3 tests/data/record_torch_h200.py OUTDIR

A small CUDA torch program for a self-time cross-check: 3 warm-up then 5 profiled steps, each
``record_function("step")`` holding ``record_function("matmul")`` (512x512 float32 a @ b) and
``record_function("act")`` (relu then sum), a synchronize after each step. Writes the Chrome trace
(``export_chrome_trace``, gzipped) and ``key_averages()`` as JSON rows: key, count, CPU and CUDA
self and total times (µs, as torch reports them).
"""

import gzip
import json
import os
import shutil
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

outdir = sys.argv[1] if len(sys.argv) > 1 else "."
a = torch.rand(512, 512, device="cuda")
b = torch.rand(512, 512, device="cuda")
for _ in range(3):
    (torch.relu(a @ b)).sum()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        with record_function("step"):
            with record_function("matmul"):
                c = a @ b
            with record_function("act"):
                d = torch.relu(c).sum()
        torch.cuda.synchronize()
raw = os.path.join(outdir, "torch_h200.json")
prof.export_chrome_trace(raw)
with open(raw, "rb") as f, gzip.open(raw + ".gz", "wb") as g:
    shutil.copyfileobj(f, g)
os.remove(raw)
rows = []
for e in prof.key_averages():
    rows.append(
        {
            "key": e.key,
            "count": e.count,
            "self_cpu_time_total_us": e.self_cpu_time_total,
            "cpu_time_total_us": e.cpu_time_total,
            "self_device_time_total_us": getattr(e, "self_device_time_total", 0.0),
            "device_time_total_us": getattr(e, "device_time_total", 0.0),
        }
    )
with open(os.path.join(outdir, "torch_h200_key_averages.json"), "w") as f:
    json.dump({"torch": torch.__version__, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=12))
