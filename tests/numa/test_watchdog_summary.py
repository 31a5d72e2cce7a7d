"""What the multi-NUMA harness says its watchdogs saw (harness.GuestRun.watchdog): every boot counted, and why
each boot but the last was followed by another; a guest that froze on its last boot is said to have been given
up on, not booted again."""

from __future__ import annotations

from pathlib import Path

from numapin_lab.numa_vm import GUEST_STALLED
from tests.numa.harness import CaseResult, GuestRun


def run(returncode: int, boots: int, *, hangs: int = 0, failures: int = 0, stalls: int = 0) -> GuestRun:
    return GuestRun(returncode, boots, 100.0, (), Path("/nonexistent/vm.log"),
                    stalls=tuple(f"the guest's heartbeat stopped, boot {i + 1}" for i in range(stalls)),
                    boot_hangs=hangs, vm_failures=failures)


def test_one_clean_boot() -> None:
    assert run(0, 1).watchdog == "1 boot(s)"


def test_every_kind_of_re_boot_is_counted() -> None:
    assert run(0, 4, hangs=1, failures=1, stalls=1).watchdog == (
        "4 boot(s): 1 hung while booting (booted again by numa-vm.sh); 1 VM failure(s) (run again); "
        "1 froze after booting (heartbeat watchdog: 1 booted again)")


def test_a_guest_frozen_on_its_last_boot_was_given_up_on() -> None:
    r = run(GUEST_STALLED, 2, stalls=2)
    assert r.watchdog == "2 boot(s): 2 froze after booting (heartbeat watchdog: 1 booted again, then gave up)"
    assert r.stall_note.count("WARNING: boot froze:") == 2


def test_the_slowest_checks_are_named_slowest_first() -> None:
    cases = tuple(CaseResult(f"test_x.py::test_{n}", "passed", "", seconds)
                  for n, seconds in (("a", 2.0), ("b", 178.2), ("c", 0.4), ("d", 30.6)))
    r = GuestRun(0, 1, 300.0, cases, Path("/nonexistent/vm.log"))
    assert r.slowest() == "test_x.py::test_b 178 s, test_x.py::test_d 31 s, test_x.py::test_a 2 s"
    assert r.slowest(1) == "test_x.py::test_b 178 s"
