"""The pod model the allocator decides on: containers with their CPU and memory requests, QoS class, and
who gets CPUs of its own.

Eligibility follows kubelet by default (Guaranteed pod, integer CPU request). The pod annotation
``qos.gocrane.io/cpu-manager`` (Crane's advanced CPU manager) overrides it: ``none`` never pins;
``exclusive`` and ``share`` pin a container whose own CPU limit is an integer >= 1 equal to its request,
whatever the pod's QoS class. ``share`` CPUs stay usable by the shared pool.

A pod with pod-level resources (``spec.resources``, ``allocator.pod_level``) follows kubelet 1.36: its QoS class
comes from the pod-level values and, with the ``PodLevelResourceManagers`` gate off (the default), no container of it
gets CPUs (nor memory, ``allocator.memory.requests``) of its own. With the gate on (``pod_level_managers``, stamped by
the node from its configuration) a container of such a Guaranteed pod qualifies when it is Guaranteed on its own
(kubelet's IsContainerEquivalentQOSGuaranteed: CPU and memory requests set, non-zero and equal to the limits) and
asks an integer CPU count. The annotation's modes still judge each container by its own CPU request and limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .errors import PodSpecError
from .modes import (
    CPU_MANAGER_VALUES,
    EXCLUSIVE,
    PINNED_MODES,
    SHARE,
    SHARED_POOL,
    ContainerMode,
    CPUManagerAnnotation,
)
from .pod_level import pod_level_resources
from .quantity import cpu_milli, memory_bytes

__all__ = [
    "BYPASS_ANNOTATION",
    "CPU_MANAGER_ANNOTATION",
    "CPU_MANAGER_VALUES",
    "ContainerInfo",
    "PodInfo",
    "container_mode",
    "equivalent_guaranteed",
    "guaranteed_cpus",
    "is_bypassed",
    "normalize_cpu_manager",
    "pod_guaranteed_cpus",
    "qos_class",
    "read_containers",
]

CPU_MANAGER_ANNOTATION = "qos.gocrane.io/cpu-manager"
BYPASS_ANNOTATION = "numapin.io/bypass"


def is_bypassed(annotations: Mapping[str, str]) -> bool:
    """The pod asks numapin to leave it alone (``numapin.io/bypass: "true"``, any case, spaces trimmed)."""
    return annotations.get(BYPASS_ANNOTATION, "").strip().lower() == "true"

Role = Literal["init", "sidecar", "app"]
QOSClass = Literal["Guaranteed", "Burstable", "BestEffort"]
CPUManagerMode = CPUManagerAnnotation  # the annotation's value (allocator.modes)


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """One container's resources. ``None`` means the request or limit is not set."""

    name: str
    role: Role = "app"
    cpu_request_milli: int | None = None
    cpu_limit_milli: int | None = None
    memory_request: int | None = None
    memory_limit: int | None = None
    # huge pages asked for, as (resource name, bytes) sorted by name (``hugepages-2Mi``); requests equal limits
    hugepages: tuple[tuple[str, int], ...] = ()

    @property
    def is_init(self) -> bool:
        return self.role != "app"


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    qos_class: QOSClass
    cpu_manager: CPUManagerMode | None
    bypass: bool
    containers: tuple[ContainerInfo, ...]
    pod_level_resources: bool = False  # spec.resources sets CPU, memory or hugepages (kubelet's IsPodLevelResourcesSet)
    pod_level_managers: bool = False  # the node's PodLevelResourceManagers gate (stamped by the node, not read)

    @property
    def init_containers(self) -> tuple[ContainerInfo, ...]:
        return tuple(c for c in self.containers if c.role != "app")

    @property
    def app_containers(self) -> tuple[ContainerInfo, ...]:
        return tuple(c for c in self.containers if c.role == "app")

    def container(self, name: str) -> ContainerInfo:
        for c in self.containers:
            if c.name == name:
                return c
        raise PodSpecError(f"pod {self.namespace}/{self.name} has no container {name!r}")

    def has_container(self, name: str) -> bool:
        return any(c.name == name for c in self.containers)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any], *,
                 containers_of: Callable[[Mapping[str, Any]], tuple[ContainerInfo, ...]] | None = None) -> PodInfo:
        """Read a Kubernetes v1 Pod (as a dict). Raises PodSpecError naming the bad field. ``containers_of``: what
        reads the spec's containers (``read_containers``, or a caller's memo of it)."""
        if not isinstance(pod, Mapping):
            raise PodSpecError("pod must be a mapping (a v1 Pod object)")
        meta = _mapping(pod.get("metadata"), "metadata")
        spec = _mapping(pod.get("spec"), "spec")
        annotations = _mapping(meta.get("annotations"), "metadata.annotations")
        for k, v in annotations.items():
            if not isinstance(v, str):
                raise PodSpecError(f"metadata.annotations[{k!r}] must be a string")
        containers = (containers_of or read_containers)(spec)
        level = pod_level_resources(spec.get("resources"),
                                    [(c.role, c.cpu_request_milli, c.memory_request) for c in containers])
        status = pod.get("status")
        status_qos = status.get("qosClass") if isinstance(status, Mapping) else None
        if status_qos in ("Guaranteed", "Burstable", "BestEffort"):
            qos = status_qos
        elif level is not None:  # the pod-level values alone, as one container
            qos = qos_class([ContainerInfo("pod", "app", level.cpu_request_milli, level.cpu_limit_milli,
                                           level.memory_request, level.memory_limit)])
        else:
            qos = qos_class(containers)
        raw_mode = annotations.get(CPU_MANAGER_ANNOTATION)
        mode = None if raw_mode is None else normalize_cpu_manager(raw_mode)
        uid, namespace, name = (_string(meta.get(k), f"metadata.{k}") for k in ("uid", "namespace", "name"))
        if not name:
            name = _string(meta.get("generateName"), "metadata.generateName")
        return cls(
            uid=uid,
            namespace=namespace,
            name=name,
            qos_class=qos,
            cpu_manager=mode,
            bypass=is_bypassed(annotations),
            containers=containers,
            pod_level_resources=level is not None,
        )


