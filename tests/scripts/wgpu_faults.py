"""A small wgpu program traced with a fault: argv = out timeout_s [target call_no].

``target`` is ``module.attr`` (e.g. ``gputrace.backends.wgpu_queries.wait_mapped``); its call
``call_no`` raises. Run in a subprocess: a wgpu-native panic aborts the interpreter. Prints
``RESULT <values> ERRORS <n>`` where ERRORS counts exceptions other than the documented
``GputraceError`` of a ``sync()`` that timed out.
"""

import importlib
import os
import sys

sys.path.insert(0, os.environ.get("GPUTRACE_ROOT", os.getcwd()))

import numpy as np
import wgpu

import gputrace
from tests.faults import InjectedFault

STEPS = 12
out, timeout_s = sys.argv[1], float(sys.argv[2])
if len(sys.argv) > 3:
    modname, name = sys.argv[3].rsplit(".", 1)
    mod = importlib.import_module(modname)
    original = getattr(mod, name)
    nth, calls = int(sys.argv[4]), [0]

    def faulty(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == nth:
            raise InjectedFault(f"injected fault in {sys.argv[3]} (call {nth})")
        return original(*args, **kwargs)

    for where in (modname, "gputrace.backends.wgpu_hooks", "gputrace.backends.wgpu"):  # imported by name
        m = importlib.import_module(where)
        if getattr(m, name, None) is original:
            setattr(m, name, faulty)

SHADER = """
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    if (i < arrayLength(&data)) { data[i] = data[i] * 2.0 + 1.0; }
}
"""
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
device = adapter.request_device_sync(required_features=["timestamp-query"])
n = 256
buf = device.create_buffer(size=n * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
module = device.create_shader_module(code=SHADER)
pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
group = device.create_bind_group(
    layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
)
errors = 0


def step() -> None:
    enc = device.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipeline)
    cp.set_bind_group(0, group)
    cp.dispatch_workgroups(n // 64)
    cp.end()
    device.queue.submit([enc.finish()])


options = {"device": device, "page_queries": 4, "calibration_samples": 1, "timeout_s": timeout_s}
try:
    with gputrace.session(out, backend="wgpu", quiet=True, backend_options=options):
        for i in range(STEPS):
            with gputrace.trace("step", i=i):
                step()
            if i % 4 == 3:
                try:
                    gputrace.sync()
                except gputrace.GputraceError as exc:  # documented: a GPU wait that timed out
                    if "did not finish" not in str(exc):
                        raise
except Exception as exc:
    errors += 1
    print(f"ERROR {type(exc).__name__}: {exc}", file=sys.stderr)
for _ in range(4):  # the program goes on using the device after the session
    step()
import gc  # noqa: E402

gc.collect()
data = np.frombuffer(device.queue.read_buffer(buf), np.float32)
print("RESULT", sorted(set(data.tolist())), "ERRORS", errors)
