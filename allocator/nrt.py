"""NodeResourceTopology (``topology.node.k8s.io/v1alpha2``) documents: built by the proxy, read by the webhook.

One document per node, named after the node. Layout (what ``build_nrt`` writes and ``parse_nrt`` reads):

- ``zones``: one per NUMA node that has CPUs, ``name: node-<n>``, ``type: Node``, ``resources: [{name: cpu,
  capacity, allocatable, available}]`` (whole CPUs; allocatable = capacity minus reserved CPUs; available =
  allocatable minus CPUs pinned to containers), ``costs: [{name: node-<m>, value: distance}]`` when distances are
  known, and numapin zone attributes ``numapinSocket`` (socket id), ``numapinCPUs`` (cpu list) and
  ``numapinAvailableCores`` (physical cores whose every thread is available). With kubelet's Memory Manager
  emulated (``memoryManagerPolicy: Static``) a zone also lists ``memory`` and every ``hugepages-<size>`` as NFD's
  topology-updater publishes them: capacity (the node's total), allocatable (minus what is reserved for the
  system; for ``memory`` also minus the huge pages), available (minus what containers hold), as quantities.
- top-level ``attributes``: ``topologyManagerPolicy``, ``topologyManagerScope`` (kubelet's spelling),
  ``topologyManagerOption<CamelName>`` per topology-manager option (the scheduler plugin's convention),
  ``cpuManagerPolicy`` (``static``: numapin emulates it), ``cpuManagerPolicyOption<CamelName>`` per CPU-manager
  option, and numapin extras ``numapinReservedCPUs`` (cpu list), ``numapinThreadsPerCore`` and
  ``numapinStateVersion`` (changes with every allocation change on the node, never repeats: the webhook uses it to
  know when the CPUs of pods it just let bind are in the published counts); ``memoryManagerPolicy`` (kubelet's
  spelling, ``None`` or ``Static``) when memory is published.
- ``topologyPolicies`` (deprecated upstream) is still written for older readers.

``parse_nrt`` turns a document into a ``NodeTopology`` value (the webhook rebuilds an approximate machine from it
for its simulation: ``webhook/admission/synthetic_node.py``). Nothing here does I/O.

``parse_nrt`` reads any valid v1alpha2 document, including those of the ecosystem's exporters (NFD's
topology-updater, the resource-topology-exporter), which carry ``topologyManagerPolicy``/``topologyManagerScope``
(or only the deprecated ``topologyPolicies``), zones ``node-<n>`` of type ``Node`` with ``cpu``, ``memory``,
``hugepages-*`` and device resources, and ``costs``, but no numapin attribute. What it derives or assumes for such a
node is listed in ``NodeTopology.assumptions`` (reserved CPUs = capacity - allocatable per NUMA node, one thread
per core, each NUMA node its own socket, ...), for the webhook's logs and messages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from typing import Any

from .cpuset import CPUSet
from .errors import PodSpecError, TopologyError
from .quantity import memory_bytes
from .topology import Topology
from .topology_manager import POLICIES, SCOPES

__all__ = [
    "NRT_API_VERSION",
    "NRT_GROUP",
    "NRT_KIND",
    "NRT_PLURAL",
    "NRT_VERSION",
    "NUMAZone",
    "NodeTopology",
    "build_nrt",
    "parse_nrt",
]

NRT_GROUP = "topology.node.k8s.io"
NRT_VERSION = "v1alpha2"
NRT_API_VERSION = f"{NRT_GROUP}/{NRT_VERSION}"
NRT_KIND = "NodeResourceTopology"
NRT_PLURAL = "noderesourcetopologies"

_TM_POLICIES = POLICIES
_TM_SCOPES = SCOPES
_ZONE_RE = re.compile(r"^node-(\d+)$")
_LEGACY_POLICY = {
    ("none", "container"): "None",
    ("none", "pod"): "None",
    ("best-effort", "container"): "BestEffort",
    ("best-effort", "pod"): "BestEffort",
    ("restricted", "container"): "Restricted",
    ("restricted", "pod"): "Restricted",
    ("single-numa-node", "container"): "SingleNUMANodeContainerLevel",
    ("single-numa-node", "pod"): "SingleNUMANodePodLevel",
}


def _camel(option: str) -> str:
    """``prefer-closest-numa-nodes`` -> ``PreferClosestNumaNodes``."""
    return "".join(part[:1].upper() + part[1:] for part in option.split("-"))


def _kebab(camel: str) -> str:
    """``PreferClosestNumaNodes`` -> ``prefer-closest-numa-nodes``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "-", camel).lower()


