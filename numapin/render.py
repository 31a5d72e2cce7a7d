"""Text drawings of a node: sockets, NUMA nodes, L3 (uncore) groups, cores and their threads, with optional
marks on CPUs (whose they are). Used by ``numapin topology``, ``numapin plan`` and ``numapin status``."""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping, Sequence

from allocator.cpuset import CPUSet
from allocator.state import CPUState
from allocator.topology import Topology

__all__ = ["MARK_LETTERS", "assignment_marks", "core_cell", "render_topology", "state_marks", "summary_line"]

MARK_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def assignment_marks(
    assignments: Iterable[tuple[str, CPUSet]], reserved: CPUSet | None = None
) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Marks and legend for ``render_topology``: ``*`` for reserved CPUs, one letter per ``(label, cpus)``
    (later ones win on shared CPUs), ``.`` for the rest (the shared pool)."""
    marks: dict[int, str] = {}
    legend: list[tuple[str, str]] = []
    if reserved:
        for cpu in reserved:
            marks[cpu] = "*"
        legend.append(("*", "reserved"))
    for i, (label, cpus) in enumerate(assignments):
        letter = MARK_LETTERS[i % len(MARK_LETTERS)]
        for cpu in cpus:
            marks[cpu] = letter
        legend.append((letter, label))
    legend.append((".", "shared pool"))
    return marks, legend


def state_marks(state: CPUState, reserved: CPUSet | None = None,
                names: Mapping[str, str] | None = None) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """Marks for every container holding CPUs in ``state``, labelled ``<pod> <container> (<mode>)``;
    ``names`` maps pod UIDs to a readable name (``namespace/name``)."""
    names = names or {}
    items = [
        (f"{names.get(uid, uid)} {name} ({state.mode(uid, name)})", cpus)
        for uid, containers in sorted(state.assignments.items())
        for name, cpus in sorted(containers.items())
    ]
    return assignment_marks(items, reserved)


def summary_line(topo: Topology) -> str:
    return (
        f"{topo.num_cpus} CPUs, {topo.num_cores} cores, {topo.threads_per_core} thread(s) per core, "
        f"{topo.num_sockets} socket(s), {topo.num_numa_nodes} NUMA node(s), {len(topo.uncores)} L3 group(s)"
    )


def core_cell(cpus: CPUSet, marks: Mapping[int, str] | None = None) -> str:
    """One core: its threads in brackets, each followed by its mark (``[2A 58A]``) or ``.`` when unmarked and
    other CPUs are marked."""
    if marks is None:
        return "[" + " ".join(str(c) for c in cpus) + "]"
    return "[" + " ".join(f"{c}{marks.get(c, '.')}" for c in cpus) + "]"


def _wrap(cells: Sequence[str], indent: str, width: int) -> list[str]:
    lines: list[str] = []
    line = indent
    for cell in cells:
        if len(line) > len(indent) and len(line) + 1 + len(cell) > width:
            lines.append(line)
            line = indent
        line = line + (" " if len(line) > len(indent) else "") + cell
    if len(line) > len(indent):
        lines.append(line)
    return lines


def render_topology(
    topo: Topology,
    *,
    marks: Mapping[int, str] | None = None,
    legend: Sequence[tuple[str, str]] = (),
    width: int | None = None,
) -> str:
    """Draw the machine: sockets > NUMA nodes > L3 groups > cores ``[thread thread]``.

    ``marks`` maps CPU ids to a one-character mark; ``legend`` lists ``(mark, meaning)`` pairs printed first.
    NUMA nodes without CPUs are listed at the end; NUMA distances close the drawing when known.
    """
    width = width or max(60, min(shutil.get_terminal_size((120, 24)).columns, 160))
    out = [f"Node: {summary_line(topo)}"]
    if legend:
        out.append("Marks: " + "  ".join(f"{m} = {what}" for m, what in legend))
    for socket in topo.sockets:
        socket_cpus = topo.cpus_in_socket(socket)
        out.append(f"Socket {socket} ({len(socket_cpus)} CPUs)")
        for node in topo.numa_of(socket_cpus):
            node_cpus = topo.cpus_in_numa(node) & socket_cpus
            out.append(f"  NUMA node {node} ({len(node_cpus)} CPUs: {node_cpus})")
            uncores = sorted({topo.cpu(c).uncore for c in node_cpus})
            for uncore in uncores:
                group = topo.cpus_in_uncore(uncore) & node_cpus
                cores = sorted({topo.cpu(c).core for c in group})
                out.append(f"    L3 {uncore} ({len(cores)} cores)")
                cells = [core_cell(topo.cpus_in_core(core) & group, marks) for core in cores]
                out.extend(_wrap(cells, "      ", width))
    cpuless = [n for n in topo.numa_nodes if not topo.cpus_in_numa(n)]
    for node in cpuless:
        out.append(f"NUMA node {node} (no CPUs: memory only)")
    if topo.numa_distances is not None and topo.num_numa_nodes > 1:
        nodes = topo.numa_nodes
        cw = max(4, *(len(str(n)) + 1 for n in nodes), *(len(str(d)) + 1 for n in nodes for d in
                                                          topo.numa_distances[n]))
        out.append("NUMA distances:")
        out.append("  " + " " * cw + "".join(f"{n:>{cw}}" for n in nodes))
        for n in nodes:
            out.append("  " + f"{n:>{cw}}" + "".join(f"{d:>{cw}}" for d in topo.numa_distances[n]))
    return "\n".join(out)
