"""numapin on real multi-NUMA Linux kernels: each shape of tests/numa/shapes.py is booted once in a QEMU VM
(numapin_lab.numa_vm), the checks of tests/numa/guest run inside it against a private containerd and ``numapin
criproxy``, and every check is reported here as its own test with its own failure.

The boots run in the background from the session's start, one VM at a time, and these checks run last, each
waiting for its shape's boot (tests/numa/conftest.py, tests.numa.boots). These tests FAIL (never skip) when no VM
can be run (numa-vm.sh or QEMU missing: scripts/test.sh installs the packages). A VM that hangs while booting is
booted again (numapin_lab.numa_vm); one that cannot be run at all fails every check of its shape with numa-vm.sh's
message.
"""

from __future__ import annotations

import ast

import pytest

from numapin_lab.cri.containerd import LabError
from numapin_lab.numa_vm import GUEST_STALLED, VM_FAILURE, VM_TIMEOUT
from tests.numa.background import Cancelled
from tests.numa.boots import Boots, guest_files
from tests.numa.guest_paths import GuestPathError
from tests.numa.guest_script import GUEST_SETUP_FAILED
from tests.numa.harness import GuestRun
from tests.numa.shapes import SHAPES, Shape

pytestmark = pytest.mark.numa_vm


def guest_checks(shape: Shape) -> list[str]:
    """``file::test`` of every test function in the shape's files (the file by its name, as the JUnit report of
    the guest's pytest names it)."""
    out = []
    for f in guest_files(shape):
        tree = ast.parse(f.read_text())
        out += [f"{f.name}::{n.name}" for n in tree.body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")]
    return out


CHECKS = [pytest.param(name, check, id=f"{name}:{check}") for name, s in SHAPES.items() for check in guest_checks(s)]


def vm_trouble(shape: Shape, run: GuestRun) -> str:
    """What went wrong with the VM itself ("" when its pytest ran to the end)."""
    if run.returncode in (0, 1):
        return ""
    what = {VM_FAILURE: "the VM failed", VM_TIMEOUT: f"the VM reached its {shape.timeout} s limit",
            GUEST_STALLED: "the guest froze again after a re-boot",
            GUEST_SETUP_FAILED: "the guest could not be set up (its message is in the log)",
            130: "the VM was interrupted"}.get(run.returncode, f"the guest's pytest exited {run.returncode}")
    return f"{what} ({run.watchdog}, {run.seconds:.0f} s){run.clock_note}{run.stall_note}"


# a boot may be run twice (a failed VM is booted again): the check that triggers it waits for both
@pytest.mark.timeout(2 * max(s.timeout for s in SHAPES.values()) + 300)
@pytest.mark.parametrize(("shape", "check"), CHECKS)
def test_in_vm(boots: Boots, shape: str, check: str, record_property: pytest.RecordProperty) -> None:
    """A check passes when it passed in the guest, even if the VM stopped later (e.g. at its time limit during
    another check); otherwise it fails with the guest's message, or with what happened to the VM."""
    try:
        run = boots.get(shape)
    except GuestPathError as e:  # before any boot: the guest could not see this checkout
        pytest.fail(f"{shape}: {e}", pytrace=False)
    except LabError as e:  # before any boot: a containerd the guest needs could not be had on the host
        pytest.fail(f"{shape}: {e}", pytrace=False)
    except Cancelled as e:  # the session is ending (interrupted)
        pytest.fail(f"{shape}: {e}", pytrace=False)
    record_property("vm_seconds", round(run.seconds, 1))
    cases = run.of(check)
    bad = [c for c in cases if c.outcome != "passed"]
    if cases and not bad:
        return
    trouble = vm_trouble(SHAPES[shape], run)
    if not cases:
        where = f"{trouble}; {check} did not run before" if trouble else f"{check} did not run in the VM"
        pytest.fail(f"{shape}: {where}; log {run.log}:\n{run.tail()}", pytrace=False)
    pytest.fail("\n\n".join(f"{c.nodeid} {c.outcome.upper()} in the {shape} VM"
                            f"{'; ' + trouble if trouble else run.clock_note}:\n{c.message}" for c in bad)
                + (f"\nlog {run.log}:\n{run.tail()}" if trouble else ""), pytrace=False)
