"""Policy ``restricted`` (kubelet's policy_restricted.go): merge like ``best-effort`` (NUMA distances counting
with ``prefer-closest-numa-nodes``); admit a pod only when the best hint is preferred."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..hints import TopologyHint
from ..merge import ProviderHints, filter_providers_hints, hint_of_mask
from .policy import Policy

__all__ = ["RestrictedPolicy"]


@dataclass(frozen=True)
class RestrictedPolicy(Policy):
    name: ClassVar[str] = "restricted"

    def can_admit(self, hint: TopologyHint) -> bool:
        return hint.preferred

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        lists = filter_providers_hints(providers_hints, self.default_mask)
        mask, preferred = self.best_hint(lists, closest=self.options.prefer_closest_numa)
        hint = hint_of_mask(mask, preferred)
        return hint, self.can_admit(hint)