def read_containers(spec: Mapping[str, Any]) -> tuple[ContainerInfo, ...]:
    """The init containers (and native sidecars) then the app containers of a pod's ``spec``, read by the pod
    model's rules: a pure function of the two lists. Raises PodSpecError naming the bad field."""
    containers: list[ContainerInfo] = []
    names: set[str] = set()
    for key, default_role in (("initContainers", "init"), ("containers", "app")):
        items = spec.get(key) or []
        if not isinstance(items, list):
            raise PodSpecError(f"spec.{key} must be a list")
        for i, item in enumerate(items):
            c = _container(item, f"spec.{key}[{i}]", default_role)
            if c.name in names:
                raise PodSpecError(f"spec.{key}[{i}].name: duplicate container name {c.name!r}")
            names.add(c.name)
            containers.append(c)
    if not any(c.role == "app" for c in containers):
        raise PodSpecError("spec.containers must list at least one container")
    return tuple(containers)


def normalize_cpu_manager(value: str) -> CPUManagerMode:
    """Trim and lowercase a ``qos.gocrane.io/cpu-manager`` value; PodSpecError for anything but the three values."""
    v = value.strip().lower() if isinstance(value, str) else value
    if v not in CPU_MANAGER_VALUES:
        raise PodSpecError(
            f"annotation {CPU_MANAGER_ANNOTATION}={value!r} is not valid: allowed values are "
            + ", ".join(CPU_MANAGER_VALUES)
        )
    return v


def qos_class(containers: tuple[ContainerInfo, ...] | list[ContainerInfo]) -> QOSClass:
    """kubelet's QoS class from CPU and memory requests and limits of every container (init ones included)."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    for c in containers:
        for res, req, lim in (
            ("cpu", c.cpu_request_milli, c.cpu_limit_milli),
            ("memory", c.memory_request, c.memory_limit),
        ):
            if req:
                requests[res] = requests.get(res, 0) + req
            if lim:
                limits[res] = limits.get(res, 0) + lim
        if not (c.cpu_limit_milli and c.memory_limit):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and all(limits.get(r) == v for r, v in requests.items()) and len(requests) == len(limits):
        return "Guaranteed"
    return "Burstable"


def guaranteed_cpus(pod: PodInfo, c: ContainerInfo) -> int:
    """How many CPUs of its own the container gets (0: it runs on the shared pool)."""
    if pod.cpu_manager == "none":
        return 0
    req = c.cpu_request_milli
    if pod.cpu_manager in PINNED_MODES:
        lim = c.cpu_limit_milli
        if req is None or lim is None or req != lim or req < 1000 or req % 1000:
            return 0
        return req // 1000
    if pod.qos_class != "Guaranteed" or not req or req % 1000:
        return 0
    if pod.pod_level_resources and not (pod.pod_level_managers and equivalent_guaranteed(c)):
        return 0
    return req // 1000


def equivalent_guaranteed(c: ContainerInfo) -> bool:
    """kubelet's IsContainerEquivalentQOSGuaranteed: CPU and memory requests non-zero and equal to their limits."""
    return bool(c.cpu_request_milli) and c.cpu_request_milli == c.cpu_limit_milli \
        and bool(c.memory_request) and c.memory_request == c.memory_limit


