"""Memory as a topology hint provider: numapin pins memory to the NUMA nodes of the container's CPUs, so
memory itself has no NUMA preference (kubelet's nil hints: "don't care") and needs no allocation."""

from __future__ import annotations

from typing import Any

from .hints import TopologyHint
from .merge import ProviderHints
from .pod import PodInfo

__all__ = ["MemoryHintProvider"]


class MemoryHintProvider:
    """HintProvider for memory: no preference; cpuset.mems follows the CPUs chosen by the CPU provider."""

    def topology_hints(self, state: Any, pod: PodInfo, container_name: str) -> ProviderHints:
        return None

    def pod_topology_hints(self, state: Any, pod: PodInfo) -> ProviderHints:
        return None

    def allocate(self, state: Any, pod: PodInfo, container_name: str, affinity: TopologyHint | None) -> None:
        return None
