"""Scalable hint lists: a provider's hints described as a family instead of 2^N enumerated masks.

kubelet's CPU hint generator (and its device-manager hints for already-allocated devices) emit *every* NUMA
mask that can hold the request. Those lists are up-sets: a mask is a hint iff it contains some required
nodes, stays inside a universe (the nodes the resource lives on) and its per-node weights (free CPUs) add
up to a threshold. ``HintFamily`` describes such a list in O(N) space. ``allocator.merge.merge_hints``
accepts a family wherever it accepts a list of hints and returns the same result the full list would give;
``HintFamily.hints()`` materialises the list in kubelet's order (for small N and for tests).

``cpu_hint_family`` builds the family for kubelet's static-policy CPU hints (generateCPUTopologyHints).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .bitmask import bits_of, iterate_masks, mask_of
from .cpuset import CPUSet
from .hints import TopologyHint
from .topology import Topology

__all__ = ["COMPACT_ABOVE_NUMA_NODES", "LIST_MAX_NODES", "HintFamily", "cpu_hint_family"]

# Widest family hints() lists in full (2^N masks).
LIST_MAX_NODES = 20
# Above this many CPU NUMA nodes the static policy hands the topology manager a family, not a list.
COMPACT_ABOVE_NUMA_NODES = 8


@dataclass(frozen=True, slots=True)
class HintFamily:
    """Every mask ``m`` with ``required ⊆ m ⊆ universe`` and ``sum(weight[n] for n in m) >= threshold``.

    A member is preferred iff its node count equals ``preferred_size``, or (align-by-socket) the number of
    sockets it spans equals ``preferred_sockets`` (``socket_of`` maps nodes to sockets).
    Weights are non-negative; a node missing from ``weights`` weighs 0.
    """

    universe: int
    required: int = 0
    weights: tuple[tuple[int, int], ...] = ()
    threshold: int = 0
    preferred_size: int | None = None
    socket_of: tuple[tuple[int, int], ...] = ()
    preferred_sockets: int | None = None

    def __post_init__(self) -> None:
        for node, w in self.weights:
            if w < 0:
                raise ValueError(f"hint family weight of NUMA node {node} must be >= 0, got {w}")

    # -- queries -----------------------------------------------------------------
    def weight_map(self) -> dict[int, int]:
        return {n: w for n, w in self.weights if self.universe >> n & 1}

    def weight(self, mask: int) -> int:
        wm = dict(self.weights)
        return sum(wm.get(n, 0) for n in bits_of(mask))

    def is_empty(self) -> bool:
        if self.required & ~self.universe or not self.universe:
            return True
        return self.weight(self.universe) < self.threshold

    def contains(self, mask: int) -> bool:
        if not mask or mask & ~self.universe or self.required & ~mask:
            return False
        return self.weight(mask) >= self.threshold

    def sockets_spanned(self, mask: int) -> int:
        so = dict(self.socket_of)
        return len({so.get(n, -1) for n in bits_of(mask)})

    def is_preferred(self, mask: int) -> bool:
        if self.preferred_size is not None and mask.bit_count() == self.preferred_size:
            return True
        return self.preferred_sockets is not None and self.sockets_spanned(mask) == self.preferred_sockets

    def min_count(self) -> int:
        """Node count of the narrowest member (0 when the family is empty)."""
        if self.is_empty():
            return 0
        wm = self.weight_map()
        need = self.threshold - sum(wm.get(n, 0) for n in bits_of(self.required))
        size = self.required.bit_count()
        if need <= 0:
            return max(size, 1)  # masks are never empty: one universe node at least
        extra = sorted((wm.get(n, 0) for n in bits_of(self.universe & ~self.required)), reverse=True)
        for w in extra:
            need -= w
            size += 1
            if need <= 0:
                break
        return size

    def hints(self, max_nodes: int = LIST_MAX_NODES) -> list[TopologyHint]:
        """The full kubelet-ordered list. It visits 2^|universe| masks, so it refuses universes wider than
        ``max_nodes`` (ValueError) instead of running for ever: merge the family itself instead."""
        if self.universe.bit_count() > max_nodes:
            raise ValueError(f"a hint family over {self.universe.bit_count()} NUMA nodes is too wide to list "
                             f"(limit {max_nodes}); pass the family to merge_hints as it is")
        out: list[TopologyHint] = []
        for m in iterate_masks(bits_of(self.universe)):
            if self.contains(m):
                out.append(TopologyHint(frozenset(bits_of(m)), self.is_preferred(m)))
        return out

    def to_dict(self) -> dict[str, object]:
        """A JSON-friendly description (for decisions and reports on machines too large to list hints)."""
        out: dict[str, object] = {"family": {
            "nodes": bits_of(self.universe),
            "required": bits_of(self.required),
            "weights": {str(n): w for n, w in self.weights if w},
            "threshold": self.threshold,
            "preferredWidth": self.preferred_size,
        }}
        if self.preferred_sockets is not None:
            out["family"]["preferredSockets"] = self.preferred_sockets  # type: ignore[index]
        return out

    def __str__(self) -> str:
        parts = [f"every mask of NUMA {_nodes(self.universe)}"]
        if self.required:
            parts.append(f"holding {_nodes(self.required)}")
        if self.threshold > 0:
            parts.append(f"with weight >= {self.threshold}")
        pref = f"preferred at width {self.preferred_size}" if self.preferred_size is not None else "never preferred"
        if self.preferred_sockets is not None:
            pref += f" or spanning {self.preferred_sockets} socket(s)"
        return "{" + " ".join(parts) + "; " + pref + "}"

    # A family also reads like the list it stands for (listed on demand, so only for small universes):
    # code written for hint lists (indexing, len, iteration) keeps working on machines up to LIST_MAX_NODES.
    def __iter__(self) -> Iterator[TopologyHint]:
        return iter(self.hints())

    def __len__(self) -> int:
        return 0 if self.is_empty() else len(self.hints())

    def __bool__(self) -> bool:  # "has hints" without listing them
        return not self.is_empty()

    def __getitem__(self, index: int) -> TopologyHint:
        return self.hints()[index]


def _nodes(mask: int) -> str:
    return ",".join(str(n) for n in bits_of(mask)) or "none"


def cpu_hint_family(
    topology: Topology,
    available: CPUSet,
    reusable: CPUSet,
    request: int,
    align_by_socket: bool = False,
) -> HintFamily | None:
    """kubelet's static-policy CPU hints (generateCPUTopologyHints) as a family, without visiting 2^N masks.

    Masks range over the NUMA nodes that have CPUs. A mask is a hint iff it contains the NUMA node of every
    reusable CPU and its reusable + available CPUs number at least ``request``. ``preferred`` = the mask's
    width equals the narrowest width whose *capacity* could hold the request (with ``align_by_socket``
    also: it spans the minimal number of sockets). Returns None for a request of 0 (no preference).
    """
    if request <= 0:
        return None
    nodes = topology.cpu_numa_nodes
    universe = mask_of(nodes)
    required = mask_of({topology.cpu(c).numa for c in reusable})
    weights: list[tuple[int, int]] = []
    capacities: list[int] = []
    for n in nodes:
        in_node = topology.cpus_in_numa(n)
        weights.append((n, len(available & in_node) + len(reusable & in_node)))
        capacities.append(len(in_node))
    # minAffinitySize: narrowest width whose total CPUs (capacity) reach the request; starts at the count.
    min_affinity = len(nodes)
    total = 0
    for i, cap in enumerate(sorted(capacities, reverse=True), start=1):
        total += cap
        if total >= request:
            min_affinity = min(min_affinity, i)
            break
    socket_of: tuple[tuple[int, int], ...] = ()
    preferred_sockets: int | None = None
    if align_by_socket:
        per_socket = len(topology.cpu_numa_nodes) // topology.num_sockets if topology.num_sockets else 0
        if per_socket:
            preferred_sockets = (min_affinity + per_socket - 1) // per_socket
            socket_of = tuple((n, topology.cpu(topology.cpus_in_numa(n).min()).socket) for n in nodes)
    return HintFamily(
        universe=universe,
        required=required,
        weights=tuple(weights),
        threshold=request,
        preferred_size=min_affinity,
        socket_of=socket_of,
        preferred_sockets=preferred_sockets,
    )
