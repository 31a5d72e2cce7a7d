"""Policy ``best-effort`` (kubelet's policy_best_effort.go): merge every provider's hints, NUMA distances
counting with ``prefer-closest-numa-nodes``; admit every pod, even when the best hint is not preferred."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..hints import TopologyHint
from ..merge import ProviderHints, filter_providers_hints, hint_of_mask
from .policy import Policy

__all__ = ["BestEffortPolicy"]


@dataclass(frozen=True)
class BestEffortPolicy(Policy):
    name: ClassVar[str] = "best-effort"

    def can_admit(self, hint: TopologyHint) -> bool:
        return True

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        lists = filter_providers_hints(providers_hints, self.default_mask)
        mask, preferred = self.best_hint(lists, closest=self.options.prefer_closest_numa)
        hint = hint_of_mask(mask, preferred)
        return hint, self.can_admit(hint)
