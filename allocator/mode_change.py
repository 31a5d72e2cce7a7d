"""Changing a running pod's CPU mode (``qos.gocrane.io/cpu-manager``) without restarting it.

Crane's "revise cpuset when pod running": a pod moves between ``none``, ``exclusive``, ``share`` and kubelet's rule
(the annotation removed, named ``kubelet`` here). The transition is decided like an admission and is transactional:

- the pod's containers that keep CPUs of their own under the new mode keep the same CPUs (``exclusive`` <-> ``share``
  only changes whether those CPUs stay in the shared pool);
- containers that no longer get CPUs of their own give them back to the shared pool;
- containers that now get CPUs of their own are admitted by the topology manager (policy, scope, options) and the
  static policy, as at creation, on the state after the releases above. A refusal carries kubelet's reason
  (``TopologyAffinityError``, ``SMTAlignmentError``, ``UnexpectedAdmissionError``) and changes nothing.

Init containers have completed in a running pod: only its sidecar and app containers are admitted; an init
container still holding CPUs keeps them when the new mode still pins it and gives them back otherwise. Devices
are not known for a running pod, so only the CPU and memory providers give hints. With kubelet's Memory Manager
emulated (allocator.memory, ``memoryManagerPolicy: Static``), memory follows the same rules: a container the new
mode no longer manages (a Crane-pinned container of a pod that is not Guaranteed moving to ``none``) gives its
memory back, a container it starts managing is placed by the memory provider in the same merge, the others keep
their blocks.

The new mode is kept in ``CPUState.pod_modes`` (persisted in the checkpoint): it wins over the mode the pod's
sandbox was created with, so a container of the pod that restarts gets the new mode too (``with_pod_mode``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Final, Literal

from .cpuset import CPUSet
from .errors import PodSpecError
from .memory.provider import MemoryProvider
from .memory_hints import MemoryHintProvider
from .modes import CPU_MANAGER_VALUES, ContainerMode, CPUManagerAnnotation
from .pod import (
    CPU_MANAGER_ANNOTATION,
    PodInfo,
    container_mode,
    guaranteed_cpus,
    pod_guaranteed_cpus,
)
from .state import CPUState

if TYPE_CHECKING:
    from .static_policy import StaticPolicy
    from .topology_manager import HintProvider, TopologyManager

__all__ = [
    "KUBELET_RULE",
    "TARGET_MODES",
    "ContainerMove",
    "ModeChange",
    "mode_name",
    "parse_target",
    "plan_mode_change",
    "with_pod_mode",
]

KUBELET_RULE: Final = "kubelet"
TARGET_MODES = (*CPU_MANAGER_VALUES, KUBELET_RULE)
TargetMode = Literal["none", "exclusive", "share", "kubelet"]
_KUBELET_ALIASES = ("", KUBELET_RULE, "default")


def parse_target(value: str | None) -> TargetMode:
    """A transition's target: ``none``, ``exclusive``, ``share``, or ``kubelet`` (also None, ``""`` and
    ``default``: the annotation removed). Trimmed and lowercased; PodSpecError for anything else."""
    v = "" if value is None else value.strip().lower() if isinstance(value, str) else value
    if v in _KUBELET_ALIASES:
        return KUBELET_RULE
    if v not in CPU_MANAGER_VALUES:
        raise PodSpecError(
            f"{CPU_MANAGER_ANNOTATION}={value!r} is not a mode: allowed values are {', '.join(CPU_MANAGER_VALUES)}, "
            f"or {KUBELET_RULE} (the annotation removed: kubelet's rule)"
        )
    return v


def mode_name(cpu_manager: str | None) -> TargetMode:
    """The pod-level mode name of a ``PodInfo.cpu_manager`` value (None: ``kubelet``)."""
    return KUBELET_RULE if cpu_manager is None else cpu_manager  # type: ignore[return-value]


def with_pod_mode(pod: PodInfo, state: CPUState) -> PodInfo:
    """``pod`` with the mode a transition gave it (``state.pod_modes``), if any."""
    target = state.pod_modes.get(pod.uid)
    if target is None:
        return pod
    cpu_manager = None if target == KUBELET_RULE else target
    return pod if pod.cpu_manager == cpu_manager else replace(pod, cpu_manager=cpu_manager)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ContainerMove:
    """One container of the pod: its mode and own CPUs (None: the shared pool) before and after."""

    name: str
    old_mode: ContainerMode
    new_mode: ContainerMode
    old_cpus: CPUSet | None
    new_cpus: CPUSet | None

    @property
    def moved(self) -> bool:
        return (self.old_mode, self.old_cpus) != (self.new_mode, self.new_cpus)


@dataclass(frozen=True)
class ModeChange:
    """The outcome of a transition (admitted or refused); ``moves`` lists every container with CPUs or a spec."""

    uid: str
    ref: str
    old: TargetMode
    new: TargetMode
    admitted: bool
    reason: str | None
    message: str
    moves: tuple[ContainerMove, ...] = ()

    @property
    def changed(self) -> bool:
        return self.admitted and (self.old != self.new or any(m.moved for m in self.moves))

    @property
    def narrows_pool(self) -> bool:
        """CPUs leave the shared pool: the shared containers must be narrowed before the pod's containers move."""
        return any(m.new_mode == "exclusive" and m.old_mode != "exclusive" for m in self.moves)

    def move(self, name: str) -> ContainerMove | None:
        return next((m for m in self.moves if m.name == name), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "pod": self.ref, "uid": self.uid, "from": self.old, "to": self.new, "admitted": self.admitted,
            "reason": self.reason, "message": self.message,
            "containers": [{"name": m.name, "from": m.old_mode, "to": m.new_mode,
                            "cpusBefore": None if m.old_cpus is None else str(m.old_cpus),
                            "cpusAfter": None if m.new_cpus is None else str(m.new_cpus)} for m in self.moves],
        }


