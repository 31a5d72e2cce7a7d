"""Rebuilding the CRI pod model after a restart of the proxy.

Without the webhook's intent annotation, the proxy learns a pod's containers (what kubelet asked for each,
and which are init containers) as kubelet creates them. A restarted proxy rebuilds that from the runtime's
record: the containers of each ready sandbox, their resources, creation and exit times and exit codes
(nodeagent.decisions.pod_roles.replay). A container holding CPUs in the state had its CFS quota lifted: its request is
the number of CPUs it holds. Then an app container can reuse its exited init container's CPUs after a
restart, as kubelet does.
"""

from __future__ import annotations

import logging

from allocator.intent import INTENT_ANNOTATION
from allocator.node import NodeAllocator
from nodeagent.decisions.bypass import BypassRule
from nodeagent.decisions.pod_roles import KIND_ANNOTATION, Instance, replay
from nodeagent.decisions.registry import CriPod, Registry
from nodeagent.node.runtime_reads import container_statuses
from nodeagent.ports import RuntimeReader
from protos import cri_pb2

__all__ = ["rebuild_cri_pods"]

log = logging.getLogger("numapin.criproxy")

_PERIOD = 100000


async def rebuild_cri_pods(reader: RuntimeReader, allocator: NodeAllocator, registry: Registry,
                           bypass: BypassRule, *, timeout: float = 30.0) -> int:
    """Fill ``registry.pods`` for every ready pod that carries no intent annotation; returns how many. Raises
    RuntimeCallError when the runtime cannot be listed."""
    listed = await reader.list_sandboxes(timeout=timeout)
    all_containers = await reader.list_containers(timeout=timeout)
    sandboxes = {s.id: s for s in listed
                 if s.state == cri_pb2.SANDBOX_READY and INTENT_ANNOTATION not in s.annotations
                 and not bypass.honours(s.metadata.uid, s.metadata.namespace, s.metadata.name, s.annotations)}
    by_sandbox: dict[str, list[cri_pb2.Container]] = {}
    for c in all_containers:
        if c.pod_sandbox_id in sandboxes:
            by_sandbox.setdefault(c.pod_sandbox_id, []).append(c)
    rebuilt = 0
    for sid, items in by_sandbox.items():
        uid = sandboxes[sid].metadata.uid
        statuses = await container_statuses(reader, (c.id for c in items), timeout=timeout)
        pod = CriPod()
        instances: list[Instance] = []
        latest: dict[str, tuple[int, int]] = {}
        for c, st in zip(items, statuses, strict=True):
            if st is None:
                continue
            name = c.metadata.name
            exited = st.state == cri_pb2.CONTAINER_EXITED
            instances.append(Instance(name, c.metadata.attempt, st.created_at or c.created_at, exited,
                                      st.exit_code if exited else None, st.finished_at,
                                      c.annotations.get(KIND_ANNOTATION)))
            key = (c.metadata.attempt, st.created_at or c.created_at)
            if name not in latest or key > latest[name]:
                latest[name] = key
                pod.resources[name] = _resources(st.resources.linux, allocator, uid, name)
        pod.roles = replay(instances)
        registry.pods[uid] = pod
        rebuilt += 1
        log.info("pod model of %s/%s rebuilt from the runtime: %s", sandboxes[sid].metadata.namespace,
                 sandboxes[sid].metadata.name,
                 ", ".join(f"{n}={pod.roles.role(n)}" for n in pod.roles.order) or "no containers")
    return rebuilt


def _resources(res: cri_pb2.LinuxContainerResources, allocator: NodeAllocator, uid: str,
               name: str) -> cri_pb2.LinuxContainerResources:
    out = cri_pb2.LinuxContainerResources()
    out.CopyFrom(res)
    cpus = allocator.container_cpus(uid, name)
    if cpus is not None:  # pinned: the quota was lifted; the CPUs it holds are what it asked for
        n = len(cpus)
        out.cpu_period, out.cpu_quota, out.cpu_shares = _PERIOD, n * _PERIOD, n * 1024
    return out
