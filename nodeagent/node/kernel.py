"""What the kernel says a container runs on: its cgroup's ``cpuset.cpus``/``cpuset.mems`` and the
``Cpus_allowed_list``/``Mems_allowed_list`` of its processes (``/proc/<pid>/status``).

Plain blocking file reads and writes (call them off the event loop); ``write_cpuset`` is how the proxy narrows
and widens a running container in the kernel directly. The cgroup of a container is found from the OCI
spec's ``linux.cgroupsPath`` (cgroupfs ``/kubepods/pod<uid>/<id>`` or systemd ``slice:prefix:name``) or
from ``/proc/<pid>/cgroup``; cgroup v1 (the ``cpuset`` hierarchy) and v2 (unified) are both read. The roots
are configurable, for a proxy that sees the host's ``/proc`` (hostPID) and ``/sys/fs/cgroup`` elsewhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from allocator.cpuset import CPUSet

__all__ = ["CgroupLayout", "KernelReader", "KernelRoots", "KernelView", "TaskView", "cgroup_of_pid", "cgroup_of_spec",
           "read_view", "read_views", "write_cpuset", "write_cpusets"]


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
        """The files that show a cgroup's cpuset (v2: what the kernel applies, the parent's limits included)."""
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


def _read(path: str) -> bytes:
    """A small kernel file, whole (plain ``os`` calls: a pass reads hundreds of them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _field(text: bytes, name: bytes) -> bytes | None:
    """The value of ``name:`` in a ``/proc/<pid>/status`` text."""
    i = text.find(b"\n" + name + b":")
    if i < 0:
        return None
    i += len(name) + 2
    j = text.find(b"\n", i)
    return text[i:] if j < 0 else text[i:j]


class KernelReader:
    """Reads containers' kernel views, remembering for each cgroup what its files said at the last read.

    When a cgroup's cpuset files and its list of processes read exactly as last time, and last time every one of
    its processes was read and within the cgroup's cpuset, its processes' ``/proc/<pid>/status`` are not read
    again: the kernel keeps a process's affinity within its cgroup's cpuset (``sched_setaffinity`` may only
    narrow it there), resets it whenever the cpuset is written (which shows in the files), and a process that
    joins the cgroup changes the list. So a re-read could only show a process narrowing itself, which is
    allowed. A view that disagrees is never remembered. Safe to call from several threads."""

    def __init__(self, layout: CgroupLayout) -> None:
        self.layout = layout
        self._files = layout.files()
        self._last: dict[str, tuple[tuple[bytes, bytes, bytes], KernelView]] = {}
        self._parsed: dict[bytes, CPUSet] = {}  # cpu-list text -> set (a node has few distinct ones)
        self._dirs: dict[str, str] = {}         # cgroup -> its directory

    def _cpuset(self, text: bytes) -> CPUSet:
        out = self._parsed.get(text)
        if out is None:
            if len(self._parsed) > 4096:
                self._parsed.clear()
            out = self._parsed[text] = _parse(text.decode())
        return out

    def _task(self, pid: int) -> TaskView | None:
        try:
            text = _read(f"{self.layout.roots.proc}/{pid}/status")
        except OSError:
            return None  # exited meanwhile
        cpus, mems = _field(text, b"Cpus_allowed_list"), _field(text, b"Mems_allowed_list")
        if cpus is None or mems is None:
            return None
        return TaskView(pid, self._cpuset(cpus), self._cpuset(mems))

    def view(self, cgroup: str) -> KernelView | None:
        """The container's view, or None when its cgroup does not exist (not started, or gone)."""
        d = self._dirs.get(cgroup)
        if d is None:
            d = self._dirs[cgroup] = str(self.layout.directory(cgroup))
        try:
            key = (_read(f"{d}/{self._files[0]}"), _read(f"{d}/{self._files[1]}"), _read(f"{d}/cgroup.procs"))
        except OSError:
            self._last.pop(cgroup, None)
            return None
        last = self._last.get(cgroup)
        if last is not None and last[0] == key:
            return last[1]
        try:
            cpus, mems = self._cpuset(key[0]), self._cpuset(key[1])
            pids = [int(p) for p in key[2].split()]
        except ValueError:
            return None
        tasks = tuple(t for t in (self._task(p) for p in pids) if t is not None)
        view = KernelView(cgroup, cpus, mems, tasks)
        if len(tasks) == len(pids) and all(t.cpus.issubset(cpus) and t.mems.issubset(mems) for t in tasks):
            self._last[cgroup] = (key, view)
        else:
            self._last.pop(cgroup, None)
        return view

    def views(self, cgroups: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, KernelView | None]:
        """``{container id: view}`` for ``{container id: cgroup}`` (one batch for one worker thread)."""
        items = cgroups.items() if isinstance(cgroups, Mapping) else cgroups
        return {cid: self.view(cg) for cid, cg in items}

    def retain(self, cgroups: Iterable[str]) -> None:
        """Forget what was read of cgroups other than these (their containers are gone)."""
        keep = set(cgroups)
        for cg in [c for c in self._last if c not in keep]:
            self._last.pop(cg, None)
        for cg in [c for c in self._dirs if c not in keep]:
            self._dirs.pop(cg, None)


def read_view(layout: CgroupLayout, cgroup: str) -> KernelView | None:
    """The container's view, or None when its cgroup does not exist (not started, or gone); read afresh."""
    return KernelReader(layout).view(cgroup)


def read_views(layout: CgroupLayout, cgroups: Mapping[str, str] | Iterable[tuple[str, str]]
               ) -> dict[str, KernelView | None]:
    """``{container id: view}`` for ``{container id: cgroup}``, read afresh."""
    return KernelReader(layout).views(cgroups)


def write_cpuset(layout: CgroupLayout, cgroup: str, cpus: CPUSet, mems: CPUSet | None) -> str | None:
    """Write a cgroup's ``cpuset.cpus`` (then ``cpuset.mems``) as runc does; the kernel moves the cgroup's
    processes at once. Returns why it could not (None: written); a cgroup that does not exist (container not
    started, or gone) is not created."""
    d = layout.directory(cgroup)
    for name, value in (("cpuset.cpus", cpus), ("cpuset.mems", mems)):
        if value is None:
            continue
        try:
            fd = os.open(d / name, os.O_WRONLY | os.O_TRUNC)  # as runc opens them
        except OSError as e:
            return f"{d / name}: {e.strerror}"
        try:
            os.write(fd, str(value).encode())
        except OSError as e:
            return f"{d / name} = {value}: {e.strerror}"
        finally:
            os.close(fd)
    return None


def write_cpusets(layout: CgroupLayout, items: Iterable[tuple[str, CPUSet, CPUSet | None]]) -> list[str | None]:
    """``write_cpuset`` for each ``(cgroup, cpus, mems)`` (one batch for one worker thread)."""
    return [write_cpuset(layout, cg, cpus, mems) for cg, cpus, mems in items]
