"""A running container's CPU resize (kubelet's in-place pod resize, KEP-1287), decided transactionally.

``plan_resize`` compares what the state holds for one container with what the resized pod asks for it and decides
the new assignment under the node's topology-manager policy, scope and static-policy options:

- **grow** (more CPUs of its own): every CPU it has is kept; the CPU hints are those of an admission that must
  include its CPUs (scope ``pod``: the pod's CPUs) and may add free ones, merged by the topology-manager policy, so
  ``single-numa-node`` refuses a growth that cannot stay in one NUMA node, ``restricted`` a non-preferred result,
  and ``prefer-closest-numa-nodes`` picks the closest nodes. The new CPUs are taken by the static policy's
  take-by-topology rules, in this order: free threads of cores it already holds partly (not with
  ``distribute-cpus-across-cores``), its own NUMA node(s), the merged affinity, anywhere (as kubelet allocates
  outside the affinity when it must). ``full-pcpus-only`` takes whole free cores only (kubelet's SMTAlignmentError
  wording when the size or the free cores do not allow).
- **shrink**: the CPUs added by earlier growths go first, then (unlike KEP-5554, which refuses it) the CPUs it was
  admitted with (its *baseline*). Within each group the least aligned go first: CPUs off the baseline's NUMA
  nodes, on the node where it holds fewest, on cores it holds partly, highest id first; ``full-pcpus-only``
  gives back whole cores. The remaining set becomes the baseline when it falls below it.
- **fractional <-> integer** (a Guaranteed container's CPU becoming an integer, or no longer one): it moves from
  the shared pool to CPUs of its own (decided like a growth from nothing) or gives them all back.
- Crane's modes (``qos.gocrane.io/cpu-manager``): ``share`` containers get and give back CPUs as above, which stay
  in the shared pool; ``none`` containers never have CPUs of their own (a resize changes no set).

A refusal carries kubelet's reason (``TopologyAffinityError``, ``SMTAlignmentError``, ``UnexpectedAdmissionError``)
and a message naming the policy and the numbers, and changes nothing. Memory nodes follow the CPUs
(``memory_nodes``). The baseline is kept in ``CPUState.baselines`` (persisted in the checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .cpuset import CPUSet
from .errors import AllocationError, SMTAlignmentError
from .hints import TopologyHint
from .mode_change import with_pod_mode
from .modes import SHARED_POOL, ContainerMode
from .pod import PodInfo, container_mode, guaranteed_cpus
from .state import CPUState
from .topology import Topology
from .topology_manager import TOPOLOGY_AFFINITY_MESSAGE, TOPOLOGY_AFFINITY_REASON, NonePolicy

if TYPE_CHECKING:
    from .static_policy import StaticPolicy
    from .topology_manager import TopologyManager

__all__ = ["ResizeOutcome", "memory_nodes", "plan_resize"]


def memory_nodes(topology: Topology, cpus: CPUSet) -> CPUSet:
    """The NUMA nodes a container's memory is bound to: those of its CPUs (the one place Memory Manager
    accounting will replace)."""
    return topology.numa_of(cpus)


@dataclass(frozen=True)
class ResizeOutcome:
    """One container's resize, admitted or refused. ``cpus_*`` are its own CPUs, or the shared pool when it has
    none; ``pool_*`` the shared pool (the proxy narrows shared containers to ``pool_after`` before widening a
    growing container, and widens them after narrowing a shrinking one)."""

    pod_uid: str
    container: str
    admitted: bool
    reason: str | None  # kubelet's reason when refused, None when admitted
    message: str
    mode_before: ContainerMode
    mode_after: ContainerMode
    cpus_before: CPUSet
    cpus_after: CPUSet
    mems_before: CPUSet
    mems_after: CPUSet
    pool_before: CPUSet
    pool_after: CPUSet

    @property
    def changed(self) -> bool:
        """Whether the state changed: the container's mode or CPUs, or the shared pool."""
        return self.admitted and (
            self.mode_before != self.mode_after
            or self.cpus_before != self.cpus_after
            or self.pool_before != self.pool_after
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "podUID": self.pod_uid,
            "container": self.container,
            "admitted": self.admitted,
            "changed": self.changed,
            "reason": self.reason,
            "message": self.message,
            "modeBefore": self.mode_before,
            "modeAfter": self.mode_after,
            "cpusBefore": str(self.cpus_before),
            "cpusAfter": str(self.cpus_after),
            "memsBefore": str(self.mems_before),
            "memsAfter": str(self.mems_after),
            "poolBefore": str(self.pool_before),
            "poolAfter": str(self.pool_after),
        }


