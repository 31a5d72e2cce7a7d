"""What a process may really run on, read from the kernel: ``/proc/<pid>/status`` (``Cpus_allowed_list``,
``Mems_allowed_list``) and its cpuset cgroup (v1 ``cpuset.cpus``, or v2 ``cpuset.cpus.effective``).

Used by ``numapin demo``, ``numapin status`` and the end-to-end tests to check the proxy's decisions against the
machine."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from allocator.cpuset import CPUSet

__all__ = ["ProcessCpus", "cgroup_file", "process_cpus"]


@dataclass(frozen=True)
class ProcessCpus:
    pid: int
    cpus: CPUSet          # Cpus_allowed_list
    mems: CPUSet          # Mems_allowed_list
    cgroup_cpus: CPUSet | None  # the cpuset cgroup's CPUs (None: no cpuset cgroup found)


def _status_field(pid: int, key: str, proc: Path) -> str:
    for line in (proc / str(pid) / "status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    raise LookupError(f"/proc/{pid}/status has no {key}")


def cgroup_file(pid: int, controller: str, name: str, *, proc: Path = Path("/proc"),
                cgroup_root: Path = Path("/sys/fs/cgroup")) -> str | None:
    """The content of a cgroup file of ``pid`` for ``controller`` (v1 hierarchy, else the v2 unified one);
    None when the process has no such cgroup or the file does not exist."""
    unified: str | None = None
    for line in (proc / str(pid) / "cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if hid == "0" and ctrls == "":
            unified = path
            continue
        if controller in ctrls.split(","):
            for base in (cgroup_root / ctrls, cgroup_root / controller):
                f = base / path.lstrip("/") / name
                if f.exists():
                    return f.read_text().strip()
            return None
    if unified is not None:
        for base in (cgroup_root, cgroup_root / "unified"):
            for n in (name, name.replace(".cpus", ".cpus.effective")):
                f = base / unified.lstrip("/") / n
                if f.exists():
                    return f.read_text().strip()
    return None


def process_cpus(pid: int, *, proc: Path = Path("/proc"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> ProcessCpus:
    """The CPUs and memory nodes ``pid`` may use. Raises OSError/LookupError when the process is gone."""
    cpus = CPUSet.parse(_status_field(pid, "Cpus_allowed_list", proc))
    mems = CPUSet.parse(_status_field(pid, "Mems_allowed_list", proc))
    raw = cgroup_file(pid, "cpuset", "cpuset.cpus", proc=proc, cgroup_root=cgroup_root)
    return ProcessCpus(pid, cpus, mems, CPUSet.parse(raw) if raw else None)
