"""Policy ``restricted``: merge the hints; admit only when the best hint is preferred."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..hints import TopologyHint
from ..merge import ProviderHints
from .policy import Policy

__all__ = ["RestrictedPolicy"]


@dataclass(frozen=True)
class RestrictedPolicy(Policy):
    name = "restricted"

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        return self._merge(providers_hints)
