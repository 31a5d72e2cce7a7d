"""A cgroup's CFS quota in the kernel: read it, and lift it (no quota) without touching the runtime's record.

cgroup v1: ``<root>/cpu/<path>/cpu.cfs_quota_us`` (-1: none); v2: ``<root>/<path>/cpu.max`` (``max <period>``:
none; writing ``max`` alone keeps the period). Plain blocking file I/O: call it off the event loop."""

from __future__ import annotations

import os
from pathlib import Path

from nodeagent.node.kernel import CgroupLayout

__all__ = ["UNLIMITED", "lift_quota", "quota_file", "read_quota"]

UNLIMITED = -1  # what ``read_quota`` says of a cgroup without a CFS quota (v1's own spelling)


def quota_file(layout: CgroupLayout, cgroup: str) -> Path:
    rel = cgroup.lstrip("/")
    if layout.unified:
        return layout.roots.cgroup / rel / "cpu.max"
    return layout.roots.cgroup / "cpu" / rel / "cpu.cfs_quota_us"


def read_quota(layout: CgroupLayout, cgroup: str) -> int:
    """The cgroup's CFS quota in microseconds, ``UNLIMITED`` for none (OSError: no such cgroup)."""
    text = quota_file(layout, cgroup).read_text().split()
    if not text:
        raise OSError(f"{quota_file(layout, cgroup)}: empty")
    return UNLIMITED if text[0] == "max" else int(text[0])


def lift_quota(layout: CgroupLayout, cgroup: str) -> str | None:
    """Remove the cgroup's CFS quota; returns why it could not (None: done). A cgroup that does not exist (not
    started yet, or gone) is not created."""
    path = quota_file(layout, cgroup)
    value = b"max" if layout.unified else b"-1"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        return f"{path}: {e.strerror}"
    try:
        os.write(fd, value)
    except OSError as e:
        return f"{path} = {value.decode()}: {e.strerror}"
    finally:
        os.close(fd)
    return None
