"""``numapin plan SCENARIO``: admit a scenario's pods on one node as kubelet would, and show the decisions."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from allocator.compact_hints import HintFamily
    from allocator.hints import TopologyHint
    from allocator.node import NodeAllocator, PodDecision

    from .memory_view import MemoryView
    from .scenario import Scenario

HELP = "admit a scenario's pods on one node as kubelet would, and show the CPUs each container gets"
DESCRIPTION = """\
Admit the pods of a scenario (JSON or YAML), in order, on one node with kubelet's CPU manager static policy,
topology manager and numapin's modes, and print for every pod whether it is admitted or rejected (with kubelet's
reason) and for every container its mode, CPU topology hints, merged NUMA affinity, CPUs and memory nodes.

Scenario fields: topology (inline, a file, or sysfs:ROOT), reservedCPUs or numReservedCPUs,
cpuManagerPolicyOptions, topologyManagerPolicy, topologyManagerScope, topologyManagerPolicyOptions,
featureGates (kubelet's, e.g. {PodLevelResourceManagers: true}), state (as in the state file), pods (v1 Pod
objects), devices ({pod: {container: {resource: [NUMA nodes]}}}),
memory (kubelet's Memory Manager: policy, perNUMANode or nodes, reservedMemory, systemReserved, kubeReserved,
evictionHard; then memory and huge pages per NUMA node and every container's blocks are shown too).
See examples/ for complete scenarios.

  --format summary   one block per pod (default)
  --format text      the summary plus a drawing of the node with every pinned container's CPUs marked
  --format json      everything, machine-readable
"""

MAX_HINTS_SHOWN = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario file (.json, .yaml or .yml)")
    parser.add_argument("--format", choices=("summary", "text", "json"), default="summary",
                        help="output format (default: summary)")
    parser.add_argument("--max-hints", type=int, default=256, metavar="N",
                        help="JSON: list at most N hints per resource (default 256; 0 = all)")


def _hint_list(hints: Sequence[TopologyHint] | HintFamily | None) -> str:
    from allocator.compact_hints import HintFamily

    if hints is None:
        return "any (no preference)"
    if isinstance(hints, HintFamily):
        required = ",".join(str(n) for n in range(hints.required.bit_length()) if hints.required >> n & 1)
        text = f"every NUMA set holding {{{required}}}" if required else "every NUMA set"
        if hints.threshold:
            text += f" with at least {hints.threshold} free"
        if hints.preferred_size is not None:
            text += f"; preferred: {hints.preferred_size} node(s)"
        return text
    if not hints:
        return "none possible"
    shown = " ".join(str(h) for h in hints[:MAX_HINTS_SHOWN])
    more = len(hints) - MAX_HINTS_SHOWN
    return shown + (f" ... ({more} more)" if more > 0 else "")


def _summary(scenario: Scenario, node: NodeAllocator, decisions: Sequence[PodDecision]) -> list[str]:
    from .render import summary_line

    cfg = scenario.config
    out: list[str] = []
    if scenario.description:
        out.extend(textwrap.wrap(" ".join(scenario.description.split()), 110))
    out.append(f"Node: {summary_line(cfg.topology)}")
    opts = ", ".join(f"{k}={v}" for k, v in sorted(cfg.cpu_manager_policy_options.items())) or "none"
    tm_opts = ", ".join(f"{k}={v}" for k, v in sorted(cfg.topology_manager_policy_options.items())) or "none"
    out.append(f"CPU manager: static, options {opts}; reserved CPUs {node.reserved_cpus}")
    out.append(f"Topology manager: policy {cfg.topology_manager_policy}, scope {cfg.topology_manager_scope}, "
               f"options {tm_opts}")
    for d in decisions:
        ref = f"{d.namespace}/{d.name}" if d.namespace else d.name
        if d.admitted:
            out.append(f"pod {ref}: admitted")
        else:
            out.append(f"pod {ref}: REJECTED {d.reason}: {d.message}")
        for c in d.containers:
            cpus = str(c.cpus) if c.cpus else "-"
            mems = str(c.mems) if c.mems else "-"
            where = "shared pool " if c.mode == "shared" and d.admitted else ""
            out.append(f"  {c.role} container {c.name}: {c.mode}, cpus {where}{cpus or '-'}, mems {mems}")
            for resource, hints in sorted(c.hints.items()):
                out.append(f"    {resource} hints: {_hint_list(hints)}")
            if c.affinity is not None:
                out.append(f"    affinity: {c.affinity}")
    free = ", ".join(f"{n}: {k}" for n, k in node.free_cpus_per_numa().items())
    out.append(f"Shared pool after admission: {node.shared_pool()}; allocatable CPUs per NUMA node: {free}")
    view = _memory_view(node, decisions)
    if view is not None:
        out.extend(view.lines())
    return out


def _memory_view(node: NodeAllocator, decisions: Sequence[PodDecision]) -> MemoryView | None:
    """The Memory Manager's tables after admission, its holders named by pod (None: memoryManagerPolicy None)."""
    from allocator.memory.report import memory_document

    from .memory_view import MemoryView

    if node.memory_state is None:
        return None
    refs = {d.uid: f"{d.namespace}/{d.name}" if d.namespace else d.name for d in decisions}
    return MemoryView.from_document(memory_document(node.memory_state)).with_pods(refs)


def _marks(node: NodeAllocator, decisions: Sequence[PodDecision]) -> tuple[dict[int, str], list[tuple[str, str]]]:
    from .render import assignment_marks

    items = [
        (f"{d.namespace}/{d.name} {c.name} ({c.mode})" if d.namespace else f"{d.name} {c.name} ({c.mode})", c.cpus)
        for d in decisions if d.admitted
        for c in d.containers if c.mode != "shared"
    ]
    return assignment_marks(items, node.reserved_cpus)


def run(args: argparse.Namespace) -> int:
    from allocator.errors import AllocatorError

    from .scenario import ScenarioError, load_scenario

    if args.max_hints < 0:
        print(f"numapin plan: --max-hints must be >= 0, got {args.max_hints}", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as e:
        print(f"numapin plan: {args.scenario}: {e}", file=sys.stderr)
        return 2
    try:
        node, decisions = plan(scenario)
    except ScenarioError as e:
        print(f"numapin plan: {args.scenario}: {e}", file=sys.stderr)
        return 2
    except AllocatorError as e:
        print(f"numapin plan: {args.scenario}: {e}", file=sys.stderr)
        return 2
    if args.format == "json":
        doc = {
            "pods": [d.to_dict(args.max_hints or None) for d in decisions],
            "reservedCPUs": str(node.reserved_cpus),
            "sharedPool": str(node.shared_pool()),
            "freeCPUsPerNUMA": {str(n): k for n, k in node.free_cpus_per_numa().items()},
        }
        view = _memory_view(node, decisions)
        if view is not None:
            doc["memory"] = view.to_dict()
        print(json.dumps(doc, indent=1))
        return 0
    lines = _summary(scenario, node, decisions)
    if args.format == "text":
        from .render import render_topology

        marks, legend = _marks(node, decisions)
        lines.append("")
        lines.append(render_topology(scenario.config.topology, marks=marks, legend=legend))
    print("\n".join(lines))
    return 0


def plan(scenario: Scenario) -> tuple[NodeAllocator, list[PodDecision]]:
    """Admit every pod of the scenario in order; ScenarioError/AllocatorError for a node that cannot start."""
    from allocator.errors import AllocatorError
    from allocator.node import NodeAllocator

    from .scenario import ScenarioError

    try:  # the node was built and checked when the scenario was read (allocator.node.build_node)
        node = NodeAllocator(scenario.parts, scenario.state)
    except AllocatorError as e:  # the state does not fit this node (kubelet's validateState)
        raise ScenarioError(f"state: {e}") from None
    decisions: list[PodDecision] = []
    for i, pod in enumerate(scenario.pods):
        try:
            decisions.append(node.admit_pod(pod, devices=scenario.devices.get(pod.name)))
        except AllocatorError as e:
            raise ScenarioError(f"pods[{i}]: {e}") from None
    return node, decisions
