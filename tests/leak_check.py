"""The test session's end check: what the lab made (tests/conftest.py points ``numapin_lab.cri.ledger`` at a file for
the session) that is still there when the session ends: pods' cgroups, processes (containerd, shims, runc,
``numapin``, the containers' ``sleep``), mounts, scratch or lab directories, the labs' network bridges, and kernel
settings a lab kubelet changed. Only what this session's ledger names is looked at, so other sessions on the machine
(and the developer's own containers) are never counted nor touched. ``sweep`` removes what ``find_leftovers`` found,
so a failed run does not leave the machine slower."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from numapin_lab.cri import ledger
from numapin_lab.cri.cgroups import cgroup_mounts, existing_cgroup_dirs, remove_cgroup
from numapin_lab.cri.cni import bridge_exists, remove_bridge
from numapin_lab.cri.containerd import shim_socket

__all__ = ["Leftovers", "find_leftovers", "sweep"]


@dataclass(frozen=True)
class Leftovers:
    cgroups: tuple[str, ...]            # pod cgroups still there (and in how many hierarchies)
    processes: tuple[tuple[int, str], ...]  # (pid, command line)
    mounts: tuple[str, ...]
    paths: tuple[str, ...]              # lab and scratch directories
    links: tuple[str, ...] = ()         # the labs' network bridges
    sysctls: tuple[tuple[str, str, str], ...] = ()  # kernel settings changed: (name, the machine's value, now)

    def __bool__(self) -> bool:
        return bool(self.cgroups or self.processes or self.mounts or self.paths or self.links or self.sysctls)

    def lines(self) -> list[str]:
        return ([f"cgroup {c}" for c in self.cgroups] + [f"process {p}: {cmd}" for p, cmd in self.processes]
                + [f"mount {m}" for m in self.mounts] + [f"path {p}" for p in self.paths]
                + [f"link {name}" for name in self.links]
                + [f"kernel setting {n} is {now}, was {was}" for n, was, now in self.sysctls])


def _under(path: str, tops: list[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def _processes(dirs: list[str], cgroups: list[str]) -> list[tuple[int, str]]:
    """Processes naming a lab or scratch directory on their command line, or running in a pod's cgroup."""
    me = os.getpid()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == me:
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            groups = [line.split(":", 2)[2] for line in (p / "cgroup").read_text().splitlines() if line.count(":") >= 2]
        except OSError:
            continue
        if not cmd:  # a kernel thread or a zombie
            continue
        if any(d in cmd for d in dirs) or any(_under(g, cgroups) for g in groups):
            out.append((int(p.name), cmd[:400]))
    return out


def _sysctls(noted: list[str]) -> list[tuple[str, str, str]]:
    """(name, the first value noted for it, its value now) of each noted kernel setting whose value changed."""
    first: dict[str, str] = {}
    for entry in noted:
        name, _, value = entry.partition("=")
        first.setdefault(name, value)
    out = []
    for name, value in first.items():
        try:
            now = (Path("/proc/sys") / name).read_text().strip()
        except OSError:
            continue
        if now != value:
            out.append((name, value, now))
    return out


def find_leftovers(ledger_file: str | os.PathLike[str]) -> Leftovers:
    noted = ledger.read(ledger_file)
    dirs = noted["lab"] + noted["dir"]
    mounts_ = cgroup_mounts()
    cgroups = [f"{c} ({len(d)} hierarchies)" for c in noted["cgroup"] if (d := existing_cgroup_dirs(c, mounts_))]
    with open("/proc/mounts") as f:
        mounts = [line.split()[1] for line in f if _under(line.split()[1], dirs)]
    return Leftovers(tuple(cgroups), tuple(_processes(dirs, noted["cgroup"])), tuple(mounts),
                     tuple(d for d in dirs if os.path.lexists(d)), tuple(n for n in noted["link"] if bridge_exists(n)),
                     tuple(_sysctls(noted["sysctl"])))


def sweep(ledger_file: str | os.PathLike[str]) -> list[str]:
    """Remove what ``find_leftovers`` finds (kill, unmount, delete, rmdir); returns what still stayed."""
    noted = ledger.read(ledger_file)
    found = find_leftovers(ledger_file)
    for pid, cmd in found.processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        args = cmd.split()
        if "containerd-shim" in cmd and "-id" in args[:-1] and "-address" in args[:-1]:  # a killed shim's socket
            with contextlib.suppress(FileNotFoundError):
                os.unlink(shim_socket(args[args.index("-address") + 1], args[args.index("-id") + 1]))
    for m in sorted(found.mounts, reverse=True):
        subprocess.run(["umount", "-l", m], check=False, capture_output=True)
    for d in found.paths:
        shutil.rmtree(d, ignore_errors=True)
    for c in noted["cgroup"]:
        remove_cgroup(c)
    for name in found.links:
        remove_bridge(name)
    for name, was, _now in found.sysctls:
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / name).write_text(was + "\n")
    return find_leftovers(ledger_file).lines()