# -- building -------------------------------------------------------------------------------------------------
def build_nrt(
    node_name: str,
    topology: Topology,
    *,
    free_cpus: CPUSet,
    reserved_cpus: CPUSet = CPUSet(),  # noqa: B008 (immutable)
    topology_manager_policy: str = "none",
    topology_manager_scope: str = "container",
    topology_manager_policy_options: Mapping[str, str] | None = None,
    cpu_manager_policy_options: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    attributes: Mapping[str, str] | None = None,
    memory: Mapping[int, Mapping[str, tuple[int, int, int]]] | None = None,
    memory_manager_policy: str | None = None,
    zone_attributes: Mapping[int, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """The NodeResourceTopology document of a node.

    ``free_cpus``: the CPUs an exclusive allocation could take now (not reserved, not pinned to any
    container); ``reserved_cpus``: the node's reserved CPUs. ``attributes`` adds (or overrides) top-level
    attributes, e.g. ``nodeTopologyPodsFingerprint``. ``memory[n][resource]``: (capacity, allocatable, available)
    bytes of ``memory`` and each ``hugepages-<size>`` on NUMA node n (allocator.memory.report.nrt_memory), with
    the ``memory_manager_policy`` published beside it; ``zone_attributes[n]`` adds attributes to NUMA node n's
    zone (allocator.memory.report.nrt_memory_attributes: the memory groups).
    """
    if not node_name:
        raise TopologyError("node name must not be empty")
    tpc = topology.threads_per_core
    zones: list[dict[str, Any]] = []
    cpu_nodes = topology.cpu_numa_nodes
    for n in cpu_nodes:
        cpus = topology.cpus_in_numa(n)
        allocatable = cpus - reserved_cpus
        available = allocatable & free_cpus
        free_cores = _count_free_cores(topology, cpus, available)
        zone: dict[str, Any] = {
            "name": f"node-{n}",
            "type": "Node",
            "resources": [
                {
                    "name": "cpu",
                    "capacity": str(len(cpus)),
                    "allocatable": str(len(allocatable)),
                    "available": str(len(available)),
                },
                *_memory_resources((memory or {}).get(n, {})),
            ],
            "attributes": [
                {"name": "numapinSocket", "value": str(topology.cpu(cpus.min()).socket)},
                {"name": "numapinCPUs", "value": str(cpus)},
                {"name": "numapinAvailableCores", "value": str(free_cores)},
                *({"name": k, "value": v} for k, v in sorted((zone_attributes or {}).get(n, {}).items())),
            ],
        }
        if topology.numa_distances is not None:
            zone["costs"] = [{"name": f"node-{m}", "value": topology.distance(n, m)} for m in cpu_nodes]
        zones.append(zone)
    attrs: dict[str, str] = {
        "topologyManagerPolicy": topology_manager_policy,
        "topologyManagerScope": topology_manager_scope,
    }
    for k, v in sorted((topology_manager_policy_options or {}).items()):
        attrs[f"topologyManagerOption{_camel(k)}"] = str(v)
    attrs["cpuManagerPolicy"] = "static"
    if memory_manager_policy is not None:
        attrs["memoryManagerPolicy"] = memory_manager_policy
    for k, v in sorted((cpu_manager_policy_options or {}).items()):
        attrs[f"cpuManagerPolicyOption{_camel(k)}"] = str(v)
    attrs["numapinReservedCPUs"] = str(reserved_cpus)
    attrs["numapinThreadsPerCore"] = str(tpc)
    attrs.update(attributes or {})
    metadata: dict[str, Any] = {"name": node_name}
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": NRT_API_VERSION,
        "kind": NRT_KIND,
        "metadata": metadata,
        "topologyPolicies": [_LEGACY_POLICY.get((topology_manager_policy, topology_manager_scope), "None")],
        "zones": zones,
        "attributes": [{"name": k, "value": v} for k, v in attrs.items()],
    }


def _bytes_text(n: int) -> str:
    """Bytes as a canonical binary quantity (``64Gi``, ``65436Mi``; a plain number below 1Ki)."""
    units = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
    exp = 0
    while n and n % 1024 == 0 and exp < len(units) - 1:
        n //= 1024
        exp += 1
    return f"{n}{units[exp]}"


def _memory_resources(per_resource: Mapping[str, tuple[int, int, int]]) -> list[dict[str, str]]:
    order = sorted(per_resource, key=lambda r: (r != "memory", r))
    return [{"name": r, "capacity": _bytes_text(per_resource[r][0]), "allocatable": _bytes_text(per_resource[r][1]),
             "available": _bytes_text(per_resource[r][2])} for r in order]


def _count_free_cores(topology: Topology, cpus: CPUSet, available: CPUSet) -> int:
    cores = {topology.cpu(c).core for c in cpus}
    return sum(1 for core in cores if topology.cpus_in_core(core).issubset(available))


# -- parsing --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NUMAZone:
    """One NUMA node as an NRT document describes it (CPU counts only)."""

    numa: int
    capacity: int
    allocatable: int
    available: int
    socket: int | None = None
    available_cores: int | None = None
    distances: Mapping[int, int] | None = None  # NUMA node -> distance
    # ``memory`` and ``hugepages-<size>``: (capacity, allocatable, available) bytes, when the document lists them
    memory: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)
    memory_assignments: int | None = None  # numapinMemoryAssignments (numapin's documents, nodes holding memory)
    memory_cells: CPUSet | None = None  # numapinMemoryCells: the node's memory group

    @property
    def reserved(self) -> int:
        return self.capacity - self.allocatable

    @property
    def occupied(self) -> int:
        return self.allocatable - self.available


