"""The node facade: kubelet's pod admission on one node (CPU manager static policy + topology manager).

This is what the CRI proxy, the webhook and ``numapin plan`` call. ``NodeAllocator.admit_pod`` does what kubelet's
topology-manager admit handler does for a pod:

- for every container (scope ``container``: init containers then app containers, in spec order), or once for
  the whole pod (scope ``pod``), gather the hints of every provider -- CPUs (the static policy), memory (which
  follows the CPUs: numapin does not account memory per NUMA node, so it never narrows the choice) and the
  devices already bound to the container -- and merge them under the topology-manager policy;
- a container whose merged hint is not admissible rejects the whole pod with ``TopologyAffinityError``;
- otherwise every provider allocates with that hint; an allocation error rejects the pod with the error's
  reason (``SMTAlignmentError``) or ``UnexpectedAdmissionError``.

Admission is transactional: it works on a copy of the state and commits only an admitted pod, so a rejected
pod leaves no trace. Containers get numapin's modes: ``exclusive`` (own CPUs), ``share`` (own CPUs that stay in
the shared pool, Crane's mode) or ``shared`` (the shared pool).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from .cpuset import CPUSet
from .errors import AllocationError, ConfigError
from .hints import TopologyHint
from .pod import ContainerInfo, PodInfo, container_mode
from .state import CPUState
from .topology import Topology

__all__ = [
    "TM_POLICIES",
    "TM_POLICY_OPTIONS",
    "TM_SCOPES",
    "ContainerDecision",
    "NodeAllocator",
    "NodeConfig",
    "PodDecision",
]

TM_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TM_SCOPES = ("container", "pod")
TM_POLICY_OPTIONS = ("prefer-closest-numa-nodes", "max-allowable-numa-nodes")
DEFAULT_MAX_NUMA_NODES = 8

TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"

Mode = Literal["exclusive", "share", "shared"]
Reason = Literal["TopologyAffinityError", "SMTAlignmentError", "UnexpectedAdmissionError"]
DeviceMap = Mapping[str, Mapping[str, Iterable[int]]]


def _parse_bool(value: str, field_name: str) -> bool:
    v = str(value).strip().lower()
    if v in ("true", "1", "t"):
        return True
    if v in ("false", "0", "f"):
        return False
    raise ConfigError(f"{field_name}: {value!r} is not a boolean (true or false)")


@dataclass(frozen=True)
class NodeConfig:
    """kubelet's CPU- and topology-manager configuration of one node (field names as in KubeletConfiguration)."""

    topology: Topology
    reserved_cpus: CPUSet | None = None
    num_reserved_cpus: int = 0
    cpu_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ConfigError (naming the kubelet setting) for what kubelet would refuse at startup."""
        if self.topology_manager_policy not in TM_POLICIES:
            raise ConfigError(
                f"topologyManagerPolicy: unknown policy {self.topology_manager_policy!r} "
                f"(allowed: {', '.join(TM_POLICIES)})"
            )
        if self.topology_manager_scope not in TM_SCOPES:
            raise ConfigError(
                f"topologyManagerScope: unknown scope {self.topology_manager_scope!r} "
                f"(allowed: {', '.join(TM_SCOPES)})"
            )
        for name in self.topology_manager_policy_options:
            if name not in TM_POLICY_OPTIONS:
                raise ConfigError(
                    f"topologyManagerPolicyOptions: unknown option {name!r} (allowed: {', '.join(TM_POLICY_OPTIONS)})"
                )
        if self.prefer_closest_numa_nodes and self.topology.numa_distances is None:
            raise ConfigError(
                "topologyManagerPolicyOptions: prefer-closest-numa-nodes needs NUMA distances, and this "
                "topology has none"
            )
        limit = self.max_allowable_numa_nodes
        if self.topology_manager_policy != "none" and self.topology.num_numa_nodes > limit:
            raise ConfigError(
                f"topologyManagerPolicy {self.topology_manager_policy!r}: unsupported on machines with more than "
                f"{limit} NUMA Nodes (this one has {self.topology.num_numa_nodes}); raise "
                f"topologyManagerPolicyOptions max-allowable-numa-nodes"
            )
        if self.topology_manager_policy == "single-numa-node" and self.cpu_option_enabled("align-by-socket"):
            raise ConfigError(
                "cpuManagerPolicyOptions: align-by-socket cannot be used with topologyManagerPolicy single-numa-node"
            )
        if self.num_reserved_cpus < 0:
            raise ConfigError(f"numReservedCPUs must be >= 0, got {self.num_reserved_cpus}")
        if self.reserved_cpus is not None:
            outside = self.reserved_cpus - self.topology.all_cpus
            if outside:
                raise ConfigError(f"reservedCPUs: CPUs {outside} are not on this machine "
                                  f"(it has {self.topology.all_cpus})")
            if self.num_reserved_cpus and self.num_reserved_cpus != len(self.reserved_cpus):
                raise ConfigError(
                    f"reservedCPUs ({self.reserved_cpus}, {len(self.reserved_cpus)} CPUs) and "
                    f"numReservedCPUs ({self.num_reserved_cpus}) disagree; give one of them"
                )

    def cpu_option_enabled(self, name: str) -> bool:
        value = self.cpu_manager_policy_options.get(name)
        return value is not None and _parse_bool(value, f"cpuManagerPolicyOptions[{name!r}]")

    @property
    def prefer_closest_numa_nodes(self) -> bool:
        value = self.topology_manager_policy_options.get("prefer-closest-numa-nodes")
        return value is not None and _parse_bool(value, "topologyManagerPolicyOptions['prefer-closest-numa-nodes']")

    @property
    def max_allowable_numa_nodes(self) -> int:
        value = self.topology_manager_policy_options.get("max-allowable-numa-nodes")
        if value is None:
            return DEFAULT_MAX_NUMA_NODES
        try:
            n = int(str(value).strip())
        except ValueError:
            raise ConfigError(
                f"topologyManagerPolicyOptions['max-allowable-numa-nodes']: {value!r} is not an integer"
            ) from None
        if n < DEFAULT_MAX_NUMA_NODES:
            raise ConfigError(
                f"topologyManagerPolicyOptions['max-allowable-numa-nodes']: {n} is less than the default "
                f"{DEFAULT_MAX_NUMA_NODES}"
            )
        return n


@dataclass(frozen=True)
class ContainerDecision:
    name: str
    role: str
    mode: Mode
    hints: Mapping[str, tuple[TopologyHint, ...] | None]  # per resource; None = no preference
    affinity: TopologyHint | None  # merged hint (None under topology-manager policy none)
    cpus: CPUSet  # its own CPUs if pinned, else the shared pool (empty for a rejected pod)
    mems: CPUSet  # NUMA nodes of those CPUs

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "mode": self.mode,
            "hints": {
                r: None if hs is None else [_hint_dict(h) for h in hs] for r, hs in sorted(self.hints.items())
            },
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "admitted": self.admitted,
            "reason": self.reason,
            "message": self.message,
            "containers": [c.to_dict() for c in self.containers],
        }

    def container(self, name: str) -> ContainerDecision:
        for c in self.containers:
            if c.name == name:
                return c
        raise KeyError(name)


def _hint_dict(h: TopologyHint) -> dict[str, Any]:
    return {"numa": None if h.numa is None else sorted(h.numa), "preferred": h.preferred}


def _cpu_hints(raw: Any) -> tuple[TopologyHint, ...] | None:
    """The CPU provider's answer as one resource's hint list: None = no preference, () = impossible."""
    if raw is None:
        return None
    if isinstance(raw, Mapping):  # a provider's {resource: hints} map
        raw = raw.get("cpu")
        if raw is None:
            return None
    return tuple(raw)


class _Rejected(Exception):
    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class NodeAllocator:
    """One node's CPU allocation: the state, the static policy and the topology manager together."""

    def __init__(self, config: NodeConfig, state: CPUState | None = None) -> None:
        from .static_policy import StaticPolicy

        config.validate()
        self.config = config
        self.topology = config.topology
        self.policy = StaticPolicy(
            config.topology,
            reserved_cpus=config.reserved_cpus,
            num_reserved_cpus=config.num_reserved_cpus,
            options=dict(config.cpu_manager_policy_options),
            topology_manager_policy=config.topology_manager_policy,
        )
        work = state.copy() if state is not None else CPUState()
        self.policy.start(work)
        self.state: CPUState = work
        self._pods: dict[str, PodInfo] = {}

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

    def pod(self, pod_uid: str) -> PodInfo | None:
        return self._pods.get(pod_uid)

    # -- admission --------------------------------------------------------------------
    def admit_pod(
        self,
        pod: PodInfo | Mapping[str, Any],
        *,
        devices: DeviceMap | None = None,
        dry_run: bool = False,
    ) -> PodDecision:
        """Admit ``pod`` as kubelet would (see the module doc). Raises PodSpecError for a pod it cannot read."""
        info = pod if isinstance(pod, PodInfo) else PodInfo.from_pod(pod)
        devices = devices or {}
        work = self.state.copy()
        # The policy keeps one piece of state of its own, the init-container CPU reuse of the pod being admitted;
        # it holds immutable values, so a shallow copy keeps a rejected admission from touching it.
        policy = copy.copy(self.policy)
        if info.bypass:
            return self._decision(info, work, {}, {}, True, None, "bypassed (numapin.io/bypass)")
        hints: dict[str, dict[str, tuple[TopologyHint, ...] | None]] = {}
        affinity: dict[str, TopologyHint | None] = {}
        try:
            if self.config.topology_manager_policy == "none":
                for c in info.containers:
                    hints[c.name] = {}
                    affinity[c.name] = None
                    self._allocate(policy, work, info, c, None)
            elif self.config.topology_manager_scope == "pod":
                per_resource = self._pod_resources(policy, work, info, devices)
                for c in info.containers:
                    hints[c.name] = per_resource
                merged = self._merge(per_resource, "pod", info, None, work)
                for c in info.containers:
                    affinity[c.name] = merged
                for c in info.containers:
                    self._allocate(policy, work, info, c, merged)
            else:
                for c in info.containers:
                    per_resource = self._container_resources(policy, work, info, c, devices)
                    hints[c.name] = per_resource
                    affinity[c.name] = merged = self._merge(per_resource, f"container {c.name!r}", info, c, work)
                    self._allocate(policy, work, info, c, merged)
        except _Rejected as r:
            return self._decision(info, self.state, hints, affinity, False, r.reason, r.message)
        decision = self._decision(info, work, hints, affinity, True, None, "admitted")
        if not dry_run:
            self.state = work
            self.policy = policy
            self._pods[info.uid] = info
        return decision

    def _container_resources(
        self, policy: Any, work: CPUState, pod: PodInfo, c: ContainerInfo, devices: DeviceMap
    ) -> dict[str, tuple[TopologyHint, ...] | None]:
        cpu = _cpu_hints(policy.topology_hints(work, pod, c.name))
        return self._resources(cpu, devices.get(c.name, {}))

    def _pod_resources(
        self, policy: Any, work: CPUState, pod: PodInfo, devices: DeviceMap
    ) -> dict[str, tuple[TopologyHint, ...] | None]:
        cpu = _cpu_hints(policy.pod_topology_hints(work, pod))
        union: dict[str, set[int]] = {}
        for c in pod.containers:
            for resource, nodes in devices.get(c.name, {}).items():
                union.setdefault(resource, set()).update(nodes)
        return self._resources(cpu, union)

    def _resources(
        self, cpu: Iterable[TopologyHint] | None, devices: Mapping[str, Iterable[int]]
    ) -> dict[str, tuple[TopologyHint, ...] | None]:
        out: dict[str, tuple[TopologyHint, ...] | None] = {"cpu": None if cpu is None else tuple(cpu)}
        # numapin's memory follows the CPUs (cpuset.mems = their NUMA nodes): it never narrows the choice.
        out["memory"] = None
        for resource, nodes in sorted(devices.items()):
            out[resource] = self._device_hints(frozenset(nodes), resource)
        return out

    def _device_hints(self, nodes: frozenset[int], resource: str) -> tuple[TopologyHint, ...] | None:
        """kubelet's hints for devices already allocated on ``nodes``: every NUMA mask holding them all;
        preferred when it holds nothing else."""
        if not nodes:
            return None
        unknown = nodes - set(self.topology.numa_nodes)
        if unknown:
            raise ConfigError(f"devices[{resource!r}]: NUMA nodes {sorted(unknown)} are not on this machine")
        all_nodes = self.topology.numa_nodes
        others = [n for n in all_nodes if n not in nodes]
        out: list[TopologyHint] = []
        for bits in range(1 << len(others)):
            extra = frozenset(others[i] for i in range(len(others)) if bits >> i & 1)
            out.append(TopologyHint(nodes | extra, preferred=not extra))
        out.sort(key=lambda h: (len(h.numa or ()), h.mask))
        return tuple(out)

    def _merge(
        self,
        per_resource: Mapping[str, tuple[TopologyHint, ...] | None],
        what: str,
        pod: PodInfo,
        c: ContainerInfo | None,
        work: CPUState,
    ) -> TopologyHint:
        from .merge import merge_hints

        providers: list[Mapping[str, list[TopologyHint] | None] | None] = [
            {"cpu": None if per_resource["cpu"] is None else list(per_resource["cpu"])},
            None,  # memory: no preference
        ]
        devices = {r: list(h) if h is not None else None for r, h in per_resource.items() if r not in ("cpu",
                                                                                                         "memory")}
        if devices:
            providers.append(devices)
        options: dict[str, str] = dict(self.config.topology_manager_policy_options)
        hint, admit = merge_hints(
            providers,
            policy=self.config.topology_manager_policy,
            numa_nodes=self.topology.numa_nodes,
            distances=self.topology.numa_distances,
            options=options,
        )
        if not admit:
            raise _Rejected("TopologyAffinityError", self._affinity_message(per_resource, what, pod, c, hint, work))
        return hint

    def _affinity_message(
        self,
        per_resource: Mapping[str, tuple[TopologyHint, ...] | None],
        what: str,
        pod: PodInfo,
        c: ContainerInfo | None,
        hint: TopologyHint,
        work: CPUState,
    ) -> str:
        from .pod import guaranteed_cpus, pod_guaranteed_cpus

        cpus = pod_guaranteed_cpus(pod) if c is None else guaranteed_cpus(pod, c)
        free = ", ".join(f"{n}: {k}" for n, k in self._free_per_numa(work).items())
        cpu_hints = per_resource.get("cpu")
        preferred = [h for h in cpu_hints or () if h.preferred]
        detail = (
            f"topology manager policy {self.config.topology_manager_policy}, scope "
            f"{self.config.topology_manager_scope}: {what} of pod {pod.ref} needs {cpus} exclusive CPU(s); "
        )
        if cpu_hints is not None and not cpu_hints:
            detail += "no NUMA affinity can hold them now; "
        elif cpu_hints is not None and not preferred and self.config.topology_manager_policy != "best-effort":
            detail += "no preferred (narrowest) NUMA affinity can hold them now; "
        detail += f"best merged hint {hint}; free CPUs per NUMA node {{{free}}}"
        return f"{TOPOLOGY_AFFINITY_MESSAGE} ({detail})"

    def _allocate(self, policy: Any, work: CPUState, pod: PodInfo, c: ContainerInfo,
                  affinity: TopologyHint | None) -> None:
        from .errors import SMTAlignmentError

        mode = container_mode(pod, c)
        try:
            cpus = policy.allocate(work, pod, c.name, affinity)
        except SMTAlignmentError as e:
            raise _Rejected("SMTAlignmentError", f"{e} (container {c.name!r} of pod {pod.ref})") from None
        except AllocationError as e:
            raise _Rejected(
                "UnexpectedAdmissionError",
                f"Allocate failed due to {e}, which is unexpected (container {c.name!r} of pod {pod.ref})",
            ) from None
        if mode != "shared" and cpus and work.mode(pod.uid, c.name) != mode:
            work.set(pod.uid, c.name, work.get(pod.uid, c.name) or CPUSet(cpus), mode)

    def _decision(
        self,
        pod: PodInfo,
        work: CPUState,
        hints: Mapping[str, Mapping[str, tuple[TopologyHint, ...] | None]],
        affinity: Mapping[str, TopologyHint | None],
        admitted: bool,
        reason: Reason | None,
        message: str,
    ) -> PodDecision:
        pool = work.shared_pool()
        out: list[ContainerDecision] = []
        for c in pod.containers:
            own = work.get(pod.uid, c.name) if admitted else None
            mode: Mode = "shared" if pod.bypass else container_mode(pod, c)
            if not admitted:
                cpus = CPUSet()  # a rejected pod gets nothing; mode says what it asked for
            elif own:
                cpus = own
            else:
                mode = "shared"
                cpus = pool
            out.append(ContainerDecision(
                name=c.name,
                role=c.role,
                mode=mode,
                hints=dict(hints.get(c.name, {})),
                affinity=affinity.get(c.name),
                cpus=cpus,
                mems=self.topology.numa_of(cpus),
            ))
        return PodDecision(pod.uid, pod.namespace, pod.name, admitted, reason, message, tuple(out))

    # -- release ----------------------------------------------------------------------
    def release_container(self, pod_uid: str, name: str) -> CPUSet:
        """Give back a container's CPUs (those no sibling still holds); returns the CPUs returned to the pool."""
        return CPUSet(self.policy.remove(self.state, pod_uid, name))

    def release_pod(self, pod_uid: str) -> CPUSet:
        names = sorted(self.state.assignments.get(pod_uid, {}))
        before = self.state.default_cpuset
        for name in names:
            self.policy.remove(self.state, pod_uid, name)
        self._pods.pop(pod_uid, None)
        return self.state.default_cpuset - before
