"""The node facade: kubelet's pod admission on one node (CPU manager static policy + topology manager).

This is what the CRI proxy, the webhook and ``numapin plan`` call. ``NodeAllocator.admit_pod`` does what kubelet's
topology-manager admit handler does for a pod:

- for every container (scope ``container``: init containers then app containers, in spec order), or once for
  the whole pod (scope ``pod``), gather the hints of every provider -- CPUs (the static policy), memory and each
  huge-page size (kubelet's Memory Manager, allocator.memory, with ``memoryManagerPolicy: Static``; with ``None``
  memory follows the CPUs and never narrows the choice) and the devices already bound to the container -- and
  merge them under the topology-manager policy;
- a container whose merged hint is not admissible rejects the whole pod with ``TopologyAffinityError``;
- otherwise every provider allocates with that hint; an allocation error rejects the pod with the error's
  reason (``SMTAlignmentError``) or ``UnexpectedAdmissionError``.

Admission is transactional: it works on a copy of the state and commits only an admitted pod, so a rejected
pod leaves no trace. Containers get numapin's modes: ``exclusive`` (own CPUs), ``share`` (own CPUs that stay in
the shared pool, Crane's mode) or ``shared`` (the shared pool).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .compact_hints import HintFamily
from .cpuset import CPUSet
from .device_hints import DeviceHintProvider
from .errors import AdmitReason, ConfigError
from .hints import TopologyHint
from .memory import MemoryPolicy, MemoryProvider, MemoryState
from .memory.config import MemoryConfig, build_memory_policy
from .memory.report import memory_detail
from .memory.resize import MemoryResize, plan_memory_resize
from .memory_hints import MemoryHintProvider
from .mode_change import ModeChange, plan_mode_change, with_pod_mode
from .modes import SHARED_POOL, ContainerMode
from .pod import PodInfo, container_mode, guaranteed_cpus, pod_guaranteed_cpus
from .policy_options import StaticPolicyOptions
from .resize import ResizeOutcome, memory_nodes, plan_resize
from .state import CPUState
from .static_policy import StaticPolicy, require_reserved
from .topology import Topology
from .topology_manager import POLICIES, SCOPES, HintProvider, NonePolicy, TopologyManager

__all__ = [
    "TM_POLICIES",
    "TM_SCOPES",
    "ContainerDecision",
    "NodeAllocator",
    "NodeConfig",
    "NodeParts",
    "PodDecision",
    "build_node",
]

TM_POLICIES = POLICIES
TM_SCOPES = SCOPES

POD_BUBBLE_UNSUPPORTED = (
    "numapin: pod {pod} sets pod-level resources (spec.resources) on a node with kubelet's PodLevelResourceManagers "
    "gate and topologyManagerScope pod, where kubelet 1.36 gives the pod one CPU and memory \"bubble\" shared out "
    "among its containers: numapin does not model that yet and does not admit the pod (use topologyManagerScope "
    "container, or leave the gate off)")

Mode = ContainerMode  # exclusive | share (own CPUs) | shared (the pool): allocator.modes
Reason = AdmitReason
# {container: {device or resource: its NUMA nodes}} (a list of node sets for several devices of one resource)
DeviceMap = Mapping[str, Mapping[str, Iterable[int] | Iterable[Iterable[int]]]]



@dataclass(frozen=True)
class NodeConfig:
    """kubelet's CPU- and topology-manager configuration of one node (field names as in KubeletConfiguration).

    ``require_reserved_cpus``: refuse a node without reserved CPUs, as kubelet's container manager does at
    start-up (``static_policy.require_reserved``): set where a node is configured (the proxy's node, ``numapin
    plan``'s scenario). Off by default, as for kubelet's policy itself: the webhook judges NodeResourceTopology
    documents of nodes it does not configure, some with no reserved CPU."""

    topology: Topology
    reserved_cpus: CPUSet | None = None
    num_reserved_cpus: int = 0
    cpu_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    require_reserved_cpus: bool = False
    memory: MemoryConfig | None = None  # memoryManagerPolicy, the machine's memory, reservedMemory (allocator.memory)
    # kubelet's --feature-gates PodLevelResourceManagers (1.36 alpha): pods with spec.resources get CPUs and memory
    # of their own for their containers Guaranteed on their own (allocator.pod); off, none of them does
    pod_level_resource_managers: bool = False


@dataclass(frozen=True)
class NodeParts:
    """A node's parts, built and checked once (``build_node``) and handed to one ``NodeAllocator``."""

    config: NodeConfig
    static_policy: StaticPolicy
    topology_manager: TopologyManager
    memory_policy: MemoryPolicy | None = None


def build_node(config: NodeConfig) -> NodeParts:
    """The one construction path of a node: check the configuration against the machine as kubelet does at
    start-up and build the static policy and the topology manager. ConfigError names the kubelet setting."""
    if config.topology_manager_policy not in POLICIES:
        raise ConfigError(
            f"topologyManagerPolicy: unknown policy {config.topology_manager_policy!r} "
            f"(allowed: {', '.join(POLICIES)})"
        )
    if config.topology_manager_scope not in SCOPES:
        raise ConfigError(
            f"topologyManagerScope: unknown scope {config.topology_manager_scope!r} "
            f"(allowed: {', '.join(SCOPES)})"
        )
    topology = config.topology
    try:  # options and machine checks: the topology manager package's own rules
        manager = TopologyManager.from_config(
            numa_nodes=topology.numa_nodes,
            policy=config.topology_manager_policy,
            scope=config.topology_manager_scope,
            options=dict(config.topology_manager_policy_options),
            distances=topology.numa_distances,
        )
    except ConfigError as e:
        raise ConfigError(f"topologyManagerPolicyOptions: {e}") from None
    try:
        options = StaticPolicyOptions.parse(config.cpu_manager_policy_options)
        options.validate(topology, config.topology_manager_policy)
    except ConfigError as e:
        raise ConfigError(f"cpuManagerPolicyOptions: {e}") from None
    reserved_field = "reservedCPUs" if config.reserved_cpus is not None else "numReservedCPUs"
    try:  # the reserved-CPU checks are the static policy's (kubelet's wording)
        if config.require_reserved_cpus:
            require_reserved(config.reserved_cpus, config.num_reserved_cpus)
        policy = StaticPolicy(
            topology,
            reserved_cpus=config.reserved_cpus,
            num_reserved_cpus=config.num_reserved_cpus,
            options=options,
            topology_manager_policy=config.topology_manager_policy,
        )
    except ConfigError as e:
        raise ConfigError(f"{reserved_field}: {e}") from None
    memory_policy = build_memory_policy(config.memory, topology.numa_nodes)
    return NodeParts(config=config, static_policy=policy, topology_manager=manager, memory_policy=memory_policy)


def hints_to_json(hints: Any, limit: int | None = None) -> Any:
    """One resource's hints for JSON: None (no preference), a list of ``{numa, preferred}``, ``{"hints": [first
    ``limit``], "total": n}`` when cut, or ``{"family": {...}}`` for a hint family (every NUMA set holding
    ``required``, inside ``universe``, weighing at least ``threshold``)."""
    if hints is None:
        return None
    if isinstance(hints, HintFamily):
        return {"family": {
            "universe": _bits(hints.universe),
            "required": _bits(hints.required),
            "weights": {str(n): w for n, w in hints.weights},
            "threshold": hints.threshold,
            "preferredSize": hints.preferred_size,
            "preferredSockets": hints.preferred_sockets,
        }}
    items = [_hint_dict(h) for h in (hints if limit is None else hints[:limit])]
    if limit is not None and len(hints) > limit:
        return {"hints": items, "total": len(hints)}
    return items


def _device_nodes(nodes: Any) -> Any:
    """One device's NUMA nodes as a frozenset; several devices (a list of node sets) as a list of frozensets."""
    items = list(nodes)
    if all(isinstance(n, int) for n in items):
        return [frozenset(items)]
    return [frozenset(g) for g in items]


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


@dataclass(frozen=True)
class ContainerDecision:
    name: str
    role: str
    mode: Mode
    # per resource: None = no preference, a tuple of hints, or a HintFamily (large machines, see compact_hints)
    hints: Mapping[str, tuple[TopologyHint, ...] | HintFamily | None]
    affinity: TopologyHint | None  # merged hint (None under topology-manager policy none)
    cpus: CPUSet  # its own CPUs if pinned, else the shared pool (empty for a rejected pod)
    mems: CPUSet  # the Memory Manager's NUMA nodes for a container it accounts, else the NUMA nodes of those CPUs

    def to_dict(self, max_hints: int | None = None) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "mode": self.mode,
            "hints": {r: hints_to_json(hs, max_hints) for r, hs in sorted(self.hints.items())},
            "affinity": None if self.affinity is None else _hint_dict(self.affinity),
            "cpus": str(self.cpus),
            "mems": str(self.mems),
        }


