"""The lab's ledger: what the lab made or changed on this machine (containerd lab directories, scratch directories,
pods' cgroups, the labs' network bridges, kernel settings), for a test session to check at its end that nothing stayed
behind.

Off unless ``NUMAPIN_LAB_LEDGER`` names a file (tests/conftest.py sets it for the session; child processes inherit
it). Each entry is one line ``<kind>\\t<value>`` appended with one write, so concurrent writers do not mix lines.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ENV", "KINDS", "note", "read", "scratch_dir"]

ENV = "NUMAPIN_LAB_LEDGER"
# a containerd lab's directory, a scratch directory, a pod's cgroup parent, a network link (a lab's CNI bridge), a
# kernel setting's value before the lab changed it (``<name under /proc/sys>=<value>``; the first noted for a name is
# the machine's own)
KINDS = ("lab", "dir", "cgroup", "link", "sysctl")


def note(kind: str, value: str, env: Mapping[str, str] = os.environ) -> None:
    """Record that the lab made ``value`` (a no-op without a ledger)."""
    if kind not in KINDS or "\n" in value or "\t" in value:
        raise ValueError(f"bad ledger entry {kind!r} {value!r}")
    path = env.get(ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{kind}\t{value}\n".encode())
    finally:
        os.close(fd)


def read(path: str | os.PathLike[str]) -> dict[str, list[str]]:
    """The entries of a ledger by kind, each value once, in the order first noted."""
    out: dict[str, dict[str, None]] = {k: {} for k in KINDS}
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        text = ""
    for line in text.splitlines():
        kind, _, value = line.partition("\t")
        if kind in out and value:
            out[kind][value] = None
    return {k: list(v) for k, v in out.items()}


def scratch_dir(prefix: str) -> Path:
    """A new directory ``/tmp/<prefix>*`` (short: unix socket paths are limited to 107 bytes), noted in the ledger;
    the caller removes it."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    note("dir", str(d))
    return d
