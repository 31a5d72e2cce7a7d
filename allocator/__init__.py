"""numapin's pure core: topology, CPU sets, kubelet's static CPU policy and topology manager, Crane modes.

Public names are loaded lazily from the module that holds them (one concept per module). To export a
new name, add one line to ``_EXPORTS``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # values and errors
    "CPUSet": "cpuset",
    "CPUInfo": "topology",
    "Topology": "topology",
    "TopologyHint": "hints",
    "CPUState": "state",
    "AllocatorError": "errors",
    "AllocationError": "errors",
    "SMTAlignmentError": "errors",
    "TopologyAffinityError": "errors",
    "TopologyError": "errors",
    "ConfigError": "errors",
    "PodSpecError": "errors",
    "CheckpointError": "errors",
    # static policy
    "take_by_topology": "cpu_assignment",
    "StaticPolicy": "static_policy",
    "StaticPolicyOptions": "policy_options",
    "generate_cpu_hints": "cpu_hints",
    # topology manager
    "merge_hints": "topology_manager",
    "HintFamily": "compact_hints",
    "cpu_hint_family": "compact_hints",
    "TopologyManager": "topology_manager",
    "MemoryHintProvider": "memory_hints",
    "DeviceHintProvider": "device_hints",
    # pods, intent, state file
    "parse_quantity": "quantity",
    "INTENT_ANNOTATION": "intent",
    "build_nrt": "nrt",
    "CheckpointStore": "checkpoint",
    "checkpoint_checksum": "checkpoint",
    "import_kubelet_state": "checkpoint",
    # the node facade used by the proxy, the webhook and the CLI
    "NodeConfig": "node",
    "NodeAllocator": "node",
    "PodDecision": "node",
    "ContainerDecision": "node",
    "ResizeOutcome": "resize",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'allocator' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