@dataclass(frozen=True)
class NodeTopology:
    """What the webhook knows of a node: its NUMA zones, policies and free CPUs (from an NRT document)."""

    name: str
    zones: tuple[NUMAZone, ...]
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    cpu_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    threads_per_core: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    state_version: str | None = None  # numapinStateVersion: a new value on every allocation change
    reserved_cpus: CPUSet | None = None  # numapinReservedCPUs: the node's reserved CPU ids (numapin's documents)
    memory_manager_policy: str | None = None  # memoryManagerPolicy as published (None: not published)
    # what parse_nrt derived or assumed because the document did not say it (empty for numapin's own documents)
    assumptions: tuple[str, ...] = ()

    # -- summaries --------------------------------------------------------------------------------------------
    @property
    def largest_numa(self) -> NUMAZone | None:
        """The NUMA node with the most allocatable CPUs (lowest id on a tie)."""
        best: NUMAZone | None = None
        for z in self.zones:
            if best is None or z.allocatable > best.allocatable:
                best = z
        return best

    @property
    def total_allocatable(self) -> int:
        return sum(z.allocatable for z in self.zones)

    @property
    def total_available(self) -> int:
        return sum(z.available for z in self.zones)

    @cached_property
    def shape_key(self) -> tuple[Any, ...]:
        """Everything that decides what the node could ever admit (free CPUs left out): equal keys, equal answers
        on an empty node."""
        return (
            tuple((z.numa, z.capacity, z.allocatable, z.socket,
                   None if z.distances is None else tuple(sorted(z.distances.items())),
                   tuple(sorted((r, c, a) for r, (c, a, _) in z.memory.items()))) for z in self.zones),
            self.topology_manager_policy,
            self.topology_manager_scope,
            tuple(sorted(self.topology_manager_policy_options.items())),
            tuple(sorted(self.cpu_manager_policy_options.items())),
            self.threads_per_core,
        )

    @cached_property
    def state_key(self) -> tuple[Any, ...]:
        """``shape_key`` plus the free CPUs: equal keys, equal answers now."""
        return (self.shape_key, tuple((z.available, z.available_cores,
                                       tuple(sorted((r, v[2]) for r, v in z.memory.items())),
                                       z.memory_assignments, None if z.memory_cells is None else str(z.memory_cells))
                                      for z in self.zones))

    @property
    def publication_key(self) -> tuple[Any, ...]:
        """Which publication of the node this is: ``state_key`` plus the proxy's state version (free CPUs can
        return to earlier counts; the version does not)."""
        return (self.state_key, self.state_version)


