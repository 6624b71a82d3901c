"""A fault at a sampled call of every function of the wgpu backend, its hooks and its queries,
each in its own session over one real device (lavapipe in CI); run in a subprocess (a
wgpu-native panic aborts the interpreter). Prints one JSON line per run, then ``DONE``.

argv: out_dir seed. Each line: {"target", "at", "fired", "seen", "unloadable", "lost"}.
"""

import json
import os
import random
import sys
import warnings
import zlib
from pathlib import Path

sys.path.insert(0, os.environ.get("GPUTRACE_ROOT", os.getcwd()))

import numpy as np
import wgpu

import gputrace
from gputrace.backends import wgpu as wgpu_backend
from gputrace.backends import wgpu_hooks, wgpu_queries
from tests.faults import CallFaults, code_name, functions_of

STEPS = 12
# The traced classes' methods are the user's own wgpu calls: a fault at their very entry is that
# call raising (as wgpu itself may), before any gputrace code could catch it.
USER_CALLS = {
    "wgpu_hooks._TracedDevice.create_command_encoder",
    "wgpu_hooks._TracedEncoder.begin_compute_pass",
    "wgpu_hooks._TracedEncoder.begin_render_pass",
    "wgpu_hooks._TracedEncoder._traced_pass",
    "wgpu_hooks._TracedEncoder.finish",
    "wgpu_hooks._TracedQueue.submit",
}
SHADER = """
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < arrayLength(&data)) { data[i] = data[i] * 2.0 + 1.0; }
}
"""
out_dir, seed = Path(sys.argv[1]), int(sys.argv[2])
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
device = adapter.request_device_sync(required_features=["timestamp-query"])
n = 256
buf = device.create_buffer(
    size=n * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
)
module = device.create_shader_module(code=SHADER)
pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
group = device.create_bind_group(
    layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
)


def program() -> list[float]:
    device.queue.write_buffer(buf, 0, np.zeros(n, np.float32))
    for i in range(STEPS):
        with gputrace.trace("step", i=i):
            enc = device.create_command_encoder()
            cp = enc.begin_compute_pass()
            cp.set_pipeline(pipeline)
            cp.set_bind_group(0, group)
            cp.dispatch_workgroups(n // 64)
            cp.end()
            device.queue.submit([enc.finish()])
        if i % 4 == 3:
            gputrace.sync()
    return sorted(set(np.frombuffer(device.queue.read_buffer(buf), np.float32).tolist()))


def run(path: Path, faults: CallFaults) -> dict[str, object]:
    wgpu_backend.uninstrument(device)  # each session instruments it anew and makes new pages
    device.__dict__.pop("_gputrace_pool", None)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with faults:
            try:
                options = {"device": device, "page_queries": 4, "calibration_samples": 1}
                with gputrace.session(path, backend="wgpu", quiet=True, backend_options=options):
                    if program() != [2.0**STEPS - 1]:
                        seen.append("wrong result")
            except Exception as exc:
                seen.append(f"{type(exc).__name__}: {exc}")
    res: dict[str, object] = {"seen": seen, "unloadable": "", "lost": 0}
    try:
        t = gputrace.load(path)
        lost = t.header.get("lost") or {}
        res["lost"] = STEPS - len(t.find("step")) - int(lost.get("scopes", 0))
        flagged = [
            s for s in t.find("step") if s.flags & gputrace.Flag.DEGRADED and not s.args.get("degraded")
        ]
        if flagged:
            res["seen"] = [*seen, f"{len(flagged)} degraded scopes without a reason"]
    except Exception as exc:
        res["unloadable"] = f"{type(exc).__name__}: {exc}"
    return res


codes = [c for c in functions_of(wgpu_backend, wgpu_hooks, wgpu_queries) if code_name(c) not in USER_CALLS]
census = CallFaults(codes)
run(out_dir / "census.json", census)
for code, calls in sorted(census.calls.items(), key=lambda kv: code_name(kv[0])):
    name = code_name(code)
    at = random.Random(seed ^ zlib.crc32(name.encode())).randint(1, calls)
    f = CallFaults([code], at=at)
    r = run(out_dir / "t.json", f)
    if not f.fired:  # this call count varies from run to run (a poll loop): its first call instead
        at, f = 1, CallFaults([code], at=1)
        r = run(out_dir / "t.json", f)
    print(json.dumps({"target": name, "at": at, "fired": f.fired, **r}), flush=True)
print("DONE", flush=True)
