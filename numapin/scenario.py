"""Scenarios for ``numapin plan`` (and the demo): one node's configuration, its state and pods to admit.

A scenario is a JSON or YAML mapping::

    topology: topology-112.json        # inline mapping, a file (relative to the scenario), or "sysfs:ROOT"
    reservedCPUs: "0,56"               # or numReservedCPUs: 2
    cpuManagerPolicyOptions: {full-pcpus-only: "true"}
    topologyManagerPolicy: single-numa-node
    topologyManagerScope: container
    topologyManagerPolicyOptions: {prefer-closest-numa-nodes: "true"}
    featureGates: {PodLevelResourceManagers: true}   # kubelet's, as in KubeletConfiguration (optional)
    state: {defaultCpuSet: "...", entries: {...}}   # as in the state file (optional)
    pods: [ <v1 Pod>, ... ]
    devices: {<pod name>: {<container>: {<resource>: [NUMA nodes]}}}   # optional: devices already bound
    memory: {policy: Static, perNUMANode: {memory: 64Gi}, reservedMemory: "0:memory=100Mi"}   # optional
                                       # kubelet's Memory Manager (numapin/scenario_memory.py has every field)

Every error is a ScenarioError whose message starts with the field it is about.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from allocator.checkpoint import parse_checkpoint
from allocator.cpuset import CPUSet
from allocator.errors import AllocatorError, CheckpointError, ConfigError, PodSpecError, TopologyError
from allocator.feature_gates import FeatureGates, feature_gates_of
from allocator.memory.config import MemoryConfig
from allocator.node import NodeConfig, NodeParts, build_node
from allocator.pod import PodInfo
from allocator.state import CPUState
from allocator.topology import Topology

from .scenario_memory import MemoryFieldError, memory_config

__all__ = ["FIELDS", "Scenario", "ScenarioError", "load_scenario", "parse_scenario"]

FIELDS = (
    "description",
    "topology",
    "reservedCPUs",
    "numReservedCPUs",
    "cpuManagerPolicyOptions",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "featureGates",
    "state",
    "pods",
    "devices",
    "memory",
    "expect",
)


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Scenario:
    parts: NodeParts  # the node, built once (allocator.node.build_node)
    state: CPUState | None
    pods: tuple[PodInfo, ...]
    devices: Mapping[str, Mapping[str, Mapping[str, tuple[int, ...]]]] = field(default_factory=dict)
    description: str = ""
    expect: Any = None  # free-form expectations (used by the examples' test)

    @property
    def config(self) -> NodeConfig:
        return self.parts.config


def _read_document(path: Path, what: str) -> Any:
    try:
        text = path.read_text()
    except OSError as e:
        raise ScenarioError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ScenarioError(f"{what}: {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                            f"{e}") from None


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    p = Path(path)
    doc = _read_document(p, "scenario")
    return parse_scenario(doc, base=p.parent)


def _options(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{name} must be a mapping of option names to values")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str):
            raise ScenarioError(f"{name}: option name {k!r} must be a string")
        if isinstance(v, bool):
            v = "true" if v else "false"
        if not isinstance(v, str | int):
            raise ScenarioError(f"{name}[{k!r}] must be a string, got {v!r}")
        out[k] = str(v)
    return out


def _topology(value: Any, base: Path) -> Topology:
    if value is None:
        raise ScenarioError("topology is required: an inline mapping, a file name, or 'sysfs:ROOT'")
    try:
        if isinstance(value, str):
            if value.startswith("sysfs:"):
                return Topology.from_sysfs(value[len("sysfs:"):] or "/sys")
            path = Path(value)
            if not path.is_absolute():
                path = base / path
            doc = _read_document(path, "topology")
            return Topology.from_dict(doc)
        if isinstance(value, Mapping):
            return Topology.from_dict(value)
    except TopologyError as e:
        msg = str(e)
        raise ScenarioError(msg if msg.startswith("topology") else f"topology: {msg}") from None
    raise ScenarioError(f"topology must be a mapping, a file name or 'sysfs:ROOT', got {type(value).__name__}")


def _state(value: Any) -> CPUState | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ScenarioError("state must be a mapping like the state file (defaultCpuSet, entries)")
    try:
        cp = parse_checkpoint(json.dumps(value), "state")
    except CheckpointError as e:
        raise ScenarioError(str(e).split(". numapin will not overwrite")[0]) from None
    except TypeError as e:
        raise ScenarioError(f"state: {e}") from None
    if cp.version == 1 and cp.v1_entries:
        raise ScenarioError("state.entries must map pod UIDs to {container: cpu-list}")
    state = CPUState(default_cpuset=cp.default_cpuset)
    for uid, containers in cp.entries.items():
        for name, cpus in containers.items():
            state.set(uid, name, cpus, cp.modes.get(uid, {}).get(name, "exclusive"))
    return state


def _devices(value: Any) -> dict[str, dict[str, dict[str, tuple[int, ...]]]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError("devices must map pod names to {container: {resource: [NUMA nodes]}}")
    out: dict[str, dict[str, dict[str, tuple[int, ...]]]] = {}
    for pod, containers in value.items():
        if not isinstance(containers, Mapping):
            raise ScenarioError(f"devices[{pod!r}] must map container names to {{resource: [NUMA nodes]}}")
        for name, resources in containers.items():
            if not isinstance(resources, Mapping):
                raise ScenarioError(f"devices[{pod!r}][{name!r}] must map resource names to lists of NUMA nodes")
            for resource, nodes in resources.items():
                if not isinstance(nodes, list) or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in nodes
                ):
                    raise ScenarioError(
                        f"devices[{pod!r}][{name!r}][{resource!r}] must be a list of NUMA node ids"
                    )
                out.setdefault(str(pod), {}).setdefault(str(name), {})[str(resource)] = tuple(nodes)
    return out


def _memory(value: Any, topology: Topology) -> MemoryConfig | None:
    try:
        return memory_config(value, tuple(topology.numa_nodes))
    except MemoryFieldError as e:
        raise ScenarioError(str(e)) from None


def _gates(value: Any) -> FeatureGates:
    try:
        return feature_gates_of(value)
    except ConfigError as e:
        raise ScenarioError("featureGates: " + str(e).removeprefix("--feature-gates: ").removeprefix("featureGates: ")
                            ) from None


def parse_scenario(doc: Any, base: Path | None = None) -> Scenario:
    """Build a Scenario from a parsed document. Raises ScenarioError naming the field."""
    base = base or Path.cwd()
    if not isinstance(doc, Mapping):
        raise ScenarioError("scenario must be a mapping with at least 'topology' and 'pods'")
    for key in doc:
        if key not in FIELDS:
            raise ScenarioError(f"{key}: unknown scenario field (known: {', '.join(FIELDS)})")
    topology = _topology(doc.get("topology"), base)

    reserved: CPUSet | None = None
    raw = doc.get("reservedCPUs")
    if raw is not None:
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str):
            raise ScenarioError(f"reservedCPUs must be a cpu-list string like \"0,56\", got {raw!r}")
        try:
            reserved = CPUSet.parse(raw)
        except ValueError as e:
            raise ScenarioError(f"reservedCPUs: {e}") from None
    num = doc.get("numReservedCPUs", 0)
    if isinstance(num, bool) or not isinstance(num, int) or num < 0:
        raise ScenarioError(f"numReservedCPUs must be a non-negative integer, got {num!r}")
    if reserved is not None and num:
        raise ScenarioError("reservedCPUs and numReservedCPUs: give one of them, not both")

    def text(name: str, default: str) -> str:
        v = doc.get(name, default)
        if not isinstance(v, str):
            raise ScenarioError(f"{name} must be a string, got {v!r}")
        return v

    config = NodeConfig(
        topology=topology,
        reserved_cpus=reserved,
        num_reserved_cpus=num,
        cpu_manager_policy_options=_options(doc.get("cpuManagerPolicyOptions"), "cpuManagerPolicyOptions"),
        topology_manager_policy=text("topologyManagerPolicy", "none"),
        topology_manager_scope=text("topologyManagerScope", "container"),
        topology_manager_policy_options=_options(doc.get("topologyManagerPolicyOptions"),
                                                 "topologyManagerPolicyOptions"),
        require_reserved_cpus=True,  # kubelet would not start without
        memory=_memory(doc.get("memory"), topology),
        pod_level_resource_managers=_gates(doc.get("featureGates")).pod_level_resource_managers,
    )
    try:
        parts = build_node(config)
    except AllocatorError as e:
        raise ScenarioError(str(e)) from None

    raw_pods = doc.get("pods")
    if not isinstance(raw_pods, list):
        raise ScenarioError("pods must be a list of v1 Pod objects")
    pods: list[PodInfo] = []
    uids: set[str] = set()
    for i, raw_pod in enumerate(raw_pods):
        try:
            info = PodInfo.from_pod(raw_pod)
        except PodSpecError as e:
            raise ScenarioError(f"pods[{i}]: {e}") from None
        if not info.uid:
            # scenarios may leave uid out: the pod's namespace/name stands in for it
            info = replace(info, uid=info.ref)
        if not info.name:
            raise ScenarioError(f"pods[{i}].metadata.name is required")
        if info.uid in uids:
            raise ScenarioError(f"pods[{i}].metadata: pod {info.uid!r} appears twice")
        uids.add(info.uid)
        pods.append(info)
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ScenarioError("description must be a string")
    return Scenario(
        parts=parts,
        state=_state(doc.get("state")),
        pods=tuple(pods),
        devices=_devices(doc.get("devices")),
        description=description,
        expect=doc.get("expect"),
    )