class _Refused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def plan_resize(
    state: CPUState,
    policy: StaticPolicy,
    topology_manager: TopologyManager,
    pod: PodInfo,
    name: str,
) -> tuple[ResizeOutcome, CPUState | None]:
    """Decide resizing container ``name`` of ``pod`` (the pod after the resize: same uid, the new resources) from
    what ``state`` holds for it. Returns the outcome and, when admitted, the new state (``state`` itself is never
    changed). Raises PodSpecError when the pod has no such container."""
    info = with_pod_mode(pod, state)
    c = info.container(name)
    uid = info.uid
    held = state.get(uid, name)
    before_mode: ContainerMode = state.mode(uid, name) if held is not None else SHARED_POOL  # type: ignore[assignment]
    n0 = 0 if held is None else len(held)

    def outcome(after: CPUState, admitted: bool, reason: str | None, message: str) -> ResizeOutcome:
        own_after = after.get(uid, name)
        after_mode: ContainerMode = (after.mode(uid, name) if own_after is not None  # type: ignore[assignment]
                                     else SHARED_POOL)
        pool_before, pool_after = state.shared_pool(), after.shared_pool()
        cpus_before = held if held is not None else pool_before
        cpus_after = own_after if own_after is not None else pool_after
        topo = policy.topology
        return ResizeOutcome(uid, name, admitted, reason, message, before_mode, after_mode, cpus_before, cpus_after,
                             memory_nodes(topo, cpus_before), memory_nodes(topo, cpus_after), pool_before, pool_after)

    if info.bypass:
        return outcome(state, True, None,
                       f"pod {info.ref} is annotated numapin.io/bypass=true: numapin leaves its CPUs alone"), state
    n = guaranteed_cpus(info, c)
    work = state.copy()
    work.reuse_pod, work.reuse = None, CPUSet()  # a resize is no step of an admission
    try:
        if n and policy.options.full_pcpus_only and n % (policy.cpus_per_core or 1):
            raise SMTAlignmentError(n, policy.cpus_per_core or 1)
        if n == 0:
            if held is not None:
                policy.remove(work, uid, name)
        elif n > n0:
            _grow(work, policy, topology_manager, info, name, n)
        elif n < n0:
            _shrink(work, policy, uid, name, n)
        if n and work.mode(uid, name) != container_mode(info, c):
            work.set(uid, name, work.get(uid, name) or CPUSet(), container_mode(info, c))
    except (_Refused, AllocationError) as e:
        reason, why = _why(e)
        return outcome(state, False, reason, _refusal(why, policy, topology_manager, state, info, name, n0, n)), None
    result = outcome(work, True, None, "")
    message = (f"container {name!r} of pod {info.ref}: {_size(n0, result.mode_before)} -> "
               f"{_size(n, result.mode_after)}: CPUs {_set(result.cpus_before)} -> {_set(result.cpus_after)}, "
               f"NUMA node(s) {_set(result.mems_before)} -> {_set(result.mems_after)}")
    if not result.changed:
        message += " (nothing to change)"
    return replace(result, message=message), work


# -- grow -------------------------------------------------------------------------------------------------------
def _grow(work: CPUState, policy: StaticPolicy, tm: TopologyManager, pod: PodInfo, name: str, n: int) -> None:
    uid = pod.uid
    held = work.get(uid, name) or CPUSet()
    base = work.baseline(uid, name)
    k = n - len(held)
    per_core = policy.cpus_per_core or 1
    free = policy.available_cpus(work)
    if policy.options.full_pcpus_only:
        free = _whole_cores(policy.topology, policy.available_physical_cpus(work))
        if k > len(free):
            raise SMTAlignmentError(n, per_core, len(free) + len(held), cause="not enough free physical CPUs")
    affinity: TopologyHint | None = None
    if not isinstance(tm.policy, NonePolicy):
        if tm.scope.name == "pod":  # the pod's set grows: its affinity must keep every CPU of the pod
            keep = CPUSet.from_mask(_union(work.assignments.get(uid, {}).values()))
            request = len(keep) + k
        else:
            keep, request = held, n
        hint, admit = tm.policy.merge([policy.cpu_hints(free, keep, request), None])
        if not admit:
            raise _Refused(TOPOLOGY_AFFINITY_REASON, TOPOLOGY_AFFINITY_MESSAGE)
        affinity = hint
    taken = _take_growth(policy, free, held, k, affinity)
    mode = work.mode(uid, name) if name in work.assignments.get(uid, {}) else container_mode(pod, pod.container(name))
    work.default_cpuset = work.default_cpuset - taken
    work.set(uid, name, held | taken, mode)
    work.set_baseline(uid, name, base if held else None)


def _take_growth(policy: StaticPolicy, free: CPUSet, held: CPUSet, k: int, affinity: TopologyHint | None) -> CPUSet:
    """``k`` CPUs of ``free`` for a container holding ``held``: the free threads of its cores, its NUMA node(s),
    the affinity, then anywhere, each step by the policy's take-by-topology rules (whole cores under
    ``full-pcpus-only``: ``free`` then holds whole cores only)."""
    topo = policy.topology
    whole = policy.options.full_pcpus_only
    per_core = policy.cpus_per_core or 1
    steps = []
    if not whole and not policy.options.distribute_cpus_across_cores:  # that option spreads over cores on purpose
        steps.append(topo.core_siblings(held))
    if held:
        steps.append(topo.cpus_in_numas(topo.numa_of(held)))
    if affinity is not None and affinity.numa is not None:
        steps.append(policy.aligned_cpus(affinity.numa))
    steps.append(topo.all_cpus)
    taken = CPUSet()
    for area in steps:
        avail = (area & free) - taken
        want = min(k - len(taken), len(avail))
        if whole:
            want -= want % per_core
        if want > 0:
            taken = taken | policy.take(avail, want)
        if len(taken) >= k:
            return taken
    raise AllocationError(f"not enough cpus available to satisfy request: requested={k} more, available={len(free)}")


