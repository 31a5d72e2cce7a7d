"""The cpuset pusher reaches the runtime only through the ``RecordWriter`` port: a door that must not call the
runtime while it answers an event (the NRI plugin) supplies a writer that collects the updates and returns them with
its answer. Pushed without a cgroup layout, every change reaches the writer, in the registry's order, and only the
containers whose cpuset changes; a container the runtime no longer knows leaves the registry."""

from __future__ import annotations

import grpc

from allocator.cpuset import CPUSet
from nodeagent.decisions.registry import Registry, Tracked
from nodeagent.node.cpuset_pusher import CpusetPusher
from nodeagent.ports import RuntimeCallError
from protos import cri_pb2


class Collector:
    """A writer that keeps what it is given (the NRI door's way) and knows the containers in ``known``."""

    def __init__(self, known: set[str]) -> None:
        self.known = known
        self.updates: list[tuple[str, str, str]] = []

    async def update_resources(self, container_id: str, resources: cri_pb2.LinuxContainerResources, *,
                               timeout: float = 10.0) -> None:
        if container_id not in self.known:
            raise RuntimeCallError(grpc.StatusCode.NOT_FOUND, f"container {container_id} not found")
        self.updates.append((container_id, resources.cpuset_cpus, resources.cpuset_mems))


async def test_a_pool_change_is_collected_through_the_writer_port() -> None:
    registry = Registry()
    for cid in ("a", "b", "gone"):
        registry.add(Tracked(cid, "sb", "uid-" + cid, "ns/" + cid, cid, "shared", CPUSet.parse("0-7")))
    registry.add(Tracked("pinned", "sb", "uid-p", "ns/p", "p", "exclusive", CPUSet.parse("6-7")))
    registry.add(Tracked("done", "sb", "uid-d", "ns/d", "d", "shared", CPUSet.parse("0-7"), exited=True))
    writer = Collector({"a", "b", "pinned", "done"})
    pusher = CpusetPusher(writer, registry)  # no layout: nothing written in the kernel directly

    result = await pusher.resize_shared(CPUSet.parse("0-5"), CPUSet.parse("0"))

    assert writer.updates == [("a", "0-5", "0"), ("b", "0-5", "0")]
    assert (result.changed, result.failed, result.direct) == (3, 0, 0)  # "gone" counts as done: nothing to narrow
    assert "gone" not in registry.containers
    assert registry.containers["a"].cpus == CPUSet.parse("0-5")
    writer.updates.clear()
    assert (await pusher.resize_shared(CPUSet.parse("0-5"), CPUSet.parse("0"))).changed == 0
    assert writer.updates == []  # nothing changed, nothing sent
