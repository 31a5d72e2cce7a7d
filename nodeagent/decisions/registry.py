"""What the proxy knows about the runtime's containers and sandboxes (rebuilt by reconcile on start).

The allocator state says which CPUs a (pod, container name) owns; the registry maps the runtime's container
ids to those names and remembers the cpuset last applied to each container, so that narrowing touches only
containers whose cpuset changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from allocator.cpuset import CPUSet
from nodeagent.decisions.pod_roles import PodRoles
from protos import cri_pb2

__all__ = ["CriPod", "Registry", "Tracked", "TrackedMode"]

TrackedMode = Literal["exclusive", "share", "shared", "bypass"]


@dataclass
class Tracked:
    id: str
    sandbox_id: str
    pod_uid: str
    pod_ref: str
    name: str
    mode: TrackedMode
    cpus: CPUSet | None = None   # cpuset last applied (None: never set by numapin)
    mems: CPUSet | None = None
    exited: bool = False

    @property
    def pinned(self) -> bool:
        return self.mode in ("exclusive", "share")


@dataclass
class CriPod:
    """What CRI showed of one pod's containers (the pod model without the webhook's annotation): the resources
    kubelet asked for each container the runtime created, and the roles learned from their order."""

    resources: dict[str, cri_pb2.LinuxContainerResources] = field(default_factory=dict)
    roles: PodRoles = field(default_factory=PodRoles)

    def forget(self, name: str) -> None:
        """The container is removed: it leaves the model (it is not allocated again); its role stays known."""
        self.resources.pop(name, None)


@dataclass
class Registry:
    containers: dict[str, Tracked] = field(default_factory=dict)
    sandboxes: dict[str, str] = field(default_factory=dict)  # sandbox id -> pod uid
    # pod uid -> what CRI showed of its containers (the pod model without the webhook's annotation)
    pods: dict[str, CriPod] = field(default_factory=dict)

    def add(self, t: Tracked) -> None:
        self.containers[t.id] = t
        self.sandboxes[t.sandbox_id] = t.pod_uid

    def remove(self, container_id: str) -> Tracked | None:
        return self.containers.pop(container_id, None)

    def instances(self, pod_uid: str, name: str) -> list[Tracked]:
        return [t for t in self.containers.values() if t.pod_uid == pod_uid and t.name == name]

    def of_pod(self, pod_uid: str) -> list[Tracked]:
        return [t for t in self.containers.values() if t.pod_uid == pod_uid]

    def forget_pod(self, pod_uid: str) -> None:
        for t in self.of_pod(pod_uid):
            del self.containers[t.id]
        for sid in [s for s, u in self.sandboxes.items() if u == pod_uid]:
            del self.sandboxes[sid]
        self.pods.pop(pod_uid, None)

    def on_shared_pool(self) -> list[Tracked]:
        """Live containers that run on the shared pool (narrowed and widened with it)."""
        return [t for t in self.containers.values() if t.mode == "shared" and not t.exited]
