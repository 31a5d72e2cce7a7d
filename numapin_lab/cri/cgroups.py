"""The lab's cgroup housekeeping: what kubelet does with a pod's cgroup once the pod is gone.

runc creates a pod's cgroup (``/kubepods/pod<uid>``, the sandbox's ``cgroup_parent``) in every hierarchy as the
parent of the pod's containers, and never removes it; kubelet does, when the pod goes. ``remove_cgroup`` is that
step for the lab: rmdir it bottom-up in every hierarchy. It only ever touches the one cgroup it is given and what
lies under it (never a parent, never the root), and only with rmdir, which the kernel refuses for a cgroup still
in use: it never kills (whoever ran the processes stops them first; the lab stops its own containers). On cgroup
v1 every leftover cpuset makes every later cpuset write on the machine slower (the scheduler domains are rebuilt
over all of them).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["cgroup_mounts", "existing_cgroup_dirs", "processes_in", "remove_cgroup"]


def cgroup_mounts() -> list[Path]:
    """Mount points of every cgroup (v1) and cgroup2 hierarchy."""
    out = []
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 2 and parts[2] in ("cgroup", "cgroup2"):
                out.append(Path(parts[1]))
    return out


def _relative(cgroup: str) -> str:
    rel = os.path.normpath("/" + cgroup).lstrip("/")
    if not rel or rel == ".":
        raise ValueError(f"refusing to remove the root cgroup ({cgroup!r})")
    return rel


def existing_cgroup_dirs(cgroup: str, mounts: list[Path] | None = None) -> list[Path]:
    """The directories of ``cgroup`` (a path from a hierarchy's root) that exist, one per hierarchy."""
    rel = _relative(cgroup)
    return [m / rel for m in (cgroup_mounts() if mounts is None else mounts) if (m / rel).is_dir()]


def processes_in(cgroup: str) -> set[int]:
    """The processes in ``cgroup`` or under it, in any hierarchy."""
    pids: set[int] = set()
    for top in existing_cgroup_dirs(cgroup):
        for dirpath, _dirs, _files in os.walk(top):
            try:
                pids.update(int(p) for p in Path(dirpath, "cgroup.procs").read_text().split())
            except OSError:
                continue
    return pids


def remove_cgroup(cgroup: str, *, settle: float = 2.0, pause: float = 0.05) -> list[Path]:
    """rmdir ``cgroup`` and everything under it, bottom-up, in every hierarchy; returns the directories still there
    (empty: all gone). A cgroup in use (a process in it, or just exiting) is retried for ``settle`` seconds, then
    left alone: this never kills. Blocking: call it off an event loop."""
    mounts = cgroup_mounts()
    deadline = time.monotonic() + settle
    while True:
        left: list[Path] = []
        for top in existing_cgroup_dirs(cgroup, mounts):
            for dirpath, _dirs, _files in os.walk(top, topdown=False):
                try:
                    os.rmdir(dirpath)
                except FileNotFoundError:
                    pass
                except OSError:  # busy: a process in it (or still exiting), or a child not removed
                    left.append(Path(dirpath))
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(pause)
