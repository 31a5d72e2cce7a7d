"""What the kernel says a container runs on: its cgroup's ``cpuset.cpus``/``cpuset.mems`` and the
``Cpus_allowed_list``/``Mems_allowed_list`` of its processes (``/proc/<pid>/status``).

Plain blocking file reads (call them off the event loop). The cgroup of a container is found from the OCI
spec's ``linux.cgroupsPath`` (cgroupfs ``/kubepods/pod<uid>/<id>`` or systemd ``slice:prefix:name``) or
from ``/proc/<pid>/cgroup``; cgroup v1 (the ``cpuset`` hierarchy) and v2 (unified) are both read. The roots
are configurable, for a proxy that sees the host's ``/proc`` (hostPID) and ``/sys/fs/cgroup`` elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from allocator.cpuset import CPUSet

__all__ = ["CgroupLayout", "KernelRoots", "KernelView", "TaskView", "cgroup_of_pid", "cgroup_of_spec",
           "read_view", "read_views"]


@dataclass(frozen=True)
class KernelRoots:
    proc: Path = Path("/proc")
    cgroup: Path = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class TaskView:
    """One process of a container, as ``/proc/<pid>/status`` shows it."""
    pid: int
    cpus: CPUSet
    mems: CPUSet


@dataclass(frozen=True)
class KernelView:
    """A running container's real cpuset: its cgroup's files and its processes' affinity."""
    cgroup: str
    cpus: CPUSet
    mems: CPUSet
    tasks: tuple[TaskView, ...]

    @property
    def running(self) -> bool:
        return bool(self.tasks)

    @property
    def all_cpus(self) -> CPUSet:
        """Every CPU the container may run on (the cgroup's and any process's)."""
        out = self.cpus
        for t in self.tasks:
            out = out | t.cpus
        return out

    def disagreement(self, cpus: CPUSet, mems: CPUSet | None) -> str | None:
        """Why this is not ``cpus``/``mems`` (None: it is). A process may narrow its own affinity inside its
        cpuset (taskset); a process outside it, or a cgroup not exactly it, disagrees."""
        if self.cpus != cpus:
            return f"cgroup cpuset.cpus {self.cpus or '(empty)'}"
        if mems is not None and self.mems != mems:
            return f"cgroup cpuset.mems {self.mems or '(empty)'}"
        for t in self.tasks:
            if not t.cpus.issubset(cpus):
                return f"pid {t.pid} Cpus_allowed_list {t.cpus}"
            if mems is not None and not t.mems.issubset(mems):
                return f"pid {t.pid} Mems_allowed_list {t.mems}"
        return None


def _parse(text: str) -> CPUSet:
    return CPUSet.parse(text.strip()) if text.strip() else CPUSet()


@dataclass(frozen=True)
class CgroupLayout:
    """Where a cgroup's cpuset files live under ``roots.cgroup``: ``<root>/cpuset/<path>`` (v1) or
    ``<root>/<path>`` (v2, ``cpuset.cpus.effective``)."""
    roots: KernelRoots
    unified: bool

    @classmethod
    def detect(cls, roots: KernelRoots) -> CgroupLayout:
        return cls(roots, unified=(roots.cgroup / "cgroup.controllers").exists())

    def problem(self) -> str | None:
        """Why cpusets cannot be read under these roots (None: they can)."""
        if not self.roots.proc.joinpath("self", "status").exists():
            return f"{self.roots.proc} is not a proc file system (--proc-root)"
        if not self.unified and not (self.roots.cgroup / "cpuset").is_dir():
            return (f"{self.roots.cgroup} holds neither a cgroup v2 hierarchy nor a v1 cpuset hierarchy "
                    f"(--cgroup-root)")
        return None

    def directory(self, cgroup: str) -> Path:
        rel = cgroup.lstrip("/")
        return self.roots.cgroup / rel if self.unified else self.roots.cgroup / "cpuset" / rel

    def files(self) -> tuple[str, str]:
        return ("cpuset.cpus.effective", "cpuset.mems.effective") if self.unified else ("cpuset.cpus", "cpuset.mems")


def cgroup_of_spec(cgroups_path: str) -> str | None:
    """The cgroup (path from the hierarchy's root) of an OCI ``linux.cgroupsPath``; systemd's
    ``slice:prefix:name`` form is expanded as runc does (``a-b.slice`` under ``a.slice``)."""
    if not cgroups_path:
        return None
    if cgroups_path.startswith("/"):
        return cgroups_path
    parts = cgroups_path.split(":")
    if len(parts) != 3:
        return "/" + cgroups_path
    slice_, prefix, name = parts
    path = ""
    if slice_ and slice_ != "-.slice":
        stem = slice_.removesuffix(".slice")
        acc = ""
        for piece in stem.split("-"):
            acc = f"{acc}-{piece}" if acc else piece
            path += f"/{acc}.slice"
    else:
        path = "/system.slice" if not slice_ else ""
    unit = name if name.endswith((".scope", ".slice")) else f"{prefix}-{name}.scope" if prefix else f"{name}.scope"
    return f"{path}/{unit}"


def cgroup_of_pid(roots: KernelRoots, pid: int) -> str | None:
    """The cpuset cgroup of a process from ``/proc/<pid>/cgroup`` (v1 ``cpuset`` line, else v2 ``0::``)."""
    try:
        text = (roots.proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    unified = None
    for line in text.splitlines():
        _, ctrls, path = line.split(":", 2)
        if "cpuset" in ctrls.split(","):
            return path
        if ctrls == "":
            unified = path
    return unified


def _task(roots: KernelRoots, pid: int) -> TaskView | None:
    try:
        text = (roots.proc / str(pid) / "status").read_text()
    except OSError:
        return None  # exited meanwhile
    cpus = mems = None
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            cpus = _parse(line.split(":", 1)[1])
        elif line.startswith("Mems_allowed_list:"):
            mems = _parse(line.split(":", 1)[1])
    if cpus is None or mems is None:
        return None
    return TaskView(pid, cpus, mems)


def read_view(layout: CgroupLayout, cgroup: str) -> KernelView | None:
    """The container's view, or None when its cgroup does not exist (not started, or gone)."""
    d = layout.directory(cgroup)
    cpus_file, mems_file = layout.files()
    try:
        cpus = _parse((d / cpus_file).read_text())
        mems = _parse((d / mems_file).read_text())
        procs = (d / "cgroup.procs").read_text().split()
    except (OSError, ValueError):
        return None
    tasks = tuple(t for t in (_task(layout.roots, int(p)) for p in procs if p.isdigit()) if t is not None)
    return KernelView(cgroup, cpus, mems, tasks)


def read_views(layout: CgroupLayout, cgroups: Mapping[str, str] | Iterable[tuple[str, str]]
               ) -> dict[str, KernelView | None]:
    """``{container id: view}`` for ``{container id: cgroup}`` (one batch for one worker thread)."""
    items = cgroups.items() if isinstance(cgroups, Mapping) else cgroups
    return {cid: read_view(layout, cg) for cid, cg in items}