def container_mode(pod: PodInfo, c: ContainerInfo) -> ContainerMode:
    """``shared`` (the pool) without CPUs of its own, else ``share`` or ``exclusive`` as the pod asks."""
    if guaranteed_cpus(pod, c) == 0:
        return SHARED_POOL
    return SHARE if pod.cpu_manager == SHARE else EXCLUSIVE


def pod_guaranteed_cpus(pod: PodInfo) -> int:
    """kubelet's pod-level count: max(largest init container + sidecars before it, app containers + all sidecars)."""
    by_init = 0
    by_sidecars = 0
    for c in pod.init_containers:
        if c.cpu_request_milli is None:
            continue
        n = guaranteed_cpus(pod, c)
        if c.role == "sidecar":
            by_sidecars += n
        elif by_sidecars + n > by_init:
            by_init = by_sidecars + n
    by_apps = sum(guaranteed_cpus(pod, c) for c in pod.app_containers if c.cpu_request_milli is not None)
    return max(by_init, by_apps + by_sidecars)


# -- parsing helpers ------------------------------------------------------------------


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if type(value) is not dict and not isinstance(value, Mapping):
        raise PodSpecError(f"{field} must be a mapping")
    return value


def _member(parent: Mapping[str, Any], key: str, field: str, *between: str) -> Mapping[str, Any]:
    """``parent[key]`` as a mapping (empty when absent or null); the message names ``field.<between>.key``."""
    value = parent.get(key)
    if value is None:
        return {}
    if type(value) is dict or isinstance(value, Mapping):
        return value
    raise PodSpecError(f"{'.'.join((field, *between, key))} must be a mapping")


def _quantity(kind: Mapping[str, Any], key: str, res: str, field: str) -> int | None:
    """The CPU (milli-CPUs) or memory (bytes) quantity ``kind[res]``, None when absent or null."""
    value = kind.get(res)
    if value is None:
        return None
    parse = cpu_milli if res == "cpu" else memory_bytes
    try:
        return parse(value)
    except PodSpecError:  # again, with the field named in the message
        return parse(value, field=f"{field}.resources.{key}.{res}")


def _string(value: object, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PodSpecError(f"{field} must be a string")
    return value


def _container(item: object, field: str, default_role: str) -> ContainerInfo:
    # perf (issue 37): the field names of the messages are built only when a value is wrong
    c = _mapping(item, field)
    name = c.get("name")
    if not isinstance(name, str) or not name:
        raise PodSpecError(f"{field}.name must be a non-empty string")
    role: Role = "app"
    if default_role == "init":
        policy = c.get("restartPolicy")
        if policy not in (None, "Always"):
            raise PodSpecError(f"{field}.restartPolicy: only 'Always' is allowed, got {policy!r}")
        role = "sidecar" if policy == "Always" else "init"
    resources = _member(c, "resources", field)
    requests = _member(resources, "requests", field, "resources")
    limits = _member(resources, "limits", field, "resources")
    cpu_lim, mem_lim = _quantity(limits, "limits", "cpu", field), _quantity(limits, "limits", "memory", field)
    cpu_req, mem_req = _quantity(requests, "requests", "cpu", field), _quantity(requests, "requests", "memory", field)
    # API defaulting: a request that is not set defaults to the limit.
    if cpu_req is None:
        cpu_req = cpu_lim
    if mem_req is None:
        mem_req = mem_lim
    pages: dict[str, int] = {}
    for key, kind in (("limits", limits), ("requests", requests)):  # requests win; they default to limits
        for res, value in kind.items():
            if isinstance(res, str) and res.startswith("hugepages-") and value is not None:
                pages[res] = memory_bytes(value, field=f"{field}.resources.{key}.{res}")
    return ContainerInfo(
        name=name,
        role=role,
        cpu_request_milli=cpu_req,
        cpu_limit_milli=cpu_lim,
        memory_request=mem_req,
        memory_limit=mem_lim,
        hugepages=tuple(sorted(pages.items())),
    )
