"""The CPU assignment state: the shared (default) pool and each container's CPUs, keyed like kubelet's."""

from __future__ import annotations

from dataclasses import dataclass, field

from .cpuset import CPUSet
from .modes import EXCLUSIVE, SHARE

__all__ = ["CPUState"]


@dataclass
class CPUState:
    """Mutable state the static policy works on (kubelet's ``state.State``).

    ``assignments[pod_uid][container_name]`` is the container's CPUs; ``default_cpuset`` the shared pool
    as kubelet defines it (CPUs assigned to nobody). ``modes`` keeps numapin's per-container mode
    (``exclusive`` or ``share``) for assigned containers; a container missing from it is ``exclusive``.
    ``pod_modes`` keeps the ``qos.gocrane.io/cpu-manager`` value a running pod was moved to after its creation
    (``none``, ``exclusive``, ``share``, or ``kubelet`` when the annotation was removed: kubelet's rule); it wins
    over what the pod's sandbox says (see ``allocator.mode_change``).

    ``reuse_pod``/``reuse`` are the static policy's init-container CPU reuse (kubelet's ``cpusToReuse``, for
    one pod at a time): working state that travels with each copy, so an admission rolled back (or a dry run)
    leaves none behind. It is not saved (kubelet does not checkpoint it either) and not compared.

    ``baselines[pod_uid][container_name]`` is the set a container was admitted with, kept only for a container
    whose CPUs a resize changed (``allocator.resize``) and only while it differs from its CPUs; a container
    missing from it has its CPUs as its baseline. Always a subset of the container's CPUs.
    """

    default_cpuset: CPUSet = field(default_factory=CPUSet)
    assignments: dict[str, dict[str, CPUSet]] = field(default_factory=dict)
    modes: dict[str, dict[str, str]] = field(default_factory=dict)
    pod_modes: dict[str, str] = field(default_factory=dict)
    baselines: dict[str, dict[str, CPUSet]] = field(default_factory=dict)
    reuse_pod: str | None = field(default=None, compare=False)
    reuse: CPUSet = field(default_factory=CPUSet, compare=False)

    def get(self, pod_uid: str, container: str) -> CPUSet | None:
        return self.assignments.get(pod_uid, {}).get(container)

    def set(self, pod_uid: str, container: str, cpus: CPUSet, mode: str = "exclusive") -> None:
        """Give the container ``cpus``; a recorded baseline keeps only those of them (it stays a subset)."""
        self.assignments.setdefault(pod_uid, {})[container] = cpus
        self.modes.setdefault(pod_uid, {})[container] = mode
        kept = self.baselines.get(pod_uid, {}).get(container)
        if kept is not None:
            self.set_baseline(pod_uid, container, kept & cpus)

    def delete(self, pod_uid: str, container: str) -> None:
        pod = self.assignments.get(pod_uid)
        if pod is not None:
            pod.pop(container, None)
            if not pod:
                del self.assignments[pod_uid]
        modes = self.modes.get(pod_uid)
        if modes is not None:
            modes.pop(container, None)
            if not modes:
                del self.modes[pod_uid]
        self.set_baseline(pod_uid, container, None)

    def baseline(self, pod_uid: str, container: str) -> CPUSet | None:
        """The CPUs the container was admitted with (its CPUs when no resize changed them); None without CPUs."""
        kept = self.baselines.get(pod_uid, {}).get(container)
        return kept if kept is not None else self.get(pod_uid, container)

    def set_baseline(self, pod_uid: str, container: str, cpus: CPUSet | None) -> None:
        """Record the container's baseline; None (or its own CPUs) forgets it (its CPUs are the baseline)."""
        if cpus is None or cpus == self.get(pod_uid, container):
            pod = self.baselines.get(pod_uid)
            if pod is not None:
                pod.pop(container, None)
                if not pod:
                    del self.baselines[pod_uid]
            return
        self.baselines.setdefault(pod_uid, {})[container] = cpus

    def mode(self, pod_uid: str, container: str) -> str:
        return self.modes.get(pod_uid, {}).get(container, EXCLUSIVE)

    def assigned_cpus(self) -> CPUSet:
        m = 0
        for pod in self.assignments.values():
            for cpus in pod.values():
                m |= cpus.mask
        return CPUSet.from_mask(m)

    def share_cpus(self) -> CPUSet:
        """CPUs pinned to ``share``-mode containers: they stay usable by shared-pool containers."""
        m = 0
        for uid, pod in self.assignments.items():
            for name, cpus in pod.items():
                if self.mode(uid, name) == SHARE:
                    m |= cpus.mask
        return CPUSet.from_mask(m)

    def shared_pool(self) -> CPUSet:
        """Where containers without their own CPUs run: the default set plus ``share``-mode CPUs."""
        return self.default_cpuset | self.share_cpus()

    def copy(self) -> CPUState:
        return CPUState(
            default_cpuset=self.default_cpuset,
            assignments={u: dict(p) for u, p in self.assignments.items()},
            modes={u: dict(p) for u, p in self.modes.items()},
            pod_modes=dict(self.pod_modes),
            baselines={u: dict(p) for u, p in self.baselines.items()},
            reuse_pod=self.reuse_pod,
            reuse=self.reuse,
        )
