"""kubelet's topology manager: policies (one module each), scopes, and the manager tying them together."""

from __future__ import annotations

from .manager import TopologyManager
from .policy import KNOWN_OPTIONS, POLICIES, Policy, PolicyOptions, new_policy, parse_policy_options
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
    "ContainerResult",
    "HintProvider",
    "Policy",
    "PolicyOptions",
    "TopologyManager",
    "new_policy",
    "new_scope",
    "parse_policy_options",
]
