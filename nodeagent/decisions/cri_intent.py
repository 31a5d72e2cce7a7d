"""A pod's CPU intent as the proxy sees it on ``CreateContainer``.

The webhook's ``numapin.io/cpu-intent`` annotation (allocator.intent) is authoritative when present. Without
it, numapin estimates what kubelet knew from what CRI carries: the QoS class from the sandbox's cgroup
parent, the container's CPU request from ``cpu_shares`` and its limit from ``cpu_quota``/``cpu_period``,
the memory limit from ``memory_limit_in_bytes``, huge pages from ``hugepage_limits``. Containers of the pod
seen earlier are kept, so the pod model grows as kubelet creates them (CRI never shows the whole pod at once);
which of them are init containers is learned from the order kubelet creates them (nodeagent.decisions.pod_roles).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, decode_intent
from allocator.memory.resources import hugepage_resource
from allocator.pod import (
    CPU_MANAGER_ANNOTATION,
    ContainerInfo,
    PodInfo,
    QOSClass,
    is_bypassed,
    normalize_cpu_manager,
)
from nodeagent.decisions.pod_roles import PodRoles
from nodeagent.node.cfs import quota_to_milli_cpu, shares_to_milli_cpu
from protos import cri_pb2

__all__ = ["PodIdentity", "SelfPod", "container_from_cri", "hugepages_from_cri", "identity_of", "pod_from_cri",
           "qos_from_cgroup_parent"]

log = logging.getLogger("numapin.criproxy")

_SYSTEMD_QOS = re.compile(r"kubepods(?:-(burstable|besteffort))?(?:-pod[^/]*)?\.slice$")


@dataclass(frozen=True)
class PodIdentity:
    uid: str
    namespace: str
    name: str
    annotations: Mapping[str, str]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def bypass(self) -> bool:
        return is_bypassed(self.annotations)


@dataclass(frozen=True)
class SelfPod:
    """The proxy's own pod, which it passes through untouched, known by namespace and name, uid, or both."""

    namespace_name: tuple[str, str] | None = None
    uid: str | None = None

    def matches(self, uid: str, namespace: str, name: str) -> bool:
        return bool(self.uid and uid == self.uid) or (self.namespace_name is not None
                                                      and (namespace, name) == self.namespace_name)



def identity_of(sandbox: cri_pb2.PodSandboxConfig) -> PodIdentity:
    md = sandbox.metadata
    return PodIdentity(md.uid, md.namespace, md.name, dict(sandbox.annotations))


def qos_from_cgroup_parent(cgroup_parent: str) -> QOSClass | None:
    """kubelet's QoS class from a pod cgroup parent (cgroupfs ``/kubepods/burstable/pod<uid>`` or systemd
    ``kubepods-burstable-pod<uid>.slice``); None when the path is not a kubelet pod cgroup."""
    parts = [p for p in cgroup_parent.split("/") if p]
    if not parts:
        return None
    if "kubepods" in parts:  # cgroupfs driver
        rest = parts[parts.index("kubepods") + 1:]
        if rest and rest[0] == "burstable":
            return "Burstable"
        if rest and rest[0] == "besteffort":
            return "BestEffort"
        return "Guaranteed"
    for p in reversed(parts):  # systemd driver: the innermost kubepods slice names the class
        m = _SYSTEMD_QOS.search(p)
        if m:
            return {"burstable": "Burstable", "besteffort": "BestEffort"}.get(m.group(1) or "", "Guaranteed")  # type: ignore[return-value]
    return None


def container_from_cri(name: str, resources: cri_pb2.LinuxContainerResources, qos: QOSClass) -> ContainerInfo:
    """Request and limit recovered from CFS values (a Guaranteed container's request is its limit)."""
    limit = quota_to_milli_cpu(resources.cpu_quota, resources.cpu_period or 100000)
    if qos == "Guaranteed" and limit is not None:
        request: int | None = limit
    elif qos == "BestEffort":
        request = None
    else:
        request = shares_to_milli_cpu(resources.cpu_shares) or None
    mem = resources.memory_limit_in_bytes or None
    return ContainerInfo(name=name, role="app", cpu_request_milli=request, cpu_limit_milli=limit,
                         memory_request=mem if qos == "Guaranteed" else None, memory_limit=mem,
                         hugepages=hugepages_from_cri(resources))


_PAGE_UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "PB": 1 << 50}


def hugepages_from_cri(resources: cri_pb2.LinuxContainerResources) -> tuple[tuple[str, int], ...]:
    """The container's huge pages from CRI's ``hugepage_limits`` (kubelet lists every size of the node, ``2MB``,
    ``1GB``, with the bytes the container may use, 0 for sizes it does not ask): ``(hugepages-<size>, bytes)``
    for the sizes it asks, as requests equal limits for huge pages. Sizes numapin cannot read are skipped."""
    out: dict[str, int] = {}
    for h in resources.hugepage_limits:
        number, unit = h.page_size[:-2], h.page_size[-2:].upper()
        if not h.limit or unit not in _PAGE_UNITS or not number.isdigit() or int(number) <= 0:
            continue
        out[hugepage_resource(int(number) * _PAGE_UNITS[unit])] = h.limit
    return tuple(sorted(out.items()))


def pod_from_cri(req: cri_pb2.CreateContainerRequest,
                 known: Mapping[str, cri_pb2.LinuxContainerResources] | None = None,
                 roles: PodRoles | None = None) -> PodInfo:
    """The pod model for ``req``: from the intent annotation if present (PodSpecError if it is bad), else
    from CRI: ``known`` (the resources kubelet asked for each earlier container of the pod, by name) plus this
    container, with the roles ``roles`` learned (nodeagent.decisions.pod_roles; unknown: app).

    Init containers come first (their CPUs pass to the containers after them, as kubelet's CPU manager does),
    then sidecars and app containers in the order they were first created, then this container."""
    ident = identity_of(req.sandbox_config)
    name = req.config.metadata.name
    intent = ident.annotations.get(INTENT_ANNOTATION)
    if intent is not None:
        pod = decode_intent(intent, uid=ident.uid, namespace=ident.namespace, name=ident.name,
                            annotations=ident.annotations)
        if not pod.has_container(name):
            raise PodSpecError(f"annotation {INTENT_ANNOTATION} of pod {ident.ref} does not list container {name!r}")
        return pod
    qos = qos_from_cgroup_parent(req.sandbox_config.linux.cgroup_parent) or "BestEffort"
    raw_mode = ident.annotations.get(CPU_MANAGER_ANNOTATION)
    mode = None if raw_mode is None else normalize_cpu_manager(raw_mode)
    roles = roles or PodRoles()
    order = {n: i for i, n in enumerate(roles.order)}
    earlier = sorted((n for n in (known or {}) if n != name), key=lambda n: order.get(n, len(order)))
    containers = [replace(container_from_cri(n, (known or {})[n], qos), role=roles.role(n)) for n in earlier]
    containers.sort(key=lambda c: c.role != "init")  # stable: init containers first, each group in order
    this = replace(container_from_cri(name, req.config.linux.resources, qos), role=roles.role(name))
    return PodInfo(uid=ident.uid, namespace=ident.namespace, name=ident.name, qos_class=qos, cpu_manager=mode,
                   bypass=ident.bypass, containers=(*containers, this))
