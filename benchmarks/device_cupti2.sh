#!/bin/bash
# One device run for the CUPTI memory / stop / self-check work: GPU tests, then the memory and
# stop probes, output under $OUT.
export PYTHONUNBUFFERED=1
python3 -m pytest tests/test_cupti_device.py -k self_check -q -p no:cacheprovider -s 2>&1 | grep -E "passed|failed|FAILED|Error|self-check ms|^E " | head -20
python3 benchmarks/bench_cupti_memory.py 1000000 2>&1 | tail -4
python3 benchmarks/bench_cupti_memory.py 3000000 2>&1 | tail -4
