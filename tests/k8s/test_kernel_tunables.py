"""The kernel settings a lab kubelet changes: recorded and put back (``numapin_lab.k8s.kernel_tunables``, on a
``/proc/sys``-shaped directory), and the session's end check naming a setting the ledger says was different (read
only: nothing on this machine is changed here)."""

from __future__ import annotations

from pathlib import Path

from numapin_lab.k8s.kernel_tunables import KernelTunables
from tests.leak_check import find_leftovers


def test_what_changed_is_written_back_and_nothing_else(tmp_path: Path) -> None:
    for name, value in (("vm/overcommit_memory", "0"), ("kernel/panic", "1"), ("kernel/panic_on_oops", "0")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(value + "\n")
    names = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
    before = KernelTunables.record(names, root=tmp_path)
    (tmp_path / "vm/overcommit_memory").write_text("1\n")  # as kubelet does
    (tmp_path / "kernel/panic").write_text("10\n")
    assert before.restore() == {"vm/overcommit_memory": ("0", "1"), "kernel/panic": ("1", "10")}
    assert {n: (tmp_path / n).read_text().strip() for n in names} == dict(before.values)
    assert before.restore() == {}


def test_the_end_check_names_a_kernel_setting_left_changed(tmp_path: Path) -> None:
    now = Path("/proc/sys/kernel/panic").read_text().strip()
    ledger = tmp_path / "ledger.txt"
    ledger.write_text(f"sysctl\tkernel/panic={now}\n")
    assert not find_leftovers(ledger)
    ledger.write_text(f"sysctl\tkernel/panic={now}7\nsysctl\tkernel/panic={now}\n")  # the first noted is the machine's
    assert find_leftovers(ledger).lines() == [f"kernel setting kernel/panic is {now}, was {now}7"]