def _field_error(path: str, msg: str) -> TopologyError:
    return TopologyError(f"NodeResourceTopology {path}: {msg}")


def _quantity_cpus(value: Any, path: str) -> int:
    """Whole CPUs from a Kubernetes quantity (``28``, ``"28"``, ``"28000m"``); fractions are rounded down."""
    if isinstance(value, bool):
        raise _field_error(path, f"must be a quantity, got {value!r}")
    if isinstance(value, int):
        q = Fraction(value)
    elif isinstance(value, str):
        text = value.strip()
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(m|k)?", text)
        if m is None:
            raise _field_error(path, f"must be a CPU quantity such as 28 or 28000m, got {value!r}")
        q = Fraction(m.group(1))
        if m.group(2) == "m":
            q /= 1000
        elif m.group(2) == "k":
            q *= 1000
    else:
        raise _field_error(path, f"must be a quantity, got {value!r}")
    if q < 0:
        raise _field_error(path, f"must not be negative, got {value!r}")
    return int(q)


def _attributes(raw: Any, path: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise _field_error(path, "must be a list of {name, value}")
    out: dict[str, str] = {}
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise _field_error(f"{path}[{i}]", "must be {name: string, value: string}")
        value = item.get("value", "")
        out[item["name"]] = value if isinstance(value, str) else str(value)
    return out


def _cpuset_attr(attrs: Mapping[str, str], key: str, path: str) -> CPUSet | None:
    text = attrs.get(key)
    if text is None:
        return None
    try:
        return CPUSet.parse(text)
    except ValueError as e:
        raise _field_error(f"{path}.{key}", f"must be a CPU list, got {text!r}: {e}") from None


def _int_attr(attrs: Mapping[str, str], key: str, path: str) -> int | None:
    text = attrs.get(key)
    if text is None or text == "":
        return None
    try:
        v = int(text)
    except ValueError:
        raise _field_error(f"{path}.{key}", f"must be an integer, got {text!r}") from None
    if v < 0:
        raise _field_error(f"{path}.{key}", f"must not be negative, got {text!r}")
    return v


_LEGACY_TO_POLICY = {v: k for k, v in _LEGACY_POLICY.items() if k[0] != "none" or k[1] == "container"}


def parse_nrt(doc: Mapping[str, Any], *, labels: Mapping[str, str] | None = None) -> NodeTopology:
    """Parse an NRT v1alpha2 document (v1alpha1's ``topologyPolicies`` is understood when attributes are absent).

    Zones of type ``Node`` named ``node-<n>`` with a ``cpu`` resource are the NUMA nodes; other zones are ignored.
    Raises TopologyError naming the field at fault.
    """
    if not isinstance(doc, Mapping):
        raise TopologyError("NodeResourceTopology must be a mapping")
    kind = doc.get("kind")
    if kind != NRT_KIND:
        raise _field_error("kind", f"must be {NRT_KIND}, got {kind!r}")
    api = doc.get("apiVersion")
    if not isinstance(api, str) or not api.startswith(f"{NRT_GROUP}/"):
        raise _field_error("apiVersion", f"must be {NRT_API_VERSION}, got {api!r}")
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise _field_error("metadata.name", "must be the node name")
    name = meta["name"]
    node_labels: dict[str, str] = {}
    raw_labels = meta.get("labels")
    if isinstance(raw_labels, Mapping):
        node_labels.update({str(k): str(v) for k, v in raw_labels.items()})
    if labels:
        node_labels.update(labels)

    attrs = _attributes(doc.get("attributes"), "attributes")
    policy = attrs.get("topologyManagerPolicy")
    scope = attrs.get("topologyManagerScope")
    policy_from = "attributes"
    if policy is None:
        policy_from = "not published"
        legacy = doc.get("topologyPolicies")
        if isinstance(legacy, Sequence) and not isinstance(legacy, str) and legacy:
            guess = _LEGACY_TO_POLICY.get(str(legacy[0]))
            if guess is not None:
                policy, legacy_scope = guess
                scope = scope or legacy_scope
                policy_from = f"from the deprecated topologyPolicies {legacy[0]}"
    policy = policy or "none"
    scope = scope or "container"
    if policy not in _TM_POLICIES:
        raise _field_error("attributes.topologyManagerPolicy", f"unknown policy {policy!r} (one of {_TM_POLICIES})")
    if scope not in _TM_SCOPES:
        raise _field_error("attributes.topologyManagerScope", f"unknown scope {scope!r} (one of {_TM_SCOPES})")
    tm_options = {_kebab(k[len("topologyManagerOption"):]): v for k, v in attrs.items()
                  if k.startswith("topologyManagerOption") and len(k) > len("topologyManagerOption")}
    cpu_options = {_kebab(k[len("cpuManagerPolicyOption"):]): v for k, v in attrs.items()
                   if k.startswith("cpuManagerPolicyOption") and len(k) > len("cpuManagerPolicyOption")}
    tpc = _int_attr(attrs, "numapinThreadsPerCore", "attributes") or 1
    from_numapin = any(k.startswith("numapin") for k in attrs)
    assumed: list[str] = []
    if not from_numapin:
        assumed.append("no numapin attributes (a document of another exporter, e.g. NFD topology-updater or "
                       "resource-topology-exporter)")
    if policy_from != "attributes":
        assumed.append(f"topology manager policy {policy}, scope {scope} ({policy_from})")
    elif "topologyManagerScope" not in attrs:
        assumed.append(f"topology manager scope {scope} (not published)")
    if "numapinThreadsPerCore" not in attrs:
        assumed.append("one thread per core (SMT not published)")

    raw_zones = doc.get("zones")
    if not isinstance(raw_zones, Sequence) or isinstance(raw_zones, str):
        raise _field_error("zones", "must be a list")
    zones: list[NUMAZone] = []
    for i, z in enumerate(raw_zones):
        path = f"zones[{i}]"
        if not isinstance(z, Mapping):
            raise _field_error(path, "must be a mapping")
        zname = z.get("name")
        if z.get("type") != "Node" or not isinstance(zname, str):
            continue
        m = _ZONE_RE.match(zname)
        if m is None:
            continue
        numa = int(m.group(1))
        if numa >= 64:
            raise _field_error(f"{path}.name", f"NUMA node id {numa} is not below 64")
        resources = z.get("resources") or []
        if not isinstance(resources, Sequence) or isinstance(resources, str):
            raise _field_error(f"{path}.resources", "must be a list")
        cpu: Mapping[str, Any] | None = None
        rpath = f"{path}.resources"
        memory: dict[str, tuple[int, int, int]] = {}
        for j, r in enumerate(resources):
            if not isinstance(r, Mapping):
                raise _field_error(f"{path}.resources[{j}]", "must be a mapping")
            if r.get("name") == "cpu":
                cpu = r
                rpath = f"{path}.resources[{j}]"
            elif isinstance(r.get("name"), str) and (r["name"] == "memory" or r["name"].startswith("hugepages-")):
                memory[r["name"]] = _memory_resource(r, f"{path}.resources[{j}]")
        if cpu is None:
            continue  # a CPU-less NUMA node
        capacity = _quantity_cpus(cpu.get("capacity"), f"{rpath}.capacity")
        allocatable = _quantity_cpus(cpu.get("allocatable", capacity), f"{rpath}.allocatable")
        available = _quantity_cpus(cpu.get("available", allocatable), f"{rpath}.available")
        for key, fallback in (("allocatable", "capacity"), ("available", "allocatable")):
            if cpu.get(key) is None:
                assumed.append(f"{zname} cpu {key} = {fallback} (not published)")
        if allocatable > capacity:
            raise _field_error(f"{rpath}.allocatable", f"{allocatable} is more than capacity {capacity}")
        if available > allocatable:
            raise _field_error(f"{rpath}.available", f"{available} is more than allocatable {allocatable}")
        zattrs = _attributes(z.get("attributes"), f"{path}.attributes")
        distances: dict[int, int] | None = None
        costs = z.get("costs")
        if costs:
            if not isinstance(costs, Sequence) or isinstance(costs, str):
                raise _field_error(f"{path}.costs", "must be a list of {name, value}")
            distances = {}
            for j, c in enumerate(costs):
                cm = _ZONE_RE.match(str(c.get("name", ""))) if isinstance(c, Mapping) else None
                value = c.get("value") if isinstance(c, Mapping) else None
                if cm is None or isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise _field_error(f"{path}.costs[{j}]", "must be {name: node-<n>, value: distance}")
                distances[int(cm.group(1))] = value
        zones.append(NUMAZone(
            numa=numa, capacity=capacity, allocatable=allocatable, available=available,
            socket=_int_attr(zattrs, "numapinSocket", f"{path}.attributes"),
            available_cores=_int_attr(zattrs, "numapinAvailableCores", f"{path}.attributes"),
            distances=distances,
            memory=memory,
            memory_assignments=_int_attr(zattrs, "numapinMemoryAssignments", f"{path}.attributes"),
            memory_cells=_cpuset_attr(zattrs, "numapinMemoryCells", f"{path}.attributes"),
        ))
    zones.sort(key=lambda z: z.numa)
    if len({z.numa for z in zones}) != len(zones):
        raise _field_error("zones", "a NUMA node is listed twice")
    if not from_numapin:
        reserved = ", ".join(f"node-{z.numa}: {z.reserved}" for z in zones)
        assumed.append(f"reserved CPUs = capacity - allocatable ({reserved or 'no NUMA node with CPUs'})")
        if any(z.socket is None for z in zones):
            assumed.append("each NUMA node on a socket of its own")
        if attrs.get("cpuManagerPolicy") not in (None, "static"):
            assumed.append(f"cpuManagerPolicy {attrs['cpuManagerPolicy']} published; judged as numapin's "
                           "static policy")
        assumed.append("free CPUs as published (an exporter counts the exclusive CPUs kubelet assigned, not "
                       "numapin's)")
    return NodeTopology(
        name=name, zones=tuple(zones), topology_manager_policy=policy, topology_manager_scope=scope,
        topology_manager_policy_options=tm_options, cpu_manager_policy_options=cpu_options,
        threads_per_core=tpc, labels=node_labels, state_version=attrs.get("numapinStateVersion"),
        reserved_cpus=_cpuset_attr(attrs, "numapinReservedCPUs", "attributes"),
        memory_manager_policy=attrs.get("memoryManagerPolicy"),
        assumptions=tuple(assumed),
    )


def _memory_resource(r: Mapping[str, Any], path: str) -> tuple[int, int, int]:
    """(capacity, allocatable, available) bytes of a ``memory`` or ``hugepages-<size>`` resource; allocatable
    defaults to capacity and available to allocatable, as for CPUs."""
    values: list[int] = []
    for key in ("capacity", "allocatable", "available"):
        raw = r.get(key)
        if raw is None:
            values.append(values[-1] if values else 0)
            continue
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise _field_error(f"{path}.{key}", f"must be a quantity, got {raw!r}")
        try:
            values.append(memory_bytes(raw, field=f"{path}.{key}"))
        except PodSpecError as e:
            raise _field_error(f"{path}.{key}", str(e)) from None
    capacity, allocatable, available = values
    if allocatable > capacity:
        raise _field_error(f"{path}.allocatable", f"{allocatable} bytes is more than capacity {capacity}")
    if available > allocatable:
        raise _field_error(f"{path}.available", f"{available} bytes is more than allocatable {allocatable}")
    return capacity, allocatable, available
