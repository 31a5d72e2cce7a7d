"""The Memory Manager as a topology-manager hint provider bound to one working ``MemoryState``.

The topology manager hands every provider the same ``state`` argument (the CPU state); the memory provider keeps
its own state instead, given when it is made: the node facade makes one per admission on a working copy and keeps
the copy only when the pod is admitted, so a rejected pod leaves no trace in either state.
"""

from __future__ import annotations

from typing import Any

from ..hints import TopologyHint
from ..merge import ProviderHints
from ..pod import PodInfo
from .policy import MemoryPolicy
from .state import Block, MemoryState

__all__ = ["MemoryProvider"]


class MemoryProvider:
    """HintProvider for ``memory`` and every ``hugepages-<size>`` (kubelet's Memory Manager, static policy)."""

    def __init__(self, policy: MemoryPolicy, state: MemoryState) -> None:
        self.policy = policy
        self.state = state

    def topology_hints(self, state: Any, pod: PodInfo, container_name: str) -> ProviderHints:
        return self.policy.topology_hints(self.state, pod, container_name)

    def pod_topology_hints(self, state: Any, pod: PodInfo) -> ProviderHints:
        return self.policy.pod_topology_hints(self.state, pod)

    def allocate(self, state: Any, pod: PodInfo, container_name: str,
                 affinity: TopologyHint | None) -> tuple[Block, ...] | None:
        return self.policy.allocate(self.state, pod, container_name, affinity)