@dataclass(frozen=True)
class PodDecision:
    uid: str
    namespace: str
    name: str
    admitted: bool
    reason: Reason | None  # None when admitted
    message: str  # kubelet's message plus numapin's detail
    containers: tuple[ContainerDecision, ...]

    def to_dict(self, max_hints: int | None = None) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "admitted": self.admitted,
            "reason": self.reason,
            "message": self.message,
            "containers": [c.to_dict(max_hints) for c in self.containers],
        }

    def container(self, name: str) -> ContainerDecision:
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(name)


def _admitted_before(pod: PodInfo, state: CPUState, only: str) -> PodInfo:
    """The pod as a later admission sees it: ``only``, the containers holding CPUs and those asking none."""
    held = state.assignments.get(pod.uid, {})
    keep = tuple(c for c in pod.containers
                 if c.name == only or c.name in held or guaranteed_cpus(pod, c) == 0)
    return pod if len(keep) == len(pod.containers) else replace(pod, containers=keep)


def _resized(pod: PodInfo, state: CPUState, name: str) -> bool:
    """A container holding CPUs that its pod now sizes differently (a re-creation carrying new resources)."""
    held = state.get(pod.uid, name)
    return held is not None and pod.has_container(name) and len(held) != guaranteed_cpus(pod, pod.container(name))


