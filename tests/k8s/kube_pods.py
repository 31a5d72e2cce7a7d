"""Pods on the session's real node (tests/kubelet_node.py), as a user makes and reads them (kubectl v1.36.2 as the
admin), and what the kernel says their containers run on (``/proc/<pid>/status`` and the container's cgroup, found
under the node's cgroup root by the pod's uid and the container's id; nothing asked of numapin)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.cpuset import CPUSet
from numapin_lab.cri.containerd import BUSYBOX_IMAGE
from numapin_lab.k8s.lab_node import LabNode

__all__ = ["KernelView", "Pods", "wait_for"]

CGROUPS = Path("/sys/fs/cgroup")


def wait_for(check: Callable[[], Any], what: str, timeout: float = 90.0) -> Any:
    """``check()``'s first truthy answer; fails saying ``what`` (and the last answer) when none comes in time (a
    bound for a machine shared with other suites, not a speed check)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")
        time.sleep(0.2)


@dataclass(frozen=True)
class KernelView:
    """One container as the kernel has it."""

    cgroup_cpus: CPUSet
    task_cpus: tuple[CPUSet, ...]  # Cpus_allowed_list of each of its processes
    cfs_quota_us: int
    cfs_period_us: int

    @property
    def cpus(self) -> CPUSet | None:
        """The CPUs when its cgroup and every process agree, else None."""
        return self.cgroup_cpus if all(c == self.cgroup_cpus for c in self.task_cpus) else None


def _cpus_allowed(pid: str) -> CPUSet | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
    return CPUSet.parse(line.split(":", 1)[1].strip())


class Pods:
    def __init__(self, node: LabNode) -> None:
        self.node = node
        self.cp = node.cp
        self.made: list[str] = []  # the pods this story created, for ``delete_all`` at its end

    def manifest(self, name: str, *, cpu: str, cpu_limit: str | None = None, memory: str = "32Mi",
                 annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A pod of one container ``c`` (busybox sleeping) on the host network for this node (``nodeSelector``: the
        scheduler still binds it), tolerating the node's NotReady (no CNI here): Guaranteed when ``cpu_limit``
        equals ``cpu``, Burstable otherwise (no CPU limit: None)."""
        limits = {"memory": memory} | ({"cpu": cpu_limit} if cpu_limit else {})
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "annotations": dict(annotations or {})},
                "spec": {"hostNetwork": True, "terminationGracePeriodSeconds": 0,
                         "nodeSelector": {"kubernetes.io/hostname": self.node.name},
                         "tolerations": [{"operator": "Exists"}],
                         "containers": [{"name": "c", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                         "command": ["sleep", "86400"],
                                         "resources": {"requests": {"cpu": cpu, "memory": memory},
                                                       "limits": limits}}]}}

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Create through the API (the scheduler binds it) and wait until its container runs."""
        name = manifest["metadata"]["name"]
        self.made.append(name)
        self.cp.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(manifest))
        return wait_for(lambda: self._running(name), f"pod {name} running")  # type: ignore[no-any-return]

    def _running(self, name: str) -> dict[str, Any] | None:
        pod = self.get(name)
        statuses = pod.get("status", {}).get("containerStatuses", [])
        return pod if statuses and all("running" in s.get("state", {}) for s in statuses) else None

    def get(self, name: str) -> dict[str, Any]:
        return json.loads(self.cp.kubectl("get", "pod", name, "-o", "json").stdout)  # type: ignore[no-any-return]

    def delete(self, *names: str) -> None:
        """Delete as a user does (the pod's grace period, 0 here) and wait until the API no longer has them and the
        node's agent gave their CPUs back (the object goes before kubelet stops the sandbox: a story starting right
        after would otherwise find the CPUs still taken)."""
        uids = [self.get(n)["metadata"]["uid"] for n in names]
        self.cp.kubectl("delete", "pod", "--wait=false", *names)
        for name in names:
            wait_for(lambda n=name: self.cp.kubectl("get", "pod", n, check=False).returncode != 0,  # type: ignore[misc]
                     f"pod {name} gone")
        agent = self.node.proxy
        assert agent is not None
        wait_for(lambda: not set(uids) & set(agent.state().get("entries", {})), f"the CPUs of {names} released")

    def delete_all(self) -> None:
        """Delete the pods this story made that are still there (its end, passed or failed)."""
        left = [n for n in self.made if self.cp.kubectl("get", "pod", n, check=False).returncode == 0]
        if left:
            self.delete(*left)

    def container_id(self, pod: Mapping[str, Any], container: str = "c") -> str:
        status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
        return str(status["containerID"]).removeprefix("containerd://")

    def kernel(self, pod: Mapping[str, Any], container: str = "c") -> KernelView:
        """What the kernel says the container runs on."""
        cid, uid = self.container_id(pod, container), pod["metadata"]["uid"]
        root = self.node.cgroup_root.lstrip("/")
        found = [p for p in (CGROUPS / "cpuset" / root / "kubepods").glob(f"**/pod{uid}/{cid}")]
        assert len(found) == 1, f"container {cid} of pod {uid}: cgroup {found}"
        rel = found[0].relative_to(CGROUPS / "cpuset")
        pids = (found[0] / "cgroup.procs").read_text().split()
        tasks = tuple(c for c in map(_cpus_allowed, pids) if c is not None)
        assert tasks, f"container {cid}: no process in {found[0]}"
        return KernelView(CPUSet.parse((found[0] / "cpuset.cpus").read_text().strip()), tasks,
                          int((CGROUPS / "cpu" / rel / "cpu.cfs_quota_us").read_text()),
                          int((CGROUPS / "cpu" / rel / "cpu.cfs_period_us").read_text()))

    def cpus(self, pod: Mapping[str, Any], container: str = "c") -> CPUSet | None:
        return self.kernel(pod, container).cpus
