"""Topology hints: a NUMA affinity (a set of NUMA node ids, or None for "any") and a preferred flag."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TopologyHint"]


@dataclass(frozen=True, slots=True)
class TopologyHint:
    """kubelet's TopologyHint. ``numa`` None means no NUMA preference ("don't care")."""

    numa: frozenset[int] | None
    preferred: bool

    def __post_init__(self) -> None:
        if self.numa is not None and not isinstance(self.numa, frozenset):
            object.__setattr__(self, "numa", frozenset(self.numa))

    @property
    def mask(self) -> int:
        """The affinity as a bitmask (bit n = NUMA node n); 0 when there is no affinity."""
        m = 0
        for n in self.numa or ():
            m |= 1 << n
        return m

    def __str__(self) -> str:
        numa = "any" if self.numa is None else ",".join(str(n) for n in sorted(self.numa)) or "none"
        return f"{{numa: {numa}, preferred: {str(self.preferred).lower()}}}"
