"""tests/numa/guest holds checks that run inside the multi-NUMA VMs (test_multi_numa.py boots them): it is
collected only there ($NUMAPIN_IN_VM=1), never on the host. After the run, the terminal summary gives what each
boot cost (host seconds, of which the guest's tests by the guest's clock) and the churn's headline figures."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.numa.shapes import IN_VM_ENV

collect_ignore_glob = [] if os.environ.get(IN_VM_ENV) == "1" else ["guest/*"]

# shape name -> GuestRun (tests.numa.harness), filled by test_multi_numa's boots
BOOTS: pytest.StashKey[dict[str, Any]] = pytest.StashKey()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    runs = config.stash.get(BOOTS, {})
    if not runs:
        return
    terminalreporter.section("multi-NUMA VMs")
    for name, run in runs.items():
        passed = sum(c.outcome == "passed" for c in run.cases)
        tests = f"{run.guest_seconds:.0f} s" if run.guest_seconds is not None else "?"
        boot = f"{run.boot_seconds:.0f} s" if run.boot_seconds is not None else "?"
        terminalreporter.write_line(f"{name}: {run.seconds:.0f} s on the host, {run.watchdog}; boot and shutdown "
                                    f"{boot}, guest tests {tests}; QEMU's CPU {run.cpu_seconds:.0f} s; "
                                    f"{passed}/{len(run.cases)} passed{run.clock_note}{run.stall_note}")
        if run.churn is not None:  # read at the end of the boot: a passing run's directory is gone by now
            doc = run.churn
            keys = ("ops", "seconds", "exclusiveAdmissions", "exclusiveNUMANodes", "proxyKills",
                    "killsWhileAdmittingExclusive", "containerdRestarts", "podsCreated", "violations")
            terminalreporter.write_line(f"  churn: {json.dumps({k: doc.get(k) for k in keys})}")
