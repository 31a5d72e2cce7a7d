"""A private cgroup root for a lab kubelet (its ``cgroupRoot``): kubelet's housekeeping kills the processes of every
``kubepods/.../pod<uid>`` cgroup it has no pod for, under its own root only; with a root of its own
(``/numapin-kubelet-<id>/kubepods/...``) it never sees the pods the rest of the suite's containerds run under
``/kubepods``. kubelet refuses a ``cgroupRoot`` that does not exist: ``make_cgroup_root`` creates it in every
hierarchy (on cgroup v1 a new cpuset gets its parent's CPUs and memory nodes) and notes it in the lab's ledger, so
a killed test run's end check kills what still runs there and removes it."""

from __future__ import annotations

import uuid

from numapin_lab.cri import ledger
from numapin_lab.cri.cgroups import cgroup_mounts, remove_cgroup

__all__ = ["make_cgroup_root", "remove_cgroup_root"]


def make_cgroup_root(prefix: str = "numapin-kubelet-") -> str:
    """A new cgroup ``/<prefix><id>`` in every mounted hierarchy; returns its path from the hierarchies' roots."""
    name = f"{prefix}{uuid.uuid4().hex[:8]}"
    ledger.note("cgroup", f"/{name}")
    for mount in cgroup_mounts():
        d = mount / name
        d.mkdir()
        for knob in ("cpuset.cpus", "cpuset.mems"):  # cgroup v1's cpuset starts empty: take the parent's
            if (mount / knob).exists() and (d / knob).exists() and not (d / knob).read_text().strip():
                (d / knob).write_text((mount / knob).read_text())
    return f"/{name}"


def remove_cgroup_root(cgroup: str) -> list[str]:
    """rmdir the root and everything under it (never kills: the caller stopped what ran there); what stayed."""
    return [str(p) for p in remove_cgroup(cgroup, settle=10.0)]
