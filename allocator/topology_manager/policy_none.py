"""Policy ``none`` (kubelet's policy_none.go): no alignment. No hints are gathered (the scope is ``none``), the
merged hint is "any NUMA node, not preferred", and every pod is admitted."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..hints import TopologyHint
from ..merge import ProviderHints
from .policy import Policy

__all__ = ["NonePolicy"]


@dataclass(frozen=True)
class NonePolicy(Policy):
    name: ClassVar[str] = "none"
    uses_numa_distances: ClassVar[bool] = False  # nothing is merged

    def can_admit(self, hint: TopologyHint) -> bool:
        return True

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        hint = TopologyHint(None, False)
        return hint, self.can_admit(hint)
