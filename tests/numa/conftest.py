"""tests/numa/guest holds checks that run inside the multi-NUMA VMs (test_multi_numa.py boots them): it is
collected only there ($NUMAPIN_IN_VM=1), never on the host.

On the host: once the collection is done, the boots of the shapes whose checks are selected start in the
background (tests.numa.boots: two VMs at a time, beside the rest of the suite; with them the boots other test
modules offer as ``VM_JOB``, e.g. tests/install/test_systemd_host.py) and those checks move to the end of
the session, where each waits for its shape's boot; the session's end stops a boot still running. After the run,
the terminal summary gives what each boot cost (host seconds, of which the guest's tests by the guest's clock) and
the churn's headline figures."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import pytest

from tests.numa.shapes import IN_VM_ENV, SHAPES

if TYPE_CHECKING:
    from tests.numa.boots import Boots

IN_VM = os.environ.get(IN_VM_ENV) == "1"
collect_ignore_glob = [] if IN_VM else ["guest/*"]

# shape name -> GuestRun (tests.numa.harness), filled by the boots as they finish
BOOTS: pytest.StashKey[dict[str, Any]] = pytest.StashKey()
_SESSION_BOOTS: pytest.StashKey[Boots] = pytest.StashKey()


def vm_shape(item: pytest.Item) -> str | None:
    """The shape whose boot this test waits for (test_multi_numa's checks), else None."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or item.get_closest_marker("numa_vm") is None:
        return None
    shape = callspec.params.get("shape")
    return shape if isinstance(shape, str) and shape in SHAPES else None


def session_boots(config: pytest.Config) -> Boots:
    """The session's boots (made on first use)."""
    boots = config.stash.get(_SESSION_BOOTS, None)
    if boots is None:
        from tests.numa.boots import Boots  # not in the guest: its pytest loads this file too

        boots = config.stash[_SESSION_BOOTS] = Boots()
        config.stash[BOOTS] = boots.runs
    return boots


@pytest.fixture(scope="session")
def boots(pytestconfig: pytest.Config) -> Boots:
    return session_boots(pytestconfig)


def vm_job(item: pytest.Item) -> tuple[str, Any] | None:
    """The extra boot this test waits for: its module's ``VM_JOB = (name, make)``, ``make(config)`` giving the
    tests.numa.boots.VMJob; else None."""
    job = getattr(getattr(item, "module", None), "VM_JOB", None)
    return None if job is None or item.get_closest_marker("numa_vm") is None else job  # type: ignore[no-any-return]


def _waits(item: pytest.Item) -> bool:
    return vm_shape(item) is not None or vm_job(item) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The checks that wait for a boot go last (in their order), after everything that can run meanwhile."""
    if IN_VM:
        return
    waiting = [i for i in items if _waits(i)]
    if waiting:
        items[:] = [i for i in items if not _waits(i)] + waiting


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the selected shapes' boots now, in the background (not for --collect-only)."""
    if IN_VM or session.config.option.collectonly:
        return
    shapes = [s for s in map(vm_shape, session.items) if s is not None]
    jobs = dict(j for j in map(vm_job, session.items) if j is not None)
    extra = {name: make(session.config) for name, make in jobs.items()}
    if shapes or extra:
        session_boots(session.config).start(shapes, extra)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop a boot still running (an interrupted or -x session) and wait for it; remove the boots' directories
    unless a boot failed or froze."""
    boots = session.config.stash.get(_SESSION_BOOTS, None)
    if boots is not None:
        boots.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    runs = config.stash.get(BOOTS, {})
    if not runs:
        return
    terminalreporter.section("multi-NUMA VMs")
    boots = config.stash.get(_SESSION_BOOTS, None)
    if boots is not None:
        terminalreporter.write_line(f"boots {boots.timeline()}")
    for name, run in runs.items():
        passed = sum(c.outcome == "passed" for c in run.cases)
        tests = f"{run.guest_seconds:.0f} s" if run.guest_seconds is not None else "?"
        boot = f"{run.boot_seconds:.0f} s" if run.boot_seconds is not None else "?"
        terminalreporter.write_line(f"{name}: {run.seconds:.0f} s on the host, {run.watchdog}; boot and shutdown "
                                    f"{boot}, guest tests {tests}; QEMU's CPU {run.cpu_seconds:.0f} s; "
                                    f"{passed}/{len(run.cases)} passed{run.clock_note}{run.stall_note}")
        if run.cases:
            terminalreporter.write_line(f"  slowest in the guest: {run.slowest()}")
        if run.churn is not None:  # read at the end of the boot: a passing run's directory is gone by now
            doc = run.churn
            keys = ("ops", "seconds", "exclusiveAdmissions", "exclusiveNUMANodes", "proxyKills",
                    "killsWhileAdmittingExclusive", "containerdRestarts", "podsCreated", "violations")
            terminalreporter.write_line(f"  churn: {json.dumps({k: doc.get(k) for k in keys})}")
