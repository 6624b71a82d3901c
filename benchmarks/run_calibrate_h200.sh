#!/usr/bin/env bash
# `gputrace calibrate --backend cuda` next to the same measurements made by a CUDA C program
# (benchmarks/cuda_launch.cu, compiled here with nvcc), printed side by side in one run.
#
#   bash benchmarks/run_calibrate_h200.sh [--quick]     # on a machine with a CUDA GPU, CuPy and nvcc
#
# Writes its files to $OUT (or a temporary folder): cuda_c.tsv, calibration.json, calibrate.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$(mktemp -d)}
quick=()
[ "${1:-}" = "--quick" ] && quick=(--quick)

nvcc -O2 -arch=native -o "$out/cuda_launch" benchmarks/cuda_launch.cu 2>"$out/nvcc.log" \
  || nvcc -O2 -o "$out/cuda_launch" benchmarks/cuda_launch.cu 2>>"$out/nvcc.log" \
  || { echo "nvcc failed:"; cat "$out/nvcc.log"; }
[ -x "$out/cuda_launch" ] && "$out/cuda_launch" "${quick[@]}" >"$out/cuda_c.tsv" 2>"$out/cuda_c.err" \
  || echo "the CUDA C program failed: $(tail -1 "$out/cuda_c.err" 2>/dev/null)"

python3 -m gputrace calibrate --backend cuda "${quick[@]}" -o "$out/calibration.json" \
  >"$out/calibrate.txt" 2>"$out/calibrate.err" || echo "gputrace calibrate failed: $(tail -3 "$out/calibrate.err")"
cat "$out/calibrate.txt"
echo
python3 - "$out/calibration.json" "$out/cuda_c.tsv" <<'PY'
import json, sys
from pathlib import Path

from gputrace.calibrate.report import fmt_ns

cal_path, c_path = Path(sys.argv[1]), Path(sys.argv[2])
py = {}
if cal_path.is_file():
    for m in json.loads(cal_path.read_text())["measurements"]:
        py[m["key"]] = m
rows = []
if c_path.is_file():
    for line in c_path.read_text().splitlines():
        key, what, wm, _, _, _, dm, _, _, _ = line.split("\t")
        rows.append((key, what, None if wm == "-" else float(wm), None if dm == "-" else float(dm)))

def med(m, clock):
    s = (m or {}).get(clock)
    return s["median_ns"] if s else None

def cell(v):
    return fmt_ns(v) if v is not None else "-"

def ratio(a, b):
    return f"{a / b:.2f}x" if a is not None and b else "-"

print("side by side: medians (python = gputrace calibrate through CuPy, C = cuda_launch.cu)")
head = f"{'measurement':<48} {'wall py':>10} {'wall C':>10} {'py/C':>7}   {'dev py':>10} {'dev C':>10} {'py/C':>7}"
print(head)
print("-" * len(head))
for key, what, c_wall, c_dev in rows:
    m = py.get(key)
    p_wall, p_dev = med(m, "wall"), med(m, "device")
    print(f"{what[:48]:<48} {cell(p_wall):>10} {cell(c_wall):>10} {ratio(p_wall, c_wall):>7}   "
          f"{cell(p_dev):>10} {cell(c_dev):>10} {ratio(p_dev, c_dev):>7}")
PY
