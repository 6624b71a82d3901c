#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine, then nothing else:
#   - Mesa's lavapipe (mesa-vulkan-drivers): the wgpu tests run on it for real;
#   - Debian's chromium: the viewer tests drive it through Playwright (no browser download);
#   - gputrace itself, editable, with its test extras.
# The test extras include the perfetto package: its .proto definitions check the .pftrace files.
# Its trace_processor binary is on no package registry, so Perfetto's importer runs only where
# GPUTRACE_TRACE_PROCESSOR names one (tests/perfetto_tp.py); those tests skip elsewhere, saying so.
# Safe to run again: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
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
