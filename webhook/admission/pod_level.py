"""What ``/mutate`` tells the author of a pod with pod-level resources (``spec.resources``). By kubelet 1.36's static
CPU and Memory Manager policies with the ``PodLevelResourceManagers`` gate off (the default), none of its containers
gets CPUs or memory of its own, so a Guaranteed pod that asks for no numapin mode runs wholly on the shared pool, its
memory on every NUMA node. With the gate on (the webhook's ``--feature-gates``), only its containers Guaranteed on
their own with an integer CPU count get CPUs of their own. kubelet admits such a pod without a word; the warning says
it where the pod is written, when no container of the pod gets CPUs of its own."""

from __future__ import annotations

from allocator.modes import PINNED_MODES
from allocator.pod import CPU_MANAGER_ANNOTATION, PodInfo, guaranteed_cpus

__all__ = ["pod_level_warnings"]


def pod_level_warnings(pod: PodInfo) -> list[str]:
    """The warning for a Guaranteed pod with pod-level resources, no pinning mode and no container with CPUs of its
    own under the gate ``pod.pod_level_managers``; none for any other pod."""
    if not pod.pod_level_resources or pod.qos_class != "Guaranteed" or pod.cpu_manager in PINNED_MODES:
        return []
    if any(guaranteed_cpus(pod, c) for c in pod.containers):
        return []
    if pod.pod_level_managers:
        return [f"numapin: pod {pod.ref} sets pod-level resources (spec.resources): with kubelet's "
                "PodLevelResourceManagers gate (Kubernetes 1.36 alpha), only a container whose own CPU and memory "
                "requests equal its limits, with an integer CPU count, gets CPUs of its own; no container of this "
                "pod does, all run on the shared pool"]
    return [f"numapin: pod {pod.ref} sets pod-level resources (spec.resources): as kubelet's static CPU and Memory "
            "Manager policies (Kubernetes 1.36, PodLevelResourceManagers off), no container of it gets CPUs of its "
            "own, all run on the shared pool with memory on every NUMA node; set integer CPU requests equal to "
            f"limits per container instead of spec.resources, or annotate {CPU_MANAGER_ANNOTATION}: exclusive to pin "
            "the containers whose own CPU limit is an integer equal to their request"]
