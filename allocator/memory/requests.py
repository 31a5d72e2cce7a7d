"""What the Memory Manager accounts for a container or a pod: bytes of ``memory`` and of each huge-page size.

kubelet's rule: only Guaranteed pods are managed, each container for its ``memory`` request and every
``hugepages-<size>`` it asks for. A pod with pod-level resources (``spec.resources``) is not managed with kubelet's
``PodLevelResourceManagers`` gate off (kubelet 1.36: "pod is using pod-level resources which are not supported by
the static Memory manager policy"); with it on, only its containers Guaranteed on their own
(``allocator.pod.equivalent_guaranteed``) are. numapin adds Crane's modes: a container pinned by
``qos.gocrane.io/cpu-manager`` ``exclusive`` or ``share`` in a pod kubelet's rule leaves alone is managed too, for
its memory *limit* (the most it may use; a container without a memory limit is not managed) and its huge pages.
A bypassed pod is never managed.

The pod-level amount (pod scope) is kubelet's: per resource, max(largest regular init container + the sidecars
declared before it, app containers + all sidecars).
"""

from __future__ import annotations

from ..modes import PINNED_MODES
from ..pod import ContainerInfo, PodInfo, equivalent_guaranteed, guaranteed_cpus
from .resources import MEMORY, resource_order

__all__ = ["Requests", "container_requests", "pod_requests"]

Requests = dict[str, int]


def _ordered(req: Requests) -> Requests:
    return {r: req[r] for r in sorted(req, key=resource_order)}


def container_requests(pod: PodInfo, c: ContainerInfo) -> Requests:
    """Bytes per memory resource the container is given (empty: the Memory Manager leaves it alone)."""
    if pod.bypass:
        return {}
    out: Requests = {}
    kubelets = pod.qos_class == "Guaranteed" and (
        not pod.pod_level_resources or (pod.pod_level_managers and equivalent_guaranteed(c)))
    if kubelets:
        if c.memory_request is not None:
            out[MEMORY] = c.memory_request
    elif pod.cpu_manager in PINNED_MODES and guaranteed_cpus(pod, c) > 0 and c.memory_limit is not None:
        out[MEMORY] = c.memory_limit
    else:
        return {}
    for name, size in c.hugepages:
        out[name] = size
    return _ordered(out)


def pod_requests(pod: PodInfo) -> Requests:
    """kubelet's pod-level amounts (getPodRequestedResources) over the managed containers."""
    by_init: Requests = {}
    by_sidecars: Requests = {}
    for c in pod.init_containers:
        for r, q in container_requests(pod, c).items():
            by_init.setdefault(r, 0)
            if c.role == "sidecar":
                by_sidecars[r] = by_sidecars.get(r, 0) + q
            elif by_sidecars.get(r, 0) + q > by_init[r]:
                by_init[r] = by_sidecars.get(r, 0) + q
    by_apps: Requests = {}
    for c in pod.app_containers:
        for r, q in container_requests(pod, c).items():
            by_apps[r] = by_apps.get(r, 0) + q
    out: Requests = {}
    for r, q in by_apps.items():  # kubelet iterates the app containers' resources only
        out[r] = max(q + by_sidecars.get(r, 0), by_init.get(r, 0))
    return _ordered(out)
