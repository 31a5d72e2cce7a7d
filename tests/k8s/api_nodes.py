"""Nodes that exist only as API objects (no kubelet, no containerd): a Node with labels, capacity and allocatable as
a kubelet would report them, and the NodeResourceTopology numapin's node agent would publish for that machine with
those free CPUs (``allocator.nrt.build_nrt``, as ``nodeagent`` builds it, with a state version). The scheduler and
numapin's webhook see them as real nodes; a pod bound to one stays Pending (nothing runs it) and is deleted by force.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from allocator.cpuset import CPUSet
from allocator.nrt import build_nrt
from allocator.topology import Topology
from numapin_lab.k8s.control_plane import ControlPlane

__all__ = ["ApiNode", "create", "delete"]


@dataclass(frozen=True)
class ApiNode:
    name: str
    topology: Topology
    free_cpus: CPUSet  # the CPUs an exclusive allocation could take now, as the node agent publishes them
    reserved_cpus: CPUSet
    labels: dict[str, str] = field(default_factory=dict)  # besides kubernetes.io/hostname
    topology_manager_policy: str = "single-numa-node"
    memory: str = "256Gi"

    def node(self) -> dict[str, Any]:
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", **self.labels}
        return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": self.name, "labels": labels}}

    def status(self) -> dict[str, Any]:
        """What kubelet reports: capacity all CPUs, allocatable without the reserved ones."""
        cpus = len(self.topology.all_cpus)
        capacity = {"cpu": str(cpus), "memory": self.memory, "pods": "110"}
        return {"status": {"capacity": capacity,
                           "allocatable": capacity | {"cpu": str(cpus - len(self.reserved_cpus))}}}

    def nrt(self) -> dict[str, Any]:
        return build_nrt(self.name, self.topology, free_cpus=self.free_cpus, reserved_cpus=self.reserved_cpus,
                         topology_manager_policy=self.topology_manager_policy,
                         attributes={"numapinStateVersion": "1-1"})


def create(cp: ControlPlane, *nodes: ApiNode) -> None:
    """The Nodes and their topologies, then each Node's status written as kubelet writes it (``nodes/status``)."""
    items = [n.node() for n in nodes] + [n.nrt() for n in nodes]
    cp.kubectl("create", "--validate=false", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                           "items": items}))
    for node in nodes:
        cp.kubectl("patch", "node", node.name, "--subresource", "status", "--type", "merge", "-p",
                   json.dumps(node.status()))


def delete(cp: ControlPlane, *names: str) -> None:
    """Remove the nodes and their topologies (those that are there)."""
    cp.kubectl("delete", "--ignore-not-found", "--wait=false", *(f"node/{n}" for n in names),
               *(f"noderesourcetopologies/{n}" for n in names), check=False)
