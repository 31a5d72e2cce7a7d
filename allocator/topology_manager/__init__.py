"""kubelet's topology manager: policies (one module each, each holding its own rule), scopes, the factory and
the manager tying them together. The merge mechanism the policies share is allocator.merge."""

from __future__ import annotations

from .factory import POLICIES, merge_hints, new_policy
from .manager import TopologyManager
from .policy import Policy
from .policy_best_effort import BestEffortPolicy
from .policy_none import NonePolicy
from .policy_options import KNOWN_OPTIONS, PolicyOptions, parse_policy_options
from .policy_restricted import RestrictedPolicy
from .policy_single_numa_node import SingleNumaNodePolicy
from .scope import (
    SCOPES,
    TOPOLOGY_AFFINITY_MESSAGE,
    TOPOLOGY_AFFINITY_REASON,
    AdmitResult,
    ContainerResult,
    HintProvider,
    new_scope,
)

__all__ = [
    "KNOWN_OPTIONS",
    "POLICIES",
    "SCOPES",
    "TOPOLOGY_AFFINITY_MESSAGE",
    "TOPOLOGY_AFFINITY_REASON",
    "AdmitResult",
    "BestEffortPolicy",
    "ContainerResult",
    "HintProvider",
    "NonePolicy",
    "Policy",
    "PolicyOptions",
    "RestrictedPolicy",
    "SingleNumaNodePolicy",
    "TopologyManager",
    "merge_hints",
    "new_policy",
    "new_scope",
    "parse_policy_options",
]
