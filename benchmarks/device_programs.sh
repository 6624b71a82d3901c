#!/bin/bash
# The device run for issue 22's table (about 9 minutes on an H100): the GPU tests, where a short
# program's stop goes with the writer process (and when it was ready), then the four programs
# with every peer, the rounds that fit in --seconds.
#   source .device/setup.sh && bash benchmarks/device_programs.sh    # (numpy compiled first, below)
set +e
export PYTHONUNBUFFERED=1
numpy_dir=$(python3 -c "import numpy, os; print(os.path.dirname(numpy.__file__))")
python3 -m compileall -q -j 8 "$numpy_dir" gputrace >/dev/null 2>&1  # as pip leaves an install
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== GPU and wgpu tests"
GPUTRACE_SKIP_PERFETTO_UI=1 timeout 150 python3 -m pytest -m "gpu or wgpu" -q -p no:cacheprovider tests 2>&1 | tail -6
echo "== a short program's stop, writer process"
W=auto timeout 70 python3 benchmarks/probe_stop_stages.py tiny20k solver 2>&1 | tail -12
echo "== programs"
timeout 450 python3 benchmarks/bench_programs.py --programs tiny20k,tiny100k,solver,matmul --reps 3 \
    --seconds 380 --variants bare,cupti_jsongz,cupti_json,cupti_pftrace,events,proton,rawsame,nvtx,torch \
    ${OUT:+--json "$OUT/programs.json"} 2>&1 | tail -60
