"""The kernel settings kubelet changes when it starts (``protectKernelDefaults: false``, its default): recorded
before a lab kubelet starts and put back after it stops, so the machine is left as it was found; noted in the lab's
ledger, so that the session's end check puts them back after a kubelet that was never stopped (a killed run)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from numapin_lab.cri import ledger

__all__ = ["KUBELET_TUNABLES", "KernelTunables"]

# what kubelet's container manager sets (vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1, ...)
KUBELET_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                    "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")


@dataclass(frozen=True)
class KernelTunables:
    """The values of some ``/proc/sys`` settings at one moment."""

    values: tuple[tuple[str, str], ...]
    root: Path = Path("/proc/sys")

    @classmethod
    def record(cls, names: tuple[str, ...] = KUBELET_TUNABLES, root: Path = Path("/proc/sys")) -> KernelTunables:
        """The settings now, noted in the lab's ledger too (a killed test run's end check puts them back)."""
        found = cls(tuple((n, (root / n).read_text().strip()) for n in names), root)
        if root == Path("/proc/sys"):
            for name, value in found.values:
                ledger.note("sysctl", f"{name}={value}")
        return found

    def changed(self) -> dict[str, tuple[str, str]]:
        """The settings whose value differs now: name -> (recorded, now)."""
        out = {}
        for name, value in self.values:
            now = (self.root / name).read_text().strip()
            if now != value:
                out[name] = (value, now)
        return out

    def restore(self) -> dict[str, tuple[str, str]]:
        """Write back every setting that changed; returns what was put back (name -> (recorded, found))."""
        changed = self.changed()
        for name, (value, _now) in changed.items():
            (self.root / name).write_text(value + "\n")
        return changed
