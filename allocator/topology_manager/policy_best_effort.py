"""Policy ``best-effort``: merge the hints; admit every pod (the best hint may be non-preferred)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..hints import TopologyHint
from ..merge import ProviderHints
from .policy import Policy

__all__ = ["BestEffortPolicy"]


@dataclass(frozen=True)
class BestEffortPolicy(Policy):
    name = "best-effort"

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        return self._merge(providers_hints)
