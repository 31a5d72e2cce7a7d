"""Policy ``single-numa-node`` (kubelet's policy_single_numa_node.go).

- Before merging, every hint list keeps only "don't care" preferred hints and preferred hints of exactly one
  NUMA node (``filter_single_numa_hints``).
- ``prefer-closest-numa-nodes`` does not apply: one-node masks are compared by id.
- A result spanning the whole machine (a one-node machine, or nothing but "don't care") has no affinity.
- A pod is admitted only when the best hint is preferred.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..bitmask import bits_of
from ..compact_hints import HintFamily
from ..hints import TopologyHint
from ..merge import ExplicitHints, HintList, ProviderHints, explicit_hints, filter_providers_hints, hint_of_mask
from .policy import Policy

__all__ = ["SingleNumaNodePolicy", "filter_single_numa_hints"]


def filter_single_numa_hints(lst: HintList, default: int) -> ExplicitHints:
    """kubelet's filterSingleNumaHints: keep {nil, preferred} and preferred one-node hints."""
    if isinstance(lst, HintFamily):
        keep = [(1 << n, True) for n in bits_of(lst.universe)
                if lst.contains(1 << n) and lst.is_preferred(1 << n)]
        return explicit_hints(keep, default)
    kept: list[tuple[int | None, bool]] = [(m, True) for m in lst.raw_pref if m.bit_count() == 1]
    if lst.nil_pref:
        kept.append((None, True))
    return explicit_hints(kept, default)


@dataclass(frozen=True)
class SingleNumaNodePolicy(Policy):
    name: ClassVar[str] = "single-numa-node"
    uses_numa_distances: ClassVar[bool] = False  # prefer-closest-numa-nodes does not apply

    def can_admit(self, hint: TopologyHint) -> bool:
        return hint.preferred

    def merge(self, providers_hints: Sequence[ProviderHints]) -> tuple[TopologyHint, bool]:
        lists = [filter_single_numa_hints(lst, self.default_mask)
                 for lst in filter_providers_hints(providers_hints, self.default_mask)]
        mask, preferred = self.best_hint(lists, closest=False)
        hint = TopologyHint(None, preferred) if mask == self.default_mask else hint_of_mask(mask, preferred)
        return hint, self.can_admit(hint)