def _mems(mem: MemoryState, pod_uid: str, name: str) -> CPUSet:
    return CPUSet(mem.nodes_of(pod_uid, name))


def _hint_dict(h: TopologyHint) -> dict[str, Any]:
    return {"numa": None if h.numa is None else sorted(h.numa), "preferred": h.preferred}


class NodeAllocator:
    """One node's CPU allocation: the state, the static policy and the topology manager together."""

    def __init__(self, config: NodeConfig | NodeParts, state: CPUState | None = None,
                 memory_state: MemoryState | None = None) -> None:
        """``config``: a configuration (built and checked here, ConfigError) or parts ``build_node`` made.
        ``state``: the state to start from (copied; CheckpointError when it does not fit the node);
        ``memory_state`` likewise for the Memory Manager (ignored without ``memoryManagerPolicy: Static``)."""
        parts = config if isinstance(config, NodeParts) else build_node(config)
        self.parts = parts
        self.config = parts.config
        self.topology = parts.config.topology
        self.policy = parts.static_policy
        self.topology_manager = parts.topology_manager
        work = state.copy() if state is not None else CPUState()
        self.policy.start(work)
        self.state: CPUState = work
        self.memory_policy = parts.memory_policy
        self.memory_state: MemoryState | None = None
        if self.memory_policy is not None:
            self.memory_state = memory_state.copy() if memory_state is not None else MemoryState()
            self.memory_policy.start(self.memory_state)

    def copy(self) -> NodeAllocator:
        """Another allocator of the same node (the same parts: nothing is built again) on a copy of the state."""
        return NodeAllocator(self.parts, self.state, self.memory_state)

    # -- queries ----------------------------------------------------------------------
    @property
    def reserved_cpus(self) -> CPUSet:
        return CPUSet(self.policy.reserved)

    def container_cpus(self, pod_uid: str, name: str) -> CPUSet | None:
        return self.state.get(pod_uid, name)

    def shared_pool(self) -> CPUSet:
        return self.state.shared_pool()

    def free_cpus_per_numa(self) -> dict[int, int]:
        """Allocatable CPUs (not reserved, not assigned) per NUMA node, CPU-less nodes included (0)."""
        return self._free_per_numa(self.state)

    def _free_per_numa(self, state: CPUState) -> dict[int, int]:
        free = state.default_cpuset - self.reserved_cpus
        return {n: len(free & self.topology.cpus_in_numa(n)) for n in self.topology.numa_nodes}

    def _pod_bubble(self) -> bool:
        """kubelet would give a pod with pod-level resources one CPU and memory "bubble" (PodLevelResourceManagers,
        topology manager scope pod, a policy other than none): numapin does not model it (yet)."""
        c = self.config
        return (c.pod_level_resource_managers and c.topology_manager_scope == "pod"
                and c.topology_manager_policy != "none")

    def gated(self, pod: PodInfo) -> PodInfo:
        """``pod`` as this node's managers see it: with the node's ``PodLevelResourceManagers`` gate."""
        gate = self.config.pod_level_resource_managers
        return pod if pod.pod_level_managers == gate else replace(pod, pod_level_managers=gate)

    # -- admission --------------------------------------------------------------------
    def admit_pod(
        self,
        pod: PodInfo | Mapping[str, Any],
        *,
        devices: DeviceMap | None = None,
        dry_run: bool = False,
        reallocate: Iterable[str] = (),
        only: str | None = None,
    ) -> PodDecision:
        """Admit ``pod`` as kubelet would (see the module doc). Raises PodSpecError for a pod it cannot read,
        ConfigError for devices on NUMA nodes the machine does not have.

        ``reallocate`` names containers whose current CPUs are dropped first (in the working copy, so a
        rejection keeps them): they get CPUs again like a new container. The CRI proxy uses it for a container
        it took for an init container whose CPUs passed to a sibling, and which kubelet re-creates.

        ``only`` names the container being created of a pod admitted before. kubelet admits a pod once, every
        container at the pod's admission, and keeps the CPUs for the pod's life: a container created later (a
        restart, attempt+1) only looks its CPUs up. So only ``only`` may get CPUs it does not hold; the pod's other
        containers without CPUs (an init container that completed and was removed, a container running on the
        shared pool) are left out of the admission and keep what they have: no running container is given CPUs,
        nor moved, behind its back, and a completed init container takes no CPU from the pool again."""
        info = with_pod_mode(self.gated(pod if isinstance(pod, PodInfo) else PodInfo.from_pod(pod)), self.state)
        work = self.state.copy()
        mem_work = self.memory_state.copy() if self.memory_state is not None else None
        for name in reallocate:
            self.policy.remove(work, info.uid, name)
            if self.memory_policy is not None and mem_work is not None:
                self.memory_policy.remove(mem_work, info.uid, name)
        if only is not None and not info.bypass and _resized(info, work, only):
            # re-created with other resources (resizePolicy RestartContainer): resized like a running container
            outcome, resized = plan_resize(work, self.policy, self.topology_manager, info, only)
            if resized is None:
                return self._decision(info, self.state, None, False, outcome.reason,  # type: ignore[arg-type]
                                      outcome.message)
            work = resized
        if only is not None:
            info = _admitted_before(info, work, only)
        if info.bypass:
            return self._decision(info, work, None, True, None, "bypassed (numapin.io/bypass)")
        if info.pod_level_resources and self._pod_bubble():
            return self._decision(info, self.state, None, False, "UnexpectedAdmissionError",
                                  POD_BUBBLE_UNSUPPORTED.format(pod=info.ref))
        device_map = {c: {r: _device_nodes(n) for r, n in d.items()} for c, d in (devices or {}).items()}
        memory: HintProvider = MemoryHintProvider()
        if self.memory_policy is not None and mem_work is not None:
            memory = MemoryProvider(self.memory_policy, mem_work)
        providers: list[HintProvider] = [self.policy, memory,
                                         DeviceHintProvider(device_map, self.topology.numa_nodes)]
        result = self.topology_manager.admit(work, info, providers)  # on the copy, init-container reuse included
        if not result.admitted:
            return self._decision(info, self.state, result, False, result.reason,
                                  self._reject_message(result, info, work, mem_work))
        decision = self._decision(info, work, result, True, None, "admitted", mem_work)
        if not dry_run:
            self.state = work
            self.memory_state = mem_work
        return decision

    def _reject_message(self, result: Any, pod: PodInfo, work: CPUState, mem: MemoryState | None = None) -> str:
        message = result.message
        who = result.failed_container
        if result.reason != "TopologyAffinityError":
            where = f"container {who!r} of pod {pod.ref}" if who else f"pod {pod.ref}"
            return f"{message} ({where})"
        cpus = guaranteed_cpus(pod, pod.container(who)) if who else pod_guaranteed_cpus(pod)
        free = ", ".join(f"{n}: {k}" for n, k in self._free_per_numa(work).items())
        detail = f"pod {pod.ref}; {cpus} exclusive CPU(s) asked; free CPUs per NUMA node {{{free}}}"
        if mem is not None:
            detail += memory_detail(pod, who, mem)
        if message.endswith(")"):
            return f"{message[:-1]}; {detail})"
        return f"{message} ({detail})"

    def _hints_of(self, hints: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for resource, h in hints.items():
            if isinstance(h, HintFamily) and self.topology.num_numa_nodes <= 8:
                h = tuple(h.hints())  # listed in full on machines where that stays small
            elif h is not None and not isinstance(h, HintFamily):
                h = tuple(h)
            out[resource] = h
        if not isinstance(self.topology_manager.policy, NonePolicy):  # policy none gathers no hints
            out.setdefault("memory", None)
        return out

    def _decision(
        self,
        pod: PodInfo,
        work: CPUState,
        result: Any,
        admitted: bool,
        reason: Reason | None,
        message: str,
        mem: MemoryState | None = None,
    ) -> PodDecision:
        per_container = {c.name: c for c in (result.containers if result is not None else ())}
        pool = work.shared_pool()
        out: list[ContainerDecision] = []
        for c in pod.containers:
            r = per_container.get(c.name)
            own = work.get(pod.uid, c.name) if admitted else None
            mode: Mode = SHARED_POOL if pod.bypass else container_mode(pod, c)
            if not admitted:
                cpus = CPUSet()  # a rejected pod gets nothing; mode says what it asked for
            elif own:
                cpus = own
            else:
                mode = SHARED_POOL
                cpus = pool
            out.append(ContainerDecision(
                name=c.name,
                role=c.role,
                mode=mode,
                hints=self._hints_of(r.hints) if r is not None else {},
                affinity=r.affinity if r is not None else None,
                cpus=cpus,
                mems=_mems(mem, pod.uid, c.name) if admitted and mem is not None and mem.blocks(pod.uid, c.name)
                else memory_nodes(self.topology, cpus),
            ))
        return PodDecision(pod.uid, pod.namespace, pod.name, admitted, reason, message, tuple(out))

    # -- mode transitions (allocator.mode_change) ---------------------------------------------------------
    def change_mode(self, pod: PodInfo, target: str | None, *, dry_run: bool = False) -> ModeChange:
        """Move a running pod to another ``qos.gocrane.io/cpu-manager`` mode (None or ``kubelet``: kubelet's rule),
        transactionally: a refused transition (kubelet's reason in the outcome) changes nothing. Raises
        PodSpecError for a target that is not a mode."""
        mem = None
        if self.memory_policy is not None and self.memory_state is not None:
            mem = MemoryProvider(self.memory_policy, self.memory_state.copy())
        change, work = plan_mode_change(self.state, self.policy, self.topology_manager, self.gated(pod), target, mem)
        if work is not None and not dry_run:
            self.state = work
            if mem is not None:
                self.memory_state = mem.state
        return change

    def pod_mode(self, pod_uid: str) -> str | None:
        """The mode a transition gave the pod (``none``, ``exclusive``, ``share``, ``kubelet``), None if none did."""
        return self.state.pod_modes.get(pod_uid)

    # -- in-place resize (allocator.resize) -----------------------------------------------------------------
    def resize_container(self, pod: PodInfo, name: str, *, dry_run: bool = False) -> ResizeOutcome:
        """Resize container ``name`` of a running pod to what ``pod`` (the pod after the resize, same uid) asks,
        from what the state holds for it, transactionally: a refused resize (kubelet's reason in the outcome)
        changes nothing. Raises PodSpecError when the pod has no such container. See allocator.resize."""
        outcome, work = plan_resize(self.state, self.policy, self.topology_manager, self.gated(pod), name)
        if work is not None and not dry_run:
            self.state = work
        held = self.container_mems(pod.uid, name)
        if held is not None:  # the Memory Manager's nodes stay the container's memory nodes (resize_memory moves them)
            outcome = replace(outcome, mems_before=held, mems_after=held)
        return outcome

    def baseline_cpus(self, pod_uid: str, name: str) -> CPUSet | None:
        """The CPUs the container was admitted with (its CPUs when no resize changed them); None without CPUs."""
        return self.state.baseline(pod_uid, name)

    # -- memory (allocator.memory) ----------------------------------------------------------------------
    def container_mems(self, pod_uid: str, name: str) -> CPUSet | None:
        """The Memory Manager's NUMA nodes of a container (None when it accounts none for it)."""
        if self.memory_state is None or self.memory_state.blocks(pod_uid, name) is None:
            return None
        return _mems(self.memory_state, pod_uid, name)

    def resize_memory(self, pod: PodInfo, name: str, *, dry_run: bool = False) -> MemoryResize:
        """Account a running container's new memory limit (``pod``: its model with the new limits) in its NUMA
        nodes, extended as kubelet extends a hint when they cannot hold it; a refusal changes nothing
        (allocator.memory.resize). Without ``memoryManagerPolicy: Static`` memory is not accounted: admitted."""
        if self.memory_policy is None or self.memory_state is None:
            return MemoryResize(pod.uid, name, True, None, "memory manager policy None: memory is not accounted",
                                (), (), None, None)
        outcome, work = plan_memory_resize(self.memory_policy, self.memory_state, self.gated(pod), name)
        if work is not None and not dry_run:
            self.memory_state = work
        return outcome

    # -- release ----------------------------------------------------------------------
    def release_container(self, pod_uid: str, name: str) -> CPUSet:
        """Give back a container's CPUs (those no sibling still holds) and memory; returns the CPUs returned to
        the pool."""
        if self.memory_policy is not None and self.memory_state is not None:
            self.memory_policy.remove(self.memory_state, pod_uid, name)
        return CPUSet(self.policy.remove(self.state, pod_uid, name))

    def release_pod(self, pod_uid: str) -> CPUSet:
        names = sorted(self.state.assignments.get(pod_uid, {}))
        before = self.state.default_cpuset
        for name in names:
            self.policy.remove(self.state, pod_uid, name)
        if self.memory_policy is not None and self.memory_state is not None:
            for name in sorted(self.memory_state.assignments.get(pod_uid, {})):
                self.memory_policy.remove(self.memory_state, pod_uid, name)
        self.state.pod_modes.pop(pod_uid, None)
        return self.state.default_cpuset - before
