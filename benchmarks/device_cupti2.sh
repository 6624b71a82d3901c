#!/bin/bash
# The device run for CUPTI memory / stop / self-check (about 2.5 minutes on the H200): the GPU
# tests, then peak memory at 10k kernels (what starting costs) and at 1M (what a run adds), and
# where a 20k-scope stop goes.  source .device/setup.sh && bash benchmarks/device_cupti2.sh
export PYTHONUNBUFFERED=1
python3 -m pytest tests/backends/test_cupti_device.py tests/backends/test_cuda.py -k cupti -q -p no:cacheprovider -s 2>&1 |
    grep -E "passed|failed|FAILED|self-check ms|^E " | head -20
python3 benchmarks/bench_cupti_memory.py 10000 2>&1 | tail -4
python3 benchmarks/bench_cupti_memory.py 1000000 2>&1 | tail -4
python3 benchmarks/probe_cupti_stop.py tiny /tmp/p.json 2>&1 | grep -E "^tiny|start ms|cumtime|gputrace/" | head -30
