"""Which host paths the multi-NUMA guest must see, and which it cannot.

The guest's root is the host's ``/`` (read-only, under a throw-away overlay), so the checkout and its virtualenv
are at the same paths in the guest wherever they are, except where a file system of the guest's own hides them:

- ``/tmp``: the guest command (tests/numa/guest_script) mounts a fresh tmpfs there (containerd's overlayfs
  snapshots cannot live on the overlay root, and tests keep their containerd under /tmp); the paths under /tmp
  that the guest needs (the checkout, the virtualenv, the interpreter, the shared directories) are bound back
  into it from the overlay before it goes over /tmp: ``plan`` lists them.
- ``/proc``, ``/sys``, ``/dev``, ``/run``, ``/var/lib/containerd`` and numa-vm.sh's own ``/mnt/numa-lab`` and
  ``/.numa-lab``: mounted by numa-vm.sh's guest init before any command of ours runs; what the host has there
  cannot be reached from the guest: ``plan`` refuses them with the path and why.

Shared (read-write) directories are passed to QEMU's ``-virtfs`` option and to numa-vm.sh's line-based list of
mounts: a comma (QEMU's option separator, which numa-vm.sh does not escape), a line break or surrounding white
space in their path is refused too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

__all__ = ["GUEST_TMP", "GuestPathError", "hidden_by", "needed_paths", "plan"]

GUEST_TMP = PurePosixPath("/tmp")
# mounted by numa-vm.sh in the guest before the command: what the host has below them is out of the guest's reach
HIDDEN = {
    "/proc": "the guest's own procfs", "/sys": "the guest's own sysfs", "/dev": "the guest's own devtmpfs",
    "/run": "a tmpfs numa-vm.sh mounts in the guest", "/var/lib/containerd": "a tmpfs numa-vm.sh mounts in the guest",
    "/mnt/numa-lab": "numa-vm.sh's per-run share", "/.numa-lab": "numa-vm.sh's guest init",
}


class GuestPathError(ValueError):
    """A path the guest needs but cannot see, or cannot be given: the message names the path and why."""


def hidden_by(path: PurePosixPath) -> str | None:
    """Why ``path`` (absolute, resolved) is out of the guest's reach, or None."""
    for top, what in HIDDEN.items():
        if path.is_relative_to(top):
            return f"{top} is {what}"
    return None


def needed_paths(root: Path) -> list[Path]:
    """What the guest's pytest reads from the host: the checkout, the virtualenv and the interpreter (resolved:
    a virtualenv's python is a link to the one it was made from)."""
    return [root.resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent,
            Path(sys.base_prefix).resolve()]


def plan(needed: Iterable[Path], shares: Iterable[Path]) -> tuple[str, ...]:
    """The paths under /tmp to bind back over the guest's tmpfs /tmp (outermost only, in order), or
    GuestPathError for a path the guest cannot see (``needed``) or be given read-write (``shares``)."""
    shares = list(shares)
    for share in shares:
        text = str(share)
        if "," in text or "\n" in text or text != text.strip():
            raise GuestPathError(f"{text!r}: a directory shared with the guest cannot have a comma, a line break or "
                                 f"surrounding white space in its path (QEMU's -virtfs option and numa-vm.sh's list "
                                 f"of mounts); choose another directory")
    keep: list[PurePosixPath] = []
    for p in [*needed, *shares]:
        path = PurePosixPath(os.path.abspath(p))
        why = hidden_by(path)
        if why is not None:
            raise GuestPathError(f"{path}: not visible in the multi-NUMA guest ({why}); move it elsewhere, e.g. "
                                 f"under /root or /var/tmp")
        if path == GUEST_TMP:
            raise GuestPathError(f"{path}: the guest mounts its own tmpfs there; use a directory below it or elsewhere")
        if path.is_relative_to(GUEST_TMP):
            keep.append(path)
    outer = [p for p in keep if not any(p != q and p.is_relative_to(q) for q in keep)]
    return tuple(dict.fromkeys(str(p) for p in outer))
