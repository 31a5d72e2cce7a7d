"""Start-up reconciliation: make the checkpoint, the registry and the runtime agree again.

After a restart (or a SIGKILL between any two steps) the proxy lists the runtime's sandboxes and containers:
assignments of containers that no longer exist (or whose pod's sandbox is stopped) are dropped, CPUs and memory
alike (except those
the webhook's intent announces for a running pod and kubelet has not created yet), running
containers are adopted into the registry, cpusets containerd records differently from the state are applied
again, and then every running container's real cpuset is read from the kernel and repaired where it is not the
decision (``converge``: drift behind the proxy's back, updates lost to a kill -9 mid-narrowing, records
containerd rolled back).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass

from allocator.cpuset import CPUSet
from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.node import NodeAllocator
from allocator.topology import Topology
from nodeagent.decisions.bypass import BypassRule
from nodeagent.decisions.registry import Registry, Tracked
from nodeagent.node.converge import Converger
from nodeagent.node.cpuset_pusher import CpusetPusher
from nodeagent.node.runtime_reads import container_statuses
from nodeagent.ports import RuntimeReader
from protos import cri_pb2

__all__ = ["ReconcileReport", "reconcile"]

log = logging.getLogger("numapin.criproxy")



@dataclass(frozen=True)
class ReconcileReport:
    sandboxes: int
    containers: int
    dropped: tuple[tuple[str, str], ...]   # (pod uid, container) assignments released
    adopted: int
    repaired: int                  # containers whose cpuset in containerd's record was not the decision
    failed: int = 0
    kernel_checked: int = 0        # running containers whose real cpuset was read from the kernel
    kernel_repaired: int = 0       # of those, repaired (the kernel showed something else)
    kernel_failed: int = 0

    def __str__(self) -> str:
        return (f"{self.sandboxes} sandboxes, {self.containers} containers, dropped "
                f"{list(self.dropped) or 'nothing'}, adopted {self.adopted}, re-applied {self.repaired} cpusets "
                f"containerd recorded differently ({self.failed} failed); kernel: checked {self.kernel_checked} "
                f"running containers, repaired {self.kernel_repaired} cpusets ({self.kernel_failed} failed)")


def _intent_containers(sb: cri_pb2.PodSandbox) -> tuple[str, ...]:
    text = sb.annotations.get(INTENT_ANNOTATION)
    if text is None:
        return ()
    try:
        pod = decode_intent(text, uid=sb.metadata.uid, namespace=sb.metadata.namespace, name=sb.metadata.name,
                            annotations=dict(sb.annotations))
    except PodSpecError:
        return ()
    return tuple(c.name for c in pod.containers)


def _parse_cpus(text: str) -> CPUSet | None:
    try:
        return CPUSet.parse(text)
    except ValueError:
        return None


async def reconcile(reader: RuntimeReader, topology: Topology, allocator: NodeAllocator, registry: Registry,
                    pusher: CpusetPusher, *, converger: Converger | None = None,
                    lift_cfs_quota: bool = True, bypass: BypassRule | None = None,
                    creating: Collection[tuple[str, str]] = (),
                    timeout: float = 30.0) -> ReconcileReport:
    """Call with the allocation lock held (no decision is taken meanwhile). ``creating``: (pod uid, container)
    whose CPUs are decided and whose create is at the runtime (they keep their CPUs). Raises RuntimeCallError when the
    runtime cannot be listed; nothing is changed then."""
    bypass = bypass or BypassRule()
    sandboxes = {s.id: s for s in await reader.list_sandboxes(timeout=timeout)}
    containers = list(await reader.list_containers(timeout=timeout))

    # 1. drop what is gone: assignments without a container, pods whose sandboxes are all stopped
    present: set[tuple[str, str]] = set()
    for c in containers:
        sb = sandboxes.get(c.pod_sandbox_id)
        uid = sb.metadata.uid if sb is not None else c.labels.get("io.kubernetes.pod.uid", "")
        present.add((uid, c.metadata.name))
    ready_pods = {s.metadata.uid for s in sandboxes.values() if s.state == cri_pb2.SANDBOX_READY}
    # containers the webhook's intent announces for running pods: admitted with their pod, they keep their
    # CPUs before kubelet creates them (as kubelet's CPU manager keeps them for every container of the spec)
    announced = {(s.metadata.uid, name) for s in sandboxes.values() if s.state == cri_pb2.SANDBOX_READY
                 for name in _intent_containers(s)}
    dropped: list[tuple[str, str]] = []
    for uid, pod in list(allocator.state.assignments.items()):
        for name in list(pod):
            if (uid, name) in announced or (uid, name) in creating:
                continue
            if (uid, name) not in present or uid not in ready_pods:
                allocator.release_container(uid, name)
                dropped.append((uid, name))
    # the same for memory (memoryManagerPolicy Static): a Guaranteed container on the shared pool holds memory
    # without CPUs, and a kill -9 between the two files' writes leaves an entry in one of them only
    held = allocator.memory_state.assignments if allocator.memory_state is not None else {}
    for uid, blocks in list(held.items()):
        for name in list(blocks):
            if (uid, name) in announced or (uid, name) in creating:
                continue
            if (uid, name) not in present or uid not in ready_pods:
                allocator.release_container(uid, name)
                if (uid, name) not in dropped:
                    dropped.append((uid, name))

    # 2. adopt what runs
    registry.containers.clear()
    registry.sandboxes = {sid: s.metadata.uid for sid, s in sandboxes.items()}
    pool = allocator.shared_pool()
    pool_mems = topology.numa_of(pool)
    push: list[tuple[Tracked, CPUSet, CPUSet | None, int | None]] = []
    live: list[tuple[Tracked, CPUSet | None]] = []
    adopted = 0
    for c in containers:
        sb = sandboxes.get(c.pod_sandbox_id)
        if sb is None:
            continue
        uid = sb.metadata.uid
        ref = f"{sb.metadata.namespace}/{sb.metadata.name}"
        exited = c.state in (cri_pb2.CONTAINER_EXITED, cri_pb2.CONTAINER_UNKNOWN) or sb.state != cri_pb2.SANDBOX_READY
        verdict = bypass.verdict(uid, sb.metadata.namespace, sb.metadata.name, sb.annotations)
        untouched = verdict in ("self", "untouched")  # a honoured bypass elsewhere runs on the shared pool
        cpus = None if untouched or verdict == "shared" else allocator.container_cpus(uid, c.metadata.name)
        if untouched:
            mode = "bypass"
        elif cpus is not None:
            mode = allocator.state.mode(uid, c.metadata.name)
        else:
            mode = "shared"
        t = Tracked(c.id, c.pod_sandbox_id, uid, ref, c.metadata.name, mode, exited=exited)  # type: ignore[arg-type]
        registry.add(t)
        adopted += 1
        if not (exited or untouched):
            live.append((t, cpus))
    statuses = await container_statuses(reader, (t.id for t, _ in live), timeout=timeout)
    for (t, cpus), st in zip(live, statuses, strict=True):
        if st is None:
            registry.remove(t.id)
            continue
        res = st.resources.linux
        t.cpus = _parse_cpus(res.cpuset_cpus) if res.cpuset_cpus else None
        t.mems = _parse_cpus(res.cpuset_mems) if res.cpuset_mems else None
        if cpus is not None:
            quota = -1 if lift_cfs_quota and res.cpu_quota > 0 else None
            mems = topology.numa_of(cpus)
            if quota is not None:
                t.cpus = None  # force the push so the quota is lifted too
            push.append((t, cpus, mems, quota))
        else:
            push.append((t, pool, pool_mems, None))
    async with pusher.gate.exclusive():
        result = await pusher.push(push)
    kernel = await converger.converge_once("start-up reconcile") if converger is not None else None
    return ReconcileReport(len(sandboxes), len(containers), tuple(dropped), adopted, result.changed, result.failed,
                           kernel.checked if kernel else 0, kernel.repaired if kernel else 0,
                           kernel.failed if kernel else 0)
