#!/usr/bin/env bash
# numapin's main job on one machine, from a fresh Debian machine with Python 3.11, as root.
# Sets up what it needs (Debian packages, a virtualenv with numapin), then runs `numapin demo` when this
# build has it (private containerd + CRI proxy + webhook, pods pinned for real), else plans the example
# scenarios on the 112-CPU Xeon node with `numapin plan`. Extra arguments go to `numapin demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/setup.sh
case " $* " in *" --topology"*) export NUMAPIN_NUMA_VM_PACKAGES=1 ;; esac  # the demo in a multi-NUMA VM
numapin_setup demo
numapin="$NUMAPIN_VENV/bin/numapin"
if "$numapin" demo --help >/dev/null 2>&1; then
    exec "$numapin" demo "$@"
fi
for scenario in examples/*.yaml examples/*.json; do
    [ -e "$scenario" ] || continue
    case "$scenario" in *topology*.json) continue ;; esac
    echo "==> numapin plan --format text $scenario"
    "$numapin" plan --format text "$scenario"
    echo
done
