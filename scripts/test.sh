#!/usr/bin/env bash
# The whole numapin test suite, from a fresh Debian machine with Python 3.11, as root:
# Debian packages (containerd, runc, busybox-static for the end-to-end tests), a virtualenv with
# numapin and its test extras, ruff, mypy --strict on the product packages (pyproject.toml [tool.mypy]: which
# packages, the generated and lab modules it leaves out), then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/setup.sh
numapin_setup test
echo "== ruff"
"$NUMAPIN_VENV/bin/ruff" check .
echo "== mypy --strict (pyproject.toml [tool.mypy] files)"
"$NUMAPIN_VENV/bin/mypy"
if [ $# -gt 0 ] || [ "${NUMAPIN_TESTS_SERIAL:-}" = 1 ]; then
    echo "== pytest"
    exec "$NUMAPIN_VENV/bin/python" -m pytest "$@"
fi
# The whole suite: the multi-NUMA VM tests (about ten minutes of emulation, mostly one core busy) run beside the rest
# (mostly waiting on containerd, runc and subprocesses), so the suite takes about the VMs' time rather than the sum.
# NUMAPIN_TESTS_SERIAL=1 runs everything in one pytest instead.
vm_dir=$(mktemp -d "${TMPDIR:-/tmp}/numapin-vm-tests.XXXXXX")
trap 'kill "${vm_pid:-}" 2>/dev/null || true; rm -rf "$vm_dir"' EXIT
echo "== pytest -m numa_vm (multi-NUMA VMs, in the background; its output follows the rest's)"
"$NUMAPIN_VENV/bin/python" -m pytest -m numa_vm -p no:cacheprovider --basetemp "$vm_dir/tmp" \
    > "$vm_dir/log" 2>&1 &
vm_pid=$!
echo "== pytest -m 'not numa_vm'"
rc=0
"$NUMAPIN_VENV/bin/python" -m pytest -m "not numa_vm" || rc=$?
vm_rc=0
wait "$vm_pid" || vm_rc=$?
vm_pid=""
echo "== pytest -m numa_vm (multi-NUMA VMs): its output"
cat "$vm_dir/log"
if [ "$rc" -ne 0 ] || [ "$vm_rc" -ne 0 ]; then
    echo "== FAILED: pytest -m 'not numa_vm' exit $rc, pytest -m numa_vm exit $vm_rc"
    exit 1
fi
