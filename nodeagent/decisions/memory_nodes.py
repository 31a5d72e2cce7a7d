"""A container's memory nodes (``cpuset.mems``) as the proxy gives them: the Memory Manager's NUMA nodes for a
container it accounts (``memoryManagerPolicy: Static``: Guaranteed pods' containers, Crane-pinned ones by their
memory limit), else the NUMA nodes of the container's CPUs (its own, or the shared pool's).

Every place that hands a container a cpuset asks here (the create's wire edit in ``create.py`` and kubelet's
updates in ``pinning.py``, the convergence's decision in ``node/converge.py`` and, as a last word, every push of
``node/cpuset_pusher.py``), so no path puts back the CPUs' nodes over the Memory Manager's.
"""

from __future__ import annotations

from allocator.cpuset import CPUSet
from allocator.memory.state import MemoryState
from allocator.node import NodeAllocator
from allocator.state import CPUState

__all__ = ["MemoryNodes"]

_CACHE_LIMIT = 4096


class MemoryNodes:
    def __init__(self, allocator: NodeAllocator) -> None:
        self.allocator = allocator
        self._numa: dict[CPUSet, CPUSet] = {}  # the few cpusets asked again and again (the pool's above all)

    def held(self, pod_uid: str, name: str) -> CPUSet | None:
        """The Memory Manager's nodes of the container, None when it accounts none for it."""
        return self.allocator.container_mems(pod_uid, name)

    def of_cpus(self, cpus: CPUSet) -> CPUSet:
        mems = self._numa.get(cpus)
        if mems is None:
            if len(self._numa) > _CACHE_LIMIT:
                self._numa.clear()
            mems = self._numa[cpus] = self.allocator.topology.numa_of(cpus)
        return mems

    def of(self, pod_uid: str, name: str, cpus: CPUSet) -> CPUSet:
        """The container's ``cpuset.mems`` when it runs on ``cpus``."""
        held = self.held(pod_uid, name) if pod_uid else None
        return held if held is not None else self.of_cpus(cpus)

    def snapshot(self) -> tuple[CPUState, MemoryState | None]:
        """Both states as they are now (compare two to learn whether a decision changed either)."""
        mem = self.allocator.memory_state
        return self.allocator.state.copy(), None if mem is None else mem.copy()

    def restore(self, snapshot: tuple[CPUState, MemoryState | None]) -> None:
        """Both states as ``snapshot`` took them (a decision undone)."""
        self.allocator.state, self.allocator.memory_state = snapshot
