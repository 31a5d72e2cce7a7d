"""The cluster as its published NodeResourceTopology objects show it: every node's sockets and NUMA nodes with
free, pinned and reserved CPUs and memory, its policies, and whether a pod of a given shape could be admitted there
(the webhook's own simulation, ``webhook.admission.simulate``). Pure: the objects come from ``cluster_source``.

A malformed object, or a Node without one, is reported in ``skipped`` and left out of the picture.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.errors import TopologyError
from allocator.nrt import NRT_API_VERSION, NRT_KIND, NodeTopology, NUMAZone, parse_nrt
from numapin.fits import PodShape
from webhook.admission.simulate import Simulation, Simulator

__all__ = ["ClusterPicture", "NodeFit", "Skipped", "build_picture", "render_text"]


@dataclass(frozen=True)
class NodeFit:
    """Where the shape fits on one node: ``now`` with its free CPUs, ``empty`` on the node with nothing pinned."""

    now: Simulation
    empty: Simulation

    @property
    def verdict(self) -> str:
        if not self.now.known:
            return "unknown"
        if self.now.admitted:
            return "fits"
        return "full" if self.empty.admitted else "never"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self.verdict, "now": self.now.admitted, "whenEmpty": self.empty.admitted}
        refusal = self.now if not self.now.admitted else None
        if refusal is not None:
            out["reason"] = refusal.reason
            out["message"] = refusal.message
        if not self.now.known:
            out["message"] = self.now.message
        return out


@dataclass(frozen=True)
class Skipped:
    node: str
    why: str


@dataclass(frozen=True)
class ClusterPicture:
    nodes: tuple[NodeTopology, ...]
    skipped: tuple[Skipped, ...]
    shape: PodShape | None = None
    fits: Mapping[str, NodeFit] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "NumapinClusterStatus",
                               "nodes": [_node_dict(n, self.fits.get(n.name)) for n in self.nodes],
                               "skipped": [{"node": s.node, "why": s.why} for s in self.skipped]}
        if self.shape is not None:
            out["fits"] = {"shape": self.shape.to_dict(),
                           "now": [n.name for n in self.nodes if self.fits[n.name].verdict == "fits"]}
        return out


def _name(item: Mapping[str, Any]) -> str:
    meta = item.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name else "(no name)"


def build_picture(items: Iterable[Mapping[str, Any]], node_names: Iterable[str] | None,
                  shape: PodShape | None = None) -> ClusterPicture:
    """Parse the NRT objects (as the API lists them: without ``kind``/``apiVersion``), note the Nodes
    (``node_names``; None when unknown) that have none, and judge ``shape`` on each node."""
    nodes: list[NodeTopology] = []
    skipped: list[Skipped] = []
    for item in items:
        doc = {"kind": NRT_KIND, "apiVersion": NRT_API_VERSION, **item}
        try:
            nodes.append(parse_nrt(doc))
        except TopologyError as e:
            skipped.append(Skipped(_name(item), f"malformed NodeResourceTopology: {e}"))
    nodes.sort(key=lambda n: n.name)
    have = {n.name for n in nodes} | {s.node for s in skipped}
    for name in sorted(set(node_names or ())):
        if name not in have:
            skipped.append(Skipped(name, "no NodeResourceTopology object (numapin's node agent does not publish "
                                         "there, or has not yet)"))
    fits: dict[str, NodeFit] = {}
    if shape is not None:
        sim = Simulator()
        for n in nodes:
            fits[n.name] = NodeFit(now=sim.admit(n, shape.pod, occupied=True),
                                   empty=sim.admit(n, shape.pod, occupied=False))
    return ClusterPicture(tuple(nodes), tuple(skipped), shape, fits)


def _policy(n: NodeTopology) -> str:
    text = f"{n.topology_manager_policy}/{n.topology_manager_scope}"
    if n.topology_manager_policy_options:
        text += " " + ",".join(f"{k}={v}" for k, v in sorted(n.topology_manager_policy_options.items()))
    return text


def _zone_dict(z: NUMAZone) -> dict[str, Any]:
    out: dict[str, Any] = {"numaNode": z.numa, "socket": z.socket,
                           "cpus": {"capacity": z.capacity, "allocatable": z.allocatable, "free": z.available,
                                    "pinned": z.occupied, "reserved": z.reserved}}
    for resource, (capacity, allocatable, available) in sorted(z.memory.items()):
        out.setdefault("memory", {})[resource] = {"capacity": capacity, "allocatable": allocatable,
                                                  "free": available, "pinned": allocatable - available}
    return out


def _node_dict(n: NodeTopology, fit: NodeFit | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": n.name, "topologyManagerPolicy": n.topology_manager_policy,
        "topologyManagerScope": n.topology_manager_scope,
        "topologyManagerPolicyOptions": dict(n.topology_manager_policy_options),
        "cpuManagerPolicyOptions": dict(n.cpu_manager_policy_options),
        "memoryManagerPolicy": n.memory_manager_policy, "threadsPerCore": n.threads_per_core,
        "cpus": {"allocatable": n.total_allocatable, "free": n.total_available},
        "numaNodes": [_zone_dict(z) for z in n.zones],
    }
    if n.assumptions:
        out["assumptions"] = list(n.assumptions)
    if fit is not None:
        out["fits"] = fit.to_dict()
    return out


def _bytes(n: int) -> str:
    for unit, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f}{unit}".replace(".0" + unit, unit)
    return f"{n}B"


def _bar(z: NUMAZone, width: int = 32) -> str:
    """One mark per CPU (scaled to ``width`` when more): ``*`` reserved, ``#`` pinned, ``.`` free."""
    marks = "*" * z.reserved + "#" * z.occupied + "." * z.available
    if len(marks) <= width or not marks:
        return marks
    return "".join(marks[i * len(marks) // width] for i in range(width))


_VERDICTS = {"fits": "fits now", "full": "does not fit now (would on the empty node)",
             "never": "never fits under this policy", "unknown": "cannot be judged"}


def render_text(p: ClusterPicture) -> str:
    lines: list[str] = []
    if p.shape is not None:
        now = [n.name for n in p.nodes if p.fits[n.name].verdict == "fits"]
        lines.append(f"a pod of {p.shape.text} fits now on {len(now)} of {len(p.nodes)} nodes"
                     + (f": {', '.join(now)}" if now else ""))
        lines.append("")
    for n in p.nodes:
        head = (f"node {n.name}: {n.total_available} of {n.total_allocatable} allocatable CPUs free, "
                f"topology manager {_policy(n)}")
        if n.memory_manager_policy:
            head += f", memory manager {n.memory_manager_policy}"
        lines.append(head)
        fit = p.fits.get(n.name)
        if fit is not None:
            line = f"  {p.shape.text if p.shape else ''}: {_VERDICTS[fit.verdict]}"
            if fit.verdict != "fits" and (fit.now.reason or fit.now.message):
                line += f" ({': '.join(s for s in (fit.now.reason, fit.now.message) if s)})"
            lines.append(line)
        sockets = sorted({z.socket for z in n.zones}, key=lambda s: (s is None, s or 0))
        for s in sockets:
            lines.append(f"  socket {s if s is not None else '?'}")
            for z in (z for z in n.zones if z.socket == s):
                cpu = (f"    NUMA {z.numa}  {_bar(z):<32}  cpus {z.available} free, {z.occupied} pinned, "
                       f"{z.reserved} reserved")
                mem = z.memory.get("memory")
                if mem is not None:
                    cpu += f"; memory {_bytes(mem[2])} free of {_bytes(mem[1])}"
                lines.append(cpu)
        for a in n.assumptions:
            lines.append(f"  assumed: {a}")
    if not p.nodes:
        lines.append("no node publishes a NodeResourceTopology")
    for skip in p.skipped:
        lines.append(f"skipped {skip.node}: {skip.why}")
    lines.append("(* reserved, # pinned, . free)")
    return "\n".join(lines)