def plan_mode_change(
    state: CPUState,
    policy: StaticPolicy,
    topology_manager: TopologyManager,
    pod: PodInfo,
    target: str | None,
    memory: MemoryProvider | None = None,
) -> tuple[ModeChange, CPUState | None]:
    """Decide moving ``pod`` (its model as created; a previous transition is applied first) to ``target``.

    Returns the outcome and, when admitted, the new state (``state`` itself is never changed). ``memory``: the
    Memory Manager bound to a working copy of its state, which this changes (the caller keeps the copy only when
    the transition is admitted). Raises PodSpecError for a target that is not a mode. CPU-bound: the proxy calls
    it in a worker thread.
    """
    new = parse_target(target)
    current = with_pod_mode(pod, state)
    old = mode_name(current.cpu_manager)
    if current.bypass:
        return ModeChange(pod.uid, pod.ref, old, new, False, "Bypassed",
                          f"pod {pod.ref} is annotated numapin.io/bypass=true: numapin leaves its CPUs alone"), None
    target_mode: CPUManagerAnnotation | None = None if new == KUBELET_RULE else new
    moved = replace(current, cpu_manager=target_mode)
    running = replace(moved, containers=tuple(c for c in moved.containers if c.role != "init"))
    uid = pod.uid
    work = state.copy()
    before = {name: (cpus, work.mode(uid, name)) for name, cpus in work.assignments.get(uid, {}).items()}
    for name, (cpus, _) in before.items():
        c = next((x for x in moved.containers if x.name == name), None)
        n = guaranteed_cpus(moved, c) if c is not None else 0
        if c is not None and n > 0 and (c.role == "init" or n == len(cpus)):
            work.set(uid, name, cpus, container_mode(moved, c))
        else:
            policy.remove(work, uid, name)
    mem_provider: HintProvider = MemoryHintProvider()
    mem_saved: tuple[str | None, dict[int, dict[str, int]]] | None = None
    if memory is not None:
        mem_provider = memory
        for name in sorted(memory.state.assignments.get(uid, {})):
            c = next((x for x in moved.containers if x.name == name), None)
            if c is None or not memory.policy.requested(moved, c):
                memory.policy.remove(memory.state, uid, name)
        mem_saved = (memory.state.reuse_pod, memory.state.reuse)
    saved_reuse = (work.reuse_pod, work.reuse)
    try:
        result = topology_manager.admit(work, running, [policy, mem_provider])
    finally:
        work.reuse_pod, work.reuse = saved_reuse  # a transition is no step of another pod's admission
        if memory is not None and mem_saved is not None:
            memory.state.reuse_pod, memory.state.reuse = mem_saved
    if not result.admitted:
        free = work.default_cpuset - CPUSet(policy.reserved)
        per_numa = ", ".join(f"{n}: {len(free & policy.topology.cpus_in_numa(n))}"
                             for n in policy.topology.numa_nodes)
        who = result.failed_container
        asked = guaranteed_cpus(moved, moved.container(who)) if who else pod_guaranteed_cpus(running)
        message = (f"{result.message} (pod {pod.ref}: mode {old} -> {new} refused by topology manager policy "
                   f"{topology_manager.policy.name}, scope {topology_manager.scope.name}; {asked} CPU(s) of its own "
                   f"asked; free CPUs per NUMA node {{{per_numa}}}; the pod keeps running as it was)")
        return ModeChange(uid, pod.ref, old, new, False, result.reason, message,
                          _moves(current, state, state, uid)), None
    work.pod_modes[uid] = new
    return ModeChange(uid, pod.ref, old, new, True, None, f"pod {pod.ref}: mode {old} -> {new}",
                      _moves(current, state, work, uid)), work


def _moves(current: PodInfo, before: CPUState, after: CPUState, uid: str) -> tuple[ContainerMove, ...]:
    names = [c.name for c in current.containers]
    names += sorted(set(before.assignments.get(uid, {})) - set(names))
    out = []
    for name in names:
        old_cpus, new_cpus = before.get(uid, name), after.get(uid, name)
        old_mode: ContainerMode = before.mode(uid, name) if old_cpus is not None else "shared"  # type: ignore
        new_mode: ContainerMode = after.mode(uid, name) if new_cpus is not None else "shared"  # type: ignore
        out.append(ContainerMove(name, old_mode, new_mode, old_cpus, new_cpus))
    return tuple(out)
