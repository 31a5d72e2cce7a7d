"""kubelet's CPU Manager static policy (policy_static.go), with Crane's per-pod modes.

The policy owns the reserved CPUs, the rules for who gets CPUs of its own and how many, the allocation
of those CPUs (take-by-topology inside the topology manager's NUMA affinity first, the rest outside it),
the release of a container's CPUs, the CPU topology hints, and the reuse of init containers' CPUs by
the containers that follow them in the same pod. The CPU state it works on is a ``CPUState`` passed in
on every call; the only thing kept between calls is the reuse bookkeeping of the pod being admitted
(as kubelet keeps it: one pod at a time).

Who gets CPUs and how many comes from ``allocator.pod`` (kubelet's rule, or Crane's
``qos.gocrane.io/cpu-manager`` annotation); ``share`` containers get CPUs of their own that are taken
out of the default set like exclusive ones, and stay usable by the shared pool
(``CPUState.shared_pool``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .compact_hints import COMPACT_ABOVE_NUMA_NODES, HintFamily, cpu_hint_family
from .cpu_assignment import CPUTaker
from .cpu_hints import generate_cpu_hints
from .cpuset import CPUSet
from .errors import AllocationError, CheckpointError, ConfigError, SMTAlignmentError
from .hints import TopologyHint
from .pod import ContainerInfo, PodInfo, container_mode, guaranteed_cpus, pod_guaranteed_cpus
from .policy_options import StaticPolicyOptions
from .state import CPUState
from .topology import Topology

__all__ = ["CPU_RESOURCE", "ZERO_RESERVED", "StaticPolicy", "require_reserved"]

CPU_RESOURCE = "cpu"

Hints = dict[str, list[TopologyHint] | HintFamily | None]

ZERO_RESERVED = (
    "the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero "
    "(set reservedCPUs or numReservedCPUs)"
)


def require_reserved(reserved_cpus: CPUSet | None, num_reserved_cpus: int) -> None:
    """kubelet's start-up rule for a node with the static policy (checked where kubelet builds its container manager,
    not by the policy itself, which accepts zero reserved CPUs): some CPUs must be reserved. ConfigError if not."""
    if not reserved_cpus and not num_reserved_cpus:
        raise ConfigError(ZERO_RESERVED)


class StaticPolicy:
    """kubelet's static policy. ``name`` is what the state file's ``policyName`` must say."""

    name = "static"

    def __init__(
        self,
        topology: Topology,
        *,
        reserved_cpus: CPUSet | None = None,
        num_reserved_cpus: int = 0,
        options: Mapping[str, str] | StaticPolicyOptions | None = None,
        topology_manager_policy: str = "none",
    ) -> None:
        self.topology = topology
        self.options = options if isinstance(options, StaticPolicyOptions) else StaticPolicyOptions.parse(options)
        self.options.validate(topology, topology_manager_policy)
        self._taker = CPUTaker(topology)
        self.cpus_per_core = topology.threads_per_core
        self.reserved = self._reserve(reserved_cpus, num_reserved_cpus)
        self.reserved_physical = topology.core_siblings(self.reserved)

    def _reserve(self, reserved_cpus: CPUSet | None, num_reserved_cpus: int) -> CPUSet:
        if isinstance(num_reserved_cpus, bool) or not isinstance(num_reserved_cpus, int) or num_reserved_cpus < 0:
            raise ConfigError(f"numReservedCPUs must be a non-negative integer, got {num_reserved_cpus!r}")
        if reserved_cpus:
            outside = reserved_cpus - self.topology.all_cpus
            if outside:
                raise ConfigError(
                    "[cpumanager] unable to build the reserved physical CPUs from the reserved set: "
                    f"reservedCPUs {outside} are not on this machine (online CPUs: {self.topology.all_cpus})"
                )
            if num_reserved_cpus and num_reserved_cpus != len(reserved_cpus):
                raise ConfigError(
                    f"[cpumanager] unable to reserve the required amount of CPUs (size of {reserved_cpus} "
                    f"did not equal {num_reserved_cpus})"
                )
            return reserved_cpus
        if num_reserved_cpus == 0:
            return CPUSet()  # kubelet's policy accepts it; its container manager refuses it (require_reserved)
        try:
            reserved = self._take(self.topology.all_cpus, num_reserved_cpus)
        except AllocationError:
            reserved = CPUSet()
        if len(reserved) != num_reserved_cpus:
            raise ConfigError(
                f"[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} did not equal "
                f"{num_reserved_cpus}): the machine has {self.topology.num_cpus} CPUs"
            )
        return reserved

    def _take(self, available: CPUSet, count: int) -> CPUSet:
        return self._taker.take(available, count, self.options)

    def take(self, available: CPUSet, count: int) -> CPUSet:
        """``count`` CPUs of ``available`` by the policy's take-by-topology rules and options (AllocationError)."""
        return self._take(available, count)

    # -- pools ----------------------------------------------------------------------------------------
    def allocatable_cpus(self) -> CPUSet:
        """Every CPU exclusive allocations may ever use (kubelet's GetAllocatableCPUs)."""
        return self.topology.all_cpus - self.reserved

    def available_cpus(self, state: CPUState) -> CPUSet:
        """Unassigned CPUs minus the reserved ones (kubelet's GetAvailableCPUs)."""
        return state.default_cpuset - self.reserved

    def available_physical_cpus(self, state: CPUState) -> CPUSet:
        """Unassigned CPUs minus every thread of a core holding a reserved CPU (``full-pcpus-only`` counts these)."""
        return state.default_cpuset - self.reserved_physical

    def initial_default_cpuset(self) -> CPUSet:
        if self.options.strict_cpu_reservation:
            return self.topology.all_cpus - self.reserved
        return self.topology.all_cpus

    # -- start ----------------------------------------------------------------------------------------
    def start(self, state: CPUState) -> None:
        """kubelet's validateState: initialise an empty state, or check a loaded one (CheckpointError if bad)."""
        assignments = state.assignments
        default = state.default_cpuset
        expected = self.initial_default_cpuset()
        if not default:
            if len(assignments) == 0:
                state.default_cpuset = expected
                return
            # kubelet refuses any empty default set with assignments; with strict-cpu-reservation every
            # CPU can legitimately be assigned, so numapin checks that state like any other instead.
            if not self.options.strict_cpu_reservation:
                raise CheckpointError("default cpuset cannot be empty")
        if self.options.strict_cpu_reservation:
            leaked = self.reserved & default
            if leaked:
                raise CheckpointError(
                    f'some of strictly reserved cpus: "{leaked}" are present in defaultCpuSet: "{default}"'
                )
        elif not self.reserved <= default:
            raise CheckpointError(f'not all reserved cpus: "{self.reserved}" are present in defaultCpuSet: "{default}"')
        known = default.mask
        for pod_uid, containers in assignments.items():
            for name, cpus in containers.items():
                if cpus & default:
                    raise CheckpointError(
                        f'pod: {pod_uid}, container: {name} cpuset: "{cpus}" overlaps with default cpuset "{default}"'
                    )
                known |= cpus.mask
        for pod_uid, containers in state.baselines.items():
            for name, base in containers.items():
                own = assignments.get(pod_uid, {}).get(name)
                if own is None or not base <= own:
                    raise CheckpointError(
                        f'pod: {pod_uid}, container: {name} baseline cpuset "{base}" is not part of its cpuset '
                        f'"{own or ""}"'
                    )
        total = CPUSet.from_mask(known)
        if total != expected:
            raise CheckpointError(
                f'current set of available CPUs "{expected}" doesn\'t match with CPUs in state "{total}"'
            )

    # -- allocate / remove ------------------------------------------------------------------------------
    def allocate(
        self,
        state: CPUState,
        pod: PodInfo | Mapping[str, Any],
        container_name: str,
        affinity: TopologyHint | None = None,
    ) -> CPUSet:
        """Give the container its CPUs (kubelet's Allocate) and return them.

        Returns an empty CPUSet for a container that runs on the shared pool. Idempotent: a container
        already in the state keeps its CPUs. Raises SMTAlignmentError (``full-pcpus-only``) or
        AllocationError; the state is unchanged on error.
        """
        info = _pod_info(pod)
        c = info.container(container_name)
        n = self._requested(info, c)
        if n == 0:
            return CPUSet()
        if self.options.full_pcpus_only:
            per_core = self.cpus_per_core or 1
            if n % per_core:
                raise SMTAlignmentError(n, per_core)
        existing = state.get(info.uid, c.name)
        if existing is not None:
            self._update_reuse(state, info, c, existing)
            return existing
        if self.options.full_pcpus_only:
            physical = len(self.available_physical_cpus(state))
            if n > physical:
                raise SMTAlignmentError(n, self.cpus_per_core or 1, physical, cause="not enough free physical CPUs")
        reusable = self._reusable(state, info.uid)
        cpus = self._allocate_cpus(state, n, affinity, reusable)
        state.default_cpuset = state.default_cpuset - cpus
        state.set(info.uid, c.name, cpus, container_mode(info, c))
        self._update_reuse(state, info, c, cpus)
        return cpus

    def _allocate_cpus(self, state: CPUState, n: int, affinity: TopologyHint | None, reusable: CPUSet) -> CPUSet:
        allocatable = self.available_cpus(state) | reusable
        result = CPUSet()
        if affinity is not None and affinity.numa is not None:
            aligned = allocatable & self._aligned_cpus(affinity.numa)
            result = self._take(aligned, min(n, len(aligned)))
        if n > len(result):
            result = result | self._take(allocatable - result, n - len(result))
        return result

    def _aligned_cpus(self, numa: frozenset[int]) -> CPUSet:
        """The CPUs of the affinity's NUMA nodes; with ``align-by-socket``, of every socket they touch."""
        cpus = self.topology.cpus_in_numas(numa)
        if self.options.align_by_socket:
            m = 0
            for s in self.topology.sockets_of(cpus):
                m |= self.topology.cpus_in_socket(s).mask
            cpus = CPUSet.from_mask(m)
        return cpus

    def remove(self, state: CPUState, pod_uid: str, container_name: str) -> CPUSet:
        """Release the container's CPUs (kubelet's RemoveContainer) and return the CPUs given back to the
        default set: its CPUs minus those still held by its sibling containers (reused init CPUs)."""
        cpus = state.get(pod_uid, container_name)
        if cpus is None:
            return CPUSet()
        in_use = 0
        for name, other in state.assignments.get(pod_uid, {}).items():
            if name != container_name:
                in_use |= other.mask
        state.delete(pod_uid, container_name)
        released = cpus - CPUSet.from_mask(in_use)
        state.default_cpuset = state.default_cpuset | released
        return released

    # -- hints --------------------------------------------------------------------------------------------
    def topology_hints(self, state: CPUState, pod: PodInfo | Mapping[str, Any], container_name: str) -> Hints | None:
        """Container-scope CPU hints: None (no preference) for a shared-pool container, ``{"cpu": []}`` when
        the container already holds a different number of CPUs than it asks for."""
        info = _pod_info(pod)
        c = info.container(container_name)
        requested = self._requested(info, c)
        if requested == 0:
            return None
        allocated = state.get(info.uid, c.name)
        if allocated is not None:
            if len(allocated) != requested:
                return {CPU_RESOURCE: []}
            return {CPU_RESOURCE: self._hints(allocated, CPUSet(), requested)}
        return {CPU_RESOURCE: self._hints(self.available_cpus(state), self._reusable(state, info.uid), requested)}

    def pod_topology_hints(self, state: CPUState, pod: PodInfo | Mapping[str, Any]) -> Hints | None:
        """Pod-scope CPU hints for kubelet's pod-level CPU count (init and sidecar rule)."""
        info = _pod_info(pod)
        if info.bypass:
            return None
        requested = pod_guaranteed_cpus(info)
        if requested == 0:
            return None
        assigned = CPUSet()
        for c in info.containers:
            allocated = state.get(info.uid, c.name)
            if allocated is None:
                continue
            if len(allocated) != guaranteed_cpus(info, c):
                return {CPU_RESOURCE: []}
            assigned = assigned | allocated
        if len(assigned) == requested:
            return {CPU_RESOURCE: self._hints(assigned, CPUSet(), requested)}
        reusable = self._reusable(state, info.uid) | assigned
        return {CPU_RESOURCE: self._hints(self.available_cpus(state), reusable, requested)}

    def cpu_hints(self, available: CPUSet, reusable: CPUSet, request: int) -> Hints:
        """The CPU hints for ``request`` CPUs that must include ``reusable`` and may add ``available`` (a resize
        keeps the CPUs a container holds: they are its reusable ones)."""
        return {CPU_RESOURCE: self._hints(available, reusable, request)}

    def aligned_cpus(self, numa: frozenset[int]) -> CPUSet:
        """The CPUs an affinity of these NUMA nodes allocates from first (``align-by-socket``: their sockets)."""
        return self._aligned_cpus(numa)

    def _hints(self, available: CPUSet, reusable: CPUSet, request: int) -> list[TopologyHint] | HintFamily | None:
        if len(self.topology.cpu_numa_nodes) > COMPACT_ABOVE_NUMA_NODES:
            # many NUMA nodes: the same hints as a family (no 2^N masks); the merge result is the same
            return cpu_hint_family(self.topology, available, reusable, request, self.options.align_by_socket)
        return generate_cpu_hints(self.topology, available, reusable, request, self.options.align_by_socket)

    # -- helpers --------------------------------------------------------------------------------------------
    @staticmethod
    def _requested(pod: PodInfo, c: ContainerInfo) -> int:
        """The container's exclusive CPU count; 0 for a pod numapin is told to leave alone."""
        return 0 if pod.bypass else guaranteed_cpus(pod, c)

    @staticmethod
    def _reusable(state: CPUState, pod_uid: str) -> CPUSet:
        return state.reuse if state.reuse_pod == pod_uid else CPUSet()

    @staticmethod
    def _update_reuse(state: CPUState, pod: PodInfo, c: ContainerInfo, cpus: CPUSet) -> None:
        """kubelet's updateCPUsToReuse: an init container's CPUs become reusable by the containers after it;
        an app or sidecar container's CPUs stop being reusable. Only the current pod is tracked (on the state,
        so a discarded working copy takes it along)."""
        if state.reuse_pod != pod.uid:
            state.reuse_pod = pod.uid
            state.reuse = CPUSet()
        if c.role == "init":
            state.reuse = state.reuse | cpus
        else:
            state.reuse = state.reuse - cpus


def _pod_info(pod: PodInfo | Mapping[str, Any]) -> PodInfo:
    return pod if isinstance(pod, PodInfo) else PodInfo.from_pod(pod)
