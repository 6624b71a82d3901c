"""A wgpu program that knows nothing of gputrace timing: its device is created without
"timestamp-query". `gputrace run --backend wgpu` must still time its passes."""

import wgpu

import gputrace

adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
device = adapter.request_device_sync()
for i in range(3):
    with gputrace.trace("frame", i=i):
        encoder = device.create_command_encoder()
        compute_pass = encoder.begin_compute_pass()
        compute_pass.end()
        device.queue.submit([encoder.finish()])
