"""Pod-level resources (``spec.resources``: KEP-2837, beta and on by default in Kubernetes 1.34) as kubelet reads
them for its CPU manager.

A pod has pod-level resources when ``spec.resources`` requests or limits a resource kubelet supports there (``cpu``,
``memory``, ``hugepages-*``). Then, in kubelet 1.34's static CPU manager policy, no container of the pod gets CPUs of
its own: hint generation and allocation are skipped for the whole pod ("pod is using pod-level resources which are
not supported by the static CPU manager policy"); the memory manager's static policy skips it too. The pod is
admitted all the same and every container runs on the shared pool. The pod's QoS class comes from the pod-level
values instead of the containers': Guaranteed when pod-level CPU and memory limits are both set and every pod-level
request equals its limit (API defaulting: a pod-level request not given is the containers' aggregated request of
that resource, else the pod-level limit).

Only the values are read here; ``allocator.pod`` builds the model from them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import PodSpecError
from .quantity import cpu_milli, memory_bytes

__all__ = ["PodLevelResources", "aggregate_request", "pod_level_resources"]


@dataclass(frozen=True, slots=True)
class PodLevelResources:
    """The pod-level CPU (milli-CPUs) and memory (bytes) requests and limits, after API defaulting; None: not set."""

    cpu_request_milli: int | None
    cpu_limit_milli: int | None
    memory_request: int | None
    memory_limit: int | None


def _supported(resource: str) -> bool:
    return resource in ("cpu", "memory") or resource.startswith("hugepages-")


def aggregate_request(values: Sequence[tuple[str, int | None]]) -> int | None:
    """kubelet's aggregate of the containers' requests of one resource, from ``(role, request)`` in spec order
    (init containers first): max(largest init container + the sidecars before it, app containers + every sidecar);
    None when no container requests it."""
    if all(v is None for _, v in values):
        return None
    by_init = sidecars = apps = 0
    for role, v in values:
        n = v or 0
        if role == "sidecar":
            sidecars += n
        elif role == "init":
            by_init = max(by_init, sidecars + n)
        else:
            apps += n
    return max(by_init, apps + sidecars)


def pod_level_resources(resources: Any, containers: Sequence[tuple[str, int | None, int | None]],
                        field: str = "spec.resources") -> PodLevelResources | None:
    """The pod-level resources of ``spec.resources`` (None when the pod has none kubelet supports), given the
    containers' ``(role, cpu request, memory request)``. Raises PodSpecError naming a bad field."""
    if resources is None:
        return None
    if not isinstance(resources, Mapping):
        raise PodSpecError(f"{field} must be a mapping")
    kinds: dict[str, Mapping[str, Any]] = {}
    for key in ("requests", "limits"):
        value = resources.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise PodSpecError(f"{field}.{key} must be a mapping")
        kinds[key] = value or {}
    if not any(_supported(str(r)) for kind in kinds.values() for r in kind):
        return None

    def get(key: str, res: str) -> int | None:
        if kinds[key].get(res) is None:
            return None
        f = f"{field}.{key}.{res}"
        return cpu_milli(kinds[key][res], field=f) if res == "cpu" else memory_bytes(kinds[key][res], field=f)

    cpu_lim, mem_lim = get("limits", "cpu"), get("limits", "memory")
    cpu_req, mem_req = get("requests", "cpu"), get("requests", "memory")
    if kinds["limits"]:  # API defaulting, only where pod-level limits are given
        if cpu_req is None:
            cpu_req = aggregate_request([(r, cpu) for r, cpu, _ in containers])
            cpu_req = cpu_lim if cpu_req is None else cpu_req
        if mem_req is None:
            mem_req = aggregate_request([(r, mem) for r, _, mem in containers])
            mem_req = mem_lim if mem_req is None else mem_req
    return PodLevelResources(cpu_req, cpu_lim, mem_req, mem_lim)
