"""kubelet's Memory Manager static policy (policy_static.go): machine state, allocation, release, hints.

The policy is stateless apart from its configuration; every call gets the ``MemoryState`` to read or change.

- ``default_machine_state``: per NUMA node and resource, kubelet's starting table: huge pages: total = pages x size,
  allocatable = free = total - reserved; memory: total = MemTotal, allocatable = free = total - reserved - every
  huge-page total of the node.
- ``start``: kubelet's validateState (CheckpointError with kubelet's words when a loaded state does not add up).
- ``allocate`` (idempotent): the merged affinity's mask, or without one the best calculated hint; a mask whose
  free bytes do not hold the request is extended to the best calculated hint containing it (preferred first, then
  the narrowest); a multi-node mask breaking the group rule is refused. Errors are AllocationError with kubelet's
  texts (the topology manager turns them into UnexpectedAdmissionError "Allocate failed due to ...").
  One block per resource; bytes are taken node by node in ascending order; every node of the mask counts one
  assignment per block and records the mask as its group. A regular init container's bytes are reused by the
  containers after it on the same mask (the init container's blocks shrink by what was reused).
- ``remove``: give each block back node by node; a node whose assignments reach zero leaves its group.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..bitmask import bits_of, is_narrower_than, masks_of_size
from ..errors import AllocationError, CheckpointError, ConfigError
from ..hints import TopologyHint
from ..merge import ProviderHints
from ..pod import ContainerInfo, PodInfo
from .cover import narrowest_cover
from .hints import LIST_MAX_NODES, Reusable, calculate_hints, feasible, min_width, regenerate_hints
from .machine import MachineMemory
from .requests import Requests, container_requests, pod_requests
from .reserved import NO_SYSTEM_RESERVED
from .resources import MEMORY, hugepage_resource
from .state import Block, MemoryState, MemoryTable, NodeState

__all__ = [
    "DEFAULT_HINT_FAILED",
    "EXTENDED_NOT_PREFERRED",
    "EXTEND_FAILED",
    "VIOLATES_GROUPS",
    "MemoryPolicy",
    "fill",
    "release",
]

DEFAULT_HINT_FAILED = ("[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory "
                       "is available")
EXTEND_FAILED = "[memorymanager] failed to find NUMA nodes to extend the current topology hint"
EXTENDED_NOT_PREFERRED = "[memorymanager] failed to find the extended preferred hint"
DEFAULT_NOT_PREFERRED = "[memorymanager] failed to find the default preferred hint"
VIOLATES_GROUPS = "[memorymanager] preferred hint violates NUMA node allocation"
STATE_DIFFERS = "[memorymanager] the expected machine state is different from the real one"


def fill(state: MemoryState, bits: tuple[int, ...], resource: str, size: int) -> None:
    """Count one assignment on every node of ``bits``, group them, and reserve ``size`` bytes node by node."""
    for n in bits:
        ns = state.machine[n]
        ns.assignments += 1
        ns.cells = bits
        if size == 0:
            continue
        t = ns.memory.get(resource)
        if t is None or t.free <= 0:
            continue
        take = min(t.free, size)
        t.reserved += take
        t.free -= take
        size -= take


def release(state: MemoryState, block: Block) -> None:
    """Give one block back node by node (kubelet's RemoveContainer loop)."""
    size = block.size
    for n in block.numa:
        ns = state.machine[n]
        ns.assignments -= 1
        if ns.assignments == 0:
            ns.cells = (n,)
        if size == 0:
            continue
        t = ns.memory.get(block.resource)
        if t is None or t.reserved == 0:
            continue
        give = min(t.reserved, size)
        t.free += give
        t.reserved -= give
        size -= give


class MemoryPolicy:
    """The static policy on one machine. ``system_reserved[node][resource]``: bytes reserved for the system
    (allocator.memory.reserved.system_reserved_memory). ConfigError when no memory is reserved at all."""

    name = "Static"

    def __init__(self, machine: MachineMemory, system_reserved: Mapping[int, Mapping[str, int]], *,
                 require_reserved: bool = True) -> None:
        """``require_reserved=False``: accept a machine with nothing reserved (a node rebuilt from a published
        NodeResourceTopology, whose exporter may not subtract kubelet's reservation)."""
        if require_reserved and sum(per.get(MEMORY, 0) for per in system_reserved.values()) <= 0:
            raise ConfigError(NO_SYSTEM_RESERVED)
        self.machine = machine
        self.system_reserved = {n: dict(v) for n, v in system_reserved.items()}

    # -- machine state ---------------------------------------------------------------------------------
    def _reserved(self, node: int, resource: str) -> int:
        return self.system_reserved.get(node, {}).get(resource, 0)

    def default_machine_state(self) -> dict[int, NodeState]:
        out: dict[int, NodeState] = {}
        for node in self.machine.nodes:
            tables: dict[str, MemoryTable] = {}
            huge = 0
            for size, count in node.hugepages:
                name = hugepage_resource(size)
                total = size * count
                reserved = self._reserved(node.node, name)
                tables[name] = MemoryTable(total, reserved, total - reserved, 0, total - reserved)
                huge += total
            reserved = self._reserved(node.node, MEMORY)
            alloc = node.memory - reserved - huge
            tables[MEMORY] = MemoryTable(node.memory, reserved, alloc, 0, alloc)
            out[node.node] = NodeState(0, tables, (node.node,))
        for n, ns in out.items():
            for r, t in ns.memory.items():
                if t.allocatable < 0:
                    raise ConfigError(f"NUMA node {n}: {t.system_reserved} bytes of {r} are reserved for the system, "
                                      f"more than the node has for it ({t.allocatable + t.system_reserved} bytes)")
        return out

    def expected_machine_state(self, state: MemoryState) -> dict[int, NodeState]:
        """The machine state the assignments of ``state`` add up to (kubelet's validateState)."""
        expected = self.default_machine_state()
        for uid, name, b in state.iter_blocks():
            for n in b.numa:
                if n not in expected:
                    raise CheckpointError(f"[memorymanager] (pod: {uid}, container: {name}) the memory assignment "
                                          f"uses the NUMA that does not exist")
                if b.resource not in expected[n].memory:
                    raise CheckpointError(f"[memorymanager] (pod: {uid}, container: {name}) the memory assignment "
                                          f"uses memory resource that does not exist")
            fill(MemoryState(machine=expected), b.numa, b.resource, b.size)
        return expected

    def start(self, state: MemoryState) -> None:
        """Initialise an empty state, or check a loaded one (CheckpointError, kubelet's message and the first
        difference)."""
        if not state.machine:
            if state.assignments:
                raise CheckpointError("[memorymanager] machine state can not be empty when it has memory assignments")
            state.machine = self.default_machine_state()
            return
        expected = self.expected_machine_state(state)
        why = _difference(state.machine, expected)
        if why:
            raise CheckpointError(f"{STATE_DIFFERS} ({why}); drain the node and move memory_manager_state away")

    # -- requests -------------------------------------------------------------------------------------
    @staticmethod
    def requested(pod: PodInfo, c: ContainerInfo) -> Requests:
        return container_requests(pod, c)

    @staticmethod
    def _reusable(state: MemoryState, pod: PodInfo) -> Reusable:
        return state.reuse if state.reuse_pod == pod.uid else {}

    # -- hints ----------------------------------------------------------------------------------------
    def topology_hints(self, state: MemoryState, pod: PodInfo, container_name: str) -> ProviderHints:
        req = self.requested(pod, pod.container(container_name))
        if not req:
            return None
        blocks = state.blocks(pod.uid, container_name)
        if blocks is not None:
            return regenerate_hints(blocks, req)
        return calculate_hints(state, req, self._reusable(state, pod))

    def pod_topology_hints(self, state: MemoryState, pod: PodInfo) -> ProviderHints:
        req = pod_requests(pod)
        if not req:
            return None
        for c in pod.containers:
            blocks = state.blocks(pod.uid, c.name)
            if blocks is not None:
                return regenerate_hints(blocks, req)
        return calculate_hints(state, req, {})

    # -- allocation -----------------------------------------------------------------------------------
    def best_hint(self, state: MemoryState, pod: PodInfo, req: Requests, within: int = 0) -> TopologyHint | None:
        """The best calculated hint whose mask contains ``within`` (kubelet's findBestHint over calculateHints,
        filtered as extendTopologyManagerHint filters): preferred first, then the narrowest, then the numerically
        smallest. Preferred means as narrow as the narrowest mask by allocatable, so the narrowest feasible mask is
        the answer: found by walking widths upwards on small machines, by ``best_hint_large`` on large ones."""
        nodes = sorted(state.machine)
        if len(nodes) > LIST_MAX_NODES:
            return self.best_hint_large(state, pod, req, within)
        width = min_width(state, req)
        reusable = self._reusable(state, pod)
        start = max(within.bit_count(), 1)
        rest = [n for n in nodes if not within >> n & 1]
        for size in range(start, len(nodes) + 1):
            best = 0
            for extra in masks_of_size(rest, size - within.bit_count()):
                m = within | extra
                bits = bits_of(m)
                if any(sum(state.machine[n].table(r).allocatable for n in bits) < q for r, q in req.items()):
                    continue
                if feasible(state, bits, req, reusable) and (not best or is_narrower_than(m, best)):
                    best = m
            if best:
                return TopologyHint(frozenset(bits_of(best)), size == width)
        return None

    def best_hint_large(self, state: MemoryState, pod: PodInfo, req: Requests, within: int = 0
                        ) -> TopologyHint | None:
        """``best_hint`` without visiting 2^N masks. The group rules leave three kinds of feasible masks: one node
        outside every group, an existing group as a whole, or nodes holding no assignment at all; the narrowest of
        each kind is found directly (the last by allocator.memory.cover), and the narrowest of the three wins.
        Reusable init-container memory counts for single nodes and groups only."""
        nodes = sorted(state.machine)
        reusable = self._reusable(state, pod)
        wbits = bits_of(within)
        best = 0

        def fits_allocatable(bits: list[int]) -> bool:
            return all(sum(state.machine[n].table(r).allocatable for n in bits) >= q for r, q in req.items())

        if len(wbits) <= 1:
            for n in wbits or nodes:
                if fits_allocatable([n]) and feasible(state, [n], req, reusable):
                    best = 1 << n
                    break
        if not best:
            groups = {tuple(sorted(ns.cells)) for ns in state.machine.values()
                      if ns.assignments > 0 and len(ns.cells) > 1}
            for g in sorted(groups):
                gm = 0
                for n in g:
                    gm |= 1 << n
                if within & ~gm or not fits_allocatable(list(g)) or not feasible(state, list(g), req, reusable):
                    continue
                if not best or is_narrower_than(gm, best):
                    best = gm
            unused = [n for n in nodes if state.machine[n].assignments == 0]
            if set(wbits) <= set(unused):
                amounts = {r: {n: state.machine[n].table(r).free for n in unused} for r in req}
                found = narrowest_cover(unused, wbits, amounts, req, min_size=2)
                if found and (not best or is_narrower_than(found, best)):
                    best = found
        if not best:
            return None
        return TopologyHint(frozenset(bits_of(best)), best.bit_count() == min_width(state, req))

    def allocate(self, state: MemoryState, pod: PodInfo, container_name: str,
                 affinity: TopologyHint | None = None) -> tuple[Block, ...] | None:
        """kubelet's Allocate (module doc); the container's blocks, None when it is not managed."""
        c = pod.container(container_name)
        req = self.requested(pod, c)
        if not req:
            return None
        held = state.blocks(pod.uid, c.name)
        if held is not None:
            self._update_reuse(state, pod, c, held)
            return held
        preferred = affinity.preferred if affinity is not None else False
        mask = affinity.mask if affinity is not None and affinity.numa is not None else 0
        hint = TopologyHint(frozenset(bits_of(mask)), preferred)
        if not mask:
            default = self.best_hint(state, pod, req)
            if default is None:
                raise AllocationError(DEFAULT_HINT_FAILED)
            if not default.preferred and preferred:
                raise AllocationError(DEFAULT_NOT_PREFERRED)
            hint = default
        if not self.fits(state, hint.mask, req):
            extended = self.best_hint(state, pod, req, within=hint.mask)
            if extended is None:
                raise AllocationError(EXTEND_FAILED)
            if not extended.preferred and hint.preferred:
                raise AllocationError(EXTENDED_NOT_PREFERRED)
            hint = extended
        bits = tuple(sorted(hint.numa or ()))
        if violates_groups(state, list(bits)):
            raise AllocationError(VIOLATES_GROUPS)
        reusable = self._reusable(state, pod).get(hint.mask, {})
        blocks = tuple(Block(bits, r, q) for r, q in req.items())
        for b in blocks:
            fill(state, bits, b.resource, max(b.size - reusable.get(b.resource, 0), 0))
        self._update_reuse(state, pod, c, blocks)
        state.set_blocks(pod.uid, c.name, blocks)
        self._shrink_init_blocks(state, pod, c, blocks)
        return blocks

    @staticmethod
    def fits(state: MemoryState, mask: int, req: Requests) -> bool:
        bits = bits_of(mask)
        return all(sum(state.machine[n].table(r).free for n in bits) >= q for r, q in req.items())

    def remove(self, state: MemoryState, pod_uid: str, container_name: str) -> tuple[Block, ...]:
        """kubelet's RemoveContainer; returns the blocks given back."""
        blocks = state.blocks(pod_uid, container_name)
        if blocks is None:
            return ()
        state.delete(pod_uid, container_name)
        for b in blocks:
            release(state, b)
        return blocks

    # -- init-container reuse -------------------------------------------------------------------------
    @staticmethod
    def _update_reuse(state: MemoryState, pod: PodInfo, c: ContainerInfo, blocks: tuple[Block, ...]) -> None:
        if state.reuse_pod != pod.uid:
            state.reuse_pod = pod.uid
            state.reuse = {}
        if c.role == "init":
            for b in blocks:
                per = state.reuse.setdefault(b.mask, {})
                per[b.resource] = max(per.get(b.resource, 0), b.size)
            return
        for b in blocks:
            per = state.reuse.get(b.mask) or {}
            if per.get(b.resource):
                per[b.resource] = max(per[b.resource] - b.size, 0)

    @staticmethod
    def _shrink_init_blocks(state: MemoryState, pod: PodInfo, c: ContainerInfo, blocks: tuple[Block, ...]) -> None:
        for block in blocks:
            size = block.size
            for init in pod.init_containers:
                if init.name == c.name or size == 0:
                    break
                if init.role == "sidecar":
                    continue
                held = state.blocks(pod.uid, init.name)
                if not held:
                    continue
                new: list[Block] = []
                for ib in held:
                    if ib.size and ib.resource == block.resource and ib.numa == block.numa:
                        used = min(ib.size, size)
                        size -= used
                        ib = Block(ib.numa, ib.resource, ib.size - used)
                    new.append(ib)
                state.set_blocks(pod.uid, init.name, tuple(new))


def violates_groups(state: MemoryState, bits: list[int]) -> bool:
    """kubelet's isAffinityViolatingNUMAAllocations: a multi-node mask using a node allocated alone or grouped
    otherwise."""
    if len(bits) <= 1:
        return False
    for n in bits:
        ns = state.machine[n]
        if ns.assignments and (len(ns.cells) == 1 or sorted(ns.cells) != bits):
            return True
    return False


def _difference(actual: Mapping[int, NodeState], expected: Mapping[int, NodeState]) -> str:
    """The first difference kubelet's areMachineStatesEqual would find ("" when equal)."""
    if set(actual) != set(expected):
        return f"NUMA nodes {sorted(actual)} in the state, {sorted(expected)} on the machine"
    for n in sorted(actual):
        a, e = actual[n], expected[n]
        if a.assignments != e.assignments:
            return f"node {n}: {a.assignments} assignments in the state, {e.assignments} from the entries"
        if sorted(a.cells) != sorted(e.cells):
            return f"node {n}: group {sorted(a.cells)} in the state, {sorted(e.cells)} from the entries"
        if set(a.memory) != set(e.memory):
            return f"node {n}: resources {sorted(a.memory)} in the state, {sorted(e.memory)} on the machine"
        for r in sorted(a.memory):
            ta, te = a.memory[r], e.memory[r]
            for field in ("total", "system_reserved", "allocatable"):
                if getattr(ta, field) != getattr(te, field):
                    return f"node {n} {r}: {field} {getattr(ta, field)} in the state, {getattr(te, field)} expected"
            group = a.cells or (n,)
            for field in ("free", "reserved"):
                sa = sum(getattr(actual[g].memory[r], field) for g in group if g in actual and r in actual[g].memory)
                se = sum(getattr(expected[g].memory[r], field) for g in group
                         if g in expected and r in expected[g].memory)
                if sa != se:
                    return f"node {n} {r}: {field} {sa} in the state, {se} from the entries (group {list(group)})"
    return ""

