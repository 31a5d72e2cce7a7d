"""Policy ``none``: no alignment; every pod is admitted and no hints are gathered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..hints import TopologyHint
from ..merge import ProviderHints
from .policy import Policy

__all__ = ["NonePolicy"]


@dataclass(frozen=True)
class NonePolicy(Policy):
    name = "none"

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        return TopologyHint(None, False), True
