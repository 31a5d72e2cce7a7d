"""Policy ``single-numa-node``: keep only one-node preferred hints and "don't care"; admit only a preferred
result. A result spanning the whole machine (a one-node machine, or nothing but "don't care") has no
affinity. ``prefer-closest-numa-nodes`` does not apply."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..hints import TopologyHint
from ..merge import ProviderHints
from .policy import Policy

__all__ = ["SingleNumaNodePolicy"]


@dataclass(frozen=True)
class SingleNumaNodePolicy(Policy):
    name = "single-numa-node"

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        return self._merge(providers_hints)