def _whole_cores(topo: Topology, cpus: CPUSet) -> CPUSet:
    """The CPUs of ``cpus`` whose every core sibling is in ``cpus`` too."""
    m = 0
    for core in topo.cores:
        threads = topo.cpus_in_core(core)
        if threads and threads <= cpus:
            m |= threads.mask
    return CPUSet.from_mask(m)


def _union(sets: Any) -> int:
    m = 0
    for s in sets:
        m |= s.mask
    return m


# -- shrink -----------------------------------------------------------------------------------------------------
def _shrink(work: CPUState, policy: StaticPolicy, uid: str, name: str, n: int) -> None:
    held = work.get(uid, name) or CPUSet()
    base = work.baseline(uid, name) or held
    k = len(held) - n
    topo = policy.topology
    unit = (policy.cpus_per_core or 1) if policy.options.full_pcpus_only else 1
    base_nodes = topo.numa_of(base)
    released = _pick_release(topo, held - base, held, base_nodes, k, unit)
    if len(released) < k:
        released = released | _pick_release(topo, base, held - released, base_nodes, k - len(released), unit)
    if len(released) != k:  # cannot happen: held has k CPUs more than n, in whole cores under full-pcpus-only
        raise AllocationError(f"cannot give back {k} of CPUs {held}")
    kept = held - released
    siblings = _union(cpus for other, cpus in work.assignments.get(uid, {}).items() if other != name)
    work.default_cpuset = work.default_cpuset | (released - CPUSet.from_mask(siblings))
    work.set(uid, name, kept, work.mode(uid, name))
    work.set_baseline(uid, name, base & kept)


def _pick_release(topo: Topology, candidates: CPUSet, held: CPUSet, base_nodes: CPUSet, k: int,
                  unit: int) -> CPUSet:
    """Up to ``k`` CPUs of ``candidates`` to give back, one core (``unit`` > 1: whole cores only) or one CPU at a
    time, the least aligned first: off the baseline's NUMA nodes, on the node where the container holds fewest, on
    a core it holds partly, highest id."""
    if unit > 1:
        groups = [t.mask for t in (topo.cpus_in_core(core) for core in topo.cores) if t and t <= candidates]
    else:
        groups = [1 << c for c in candidates]
    node_of = {g: topo.cpu(g.bit_length() - 1).numa for g in groups}
    core_of = {g: topo.core_siblings(CPUSet.from_mask(g)).mask for g in groups}
    on_node: dict[int, int] = {}
    for c in held:
        n = topo.cpu(c).numa
        on_node[n] = on_node.get(n, 0) + 1
    remaining = held.mask
    released = 0
    left = set(groups)
    while released.bit_count() + unit <= k and left:
        def rank(g: int, remaining: int = remaining) -> tuple[bool, int, bool, int]:
            whole = core_of[g] & remaining == core_of[g]
            return (node_of[g] in base_nodes, on_node[node_of[g]], whole, -g.bit_length())

        pick = min(left, key=rank)
        left.discard(pick)
        released |= pick
        remaining &= ~pick
        on_node[node_of[pick]] -= pick.bit_count()
    return CPUSet.from_mask(released)


# -- messages ---------------------------------------------------------------------------------------------------
def _size(n: int, mode: str) -> str:
    return f"{n} CPU(s) of its own ({mode})" if n else "the shared pool"


def _set(cpus: CPUSet) -> str:
    return str(cpus) or "none"


def _why(e: _Refused | AllocationError) -> tuple[str, str]:
    """kubelet's reason and message of a refusal (its admission's wording for allocation errors)."""
    if isinstance(e, _Refused):
        return e.reason, e.message
    if isinstance(e, SMTAlignmentError):
        return e.reason, str(e)
    return e.reason, f"Allocate failed due to {e}, which is unexpected"


def _refusal(message: str, policy: StaticPolicy, tm: TopologyManager, state: CPUState, pod: PodInfo, name: str,
             n0: int, n: int) -> str:
    topo = policy.topology
    free = policy.available_cpus(state)
    per_numa = ", ".join(f"{node}: {len(free & topo.cpus_in_numa(node))}" for node in topo.numa_nodes)
    held = state.get(pod.uid, name)
    where = f"its CPUs {held} on NUMA node(s) {memory_nodes(topo, held)}" if held else "it runs on the shared pool"
    options = " with cpuManagerPolicyOptions full-pcpus-only" if policy.options.full_pcpus_only else ""
    return (f"{message} (numapin: resize of container {name!r} of pod {pod.ref} from {n0} to {n} exclusive CPU(s) "
            f"refused by topology manager policy {tm.policy.name}, scope {tm.scope.name}{options}; {where}; free "
            f"CPUs per NUMA node {{{per_numa}}}; the container keeps running as it was)")
