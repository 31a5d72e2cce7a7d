"""The topology-manager policy interface (kubelet's ``Policy``) and what every policy shares: the machine's
NUMA nodes (checked once, here), their distances and the options.

Each policy's rule -- which hints it keeps, whether NUMA distances count, what it admits -- lives in its own
module (policy_none.py, policy_best_effort.py, policy_restricted.py, policy_single_numa_node.py); the merge
mechanism they call is allocator.merge. Build a policy by name with allocator.topology_manager.factory.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..bitmask import mask_of
from ..errors import ConfigError
from ..hints import TopologyHint
from ..merge import HintList, ProviderHints, best_hint
from ..numa_distances import check_numa_distances
from .policy_options import NEEDS_DISTANCES, PolicyOptions

__all__ = ["Policy"]


@dataclass(frozen=True)
class Policy(ABC):
    """A topology manager policy bound to a machine's NUMA nodes.

    ``distances[n]``: the distances from node n to every node of ``numa_nodes`` in that order (needed with
    ``prefer-closest-numa-nodes``). ConfigError for NUMA ids outside 0..63, repeated ids, or a distance table
    that does not cover the machine when it is needed."""

    numa_nodes: tuple[int, ...]
    distances: Mapping[int, Sequence[int]] | None = None
    options: PolicyOptions = field(default_factory=PolicyOptions)
    default_mask: int = field(init=False, repr=False, compare=False)

    name: ClassVar[str] = ""
    # whether prefer-closest-numa-nodes changes this policy's merge (then the distances must cover the machine)
    uses_numa_distances: ClassVar[bool] = True

    def __post_init__(self) -> None:
        nodes = tuple(self.numa_nodes)
        object.__setattr__(self, "numa_nodes", nodes)
        object.__setattr__(self, "default_mask", mask_of(nodes))
        if len(set(nodes)) != len(nodes):
            raise ConfigError(f"NUMA node ids must be unique, got {list(nodes)}")
        if self.options.prefer_closest_numa and self.uses_numa_distances:
            if self.distances is None:
                raise ConfigError(NEEDS_DISTANCES)
            check_numa_distances(nodes, self.distances)

    @abstractmethod
    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        """The best hint for these providers' hints and whether the pod may be admitted."""

    def best_hint(self, lists: Sequence[HintList], *, closest: bool) -> tuple[int, bool]:
        """The merge mechanism on this machine: the best (mask, preferred) of the filtered hint lists."""
        return best_hint(lists, numa_nodes=self.numa_nodes, default=self.default_mask, distances=self.distances,
                         closest=closest)
