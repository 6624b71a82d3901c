#!/bin/bash
# One device run for the CUPTI memory / stop / self-check work: GPU tests, then the memory and
# stop probes, output under $OUT.
export PYTHONUNBUFFERED=1
python3 -m pytest tests/test_cupti_device.py tests/test_cuda.py -k cupti -q -p no:cacheprovider -s 2>&1 | grep -E "passed|failed|FAILED|Error|self-check ms" | head -20
python3 benchmarks/bench_cupti_memory.py 2000000 2>&1 | tail -4
python3 benchmarks/probe_cupti_stop.py tiny /tmp/p.json 2>&1 | grep -E "^tiny|acquire|join|sleep|start ms|<-|->" | head -40
