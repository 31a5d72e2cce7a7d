"""The topology manager: a policy and a scope, admitting pods over a set of hint providers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..pod import PodInfo
from .factory import new_policy
from .policy import Policy
from .scope import AdmitResult, HintProvider, Scope, new_scope

__all__ = ["TopologyManager"]


@dataclass(frozen=True)
class TopologyManager:
    policy: Policy
    scope: Scope

    @classmethod
    def from_config(
        cls,
        *,
        numa_nodes: Sequence[int],
        policy: str = "none",
        scope: str = "container",
        options: Mapping[str, object] | None = None,
        distances: Mapping[int, Sequence[int]] | None = None,
    ) -> TopologyManager:
        """Validate the configuration against the machine (ConfigError) and build the manager."""
        pol = new_policy(policy, numa_nodes, distances=distances, options=options)
        return cls(policy=pol, scope=new_scope(scope, pol))

    def admit(self, state: Any, pod: PodInfo, providers: Sequence[HintProvider]) -> AdmitResult:
        return self.scope.admit(state, pod, providers)
