"""What ``/mutate`` tells the author of a pod with pod-level resources (``spec.resources``): by kubelet 1.34's static
CPU manager policy none of its containers gets CPUs of its own, so a Guaranteed pod that asks for no numapin mode
runs wholly on the shared pool. kubelet admits such a pod without a word; the warning says it where the pod is
written."""

from __future__ import annotations

from allocator.modes import PINNED_MODES
from allocator.pod import CPU_MANAGER_ANNOTATION, PodInfo

__all__ = ["pod_level_warnings"]


def pod_level_warnings(pod: PodInfo) -> list[str]:
    """The warning for a Guaranteed pod with pod-level resources and no pinning mode; none for any other pod."""
    if not pod.pod_level_resources or pod.qos_class != "Guaranteed" or pod.cpu_manager in PINNED_MODES:
        return []
    return [f"numapin: pod {pod.ref} sets pod-level resources (spec.resources): as kubelet's static CPU manager "
            "policy (Kubernetes 1.34), no container of it gets CPUs of its own, all run on the shared pool; set "
            f"integer CPU requests equal to limits per container instead of spec.resources, or annotate "
            f"{CPU_MANAGER_ANNOTATION}: exclusive to pin the containers whose own CPU limit is an integer equal to "
            "their request"]
