"""A node as numapin's proxy sees it, checked against what really runs: the model behind ``numapin status``.

Two sources of the proxy's view:

- ``from_proxy_status``: the proxy's ``/status`` JSON (served next to ``/metrics``), live;
- ``from_state_dir``: the files the proxy keeps, the state checkpoint (``cpu_manager_state``) and the published
  NodeResourceTopology, with the topology read from sysfs (works while the proxy is down).

``check_runtime`` then compares every running container's real CPUs (its process's ``Cpus_allowed_list``, else the
cpuset the runtime reports) with the CPUs the state gives it: its own when pinned, the shared pool otherwise.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from allocator.checkpoint import CheckpointStore
from allocator.cpuset import CPUSet
from allocator.errors import AllocatorError
from allocator.memory.checkpoint import parse_memory_checkpoint
from allocator.memory.report import memory_document
from allocator.nrt import parse_nrt
from allocator.state import CPUState
from allocator.topology import Topology
from criproxy.config import ProxyConfig

from .cri_view import RuntimeContainer
from .memory_view import MemoryView
from .proc_cpus import process_cpus

__all__ = ["Assignment", "CheckedContainer", "NodeStatus", "StatusError", "check_runtime", "from_proxy_status",
           "from_state_dir", "render_text"]

def default_nrt_file(state_dir: str | Path) -> Path:
    """Where the proxy publishes by default (``ProxyConfig.nrt_path``, named after the node): the newest
    ``*.json`` of its NodeResourceTopology directory."""
    nrt_dir = ProxyConfig(state_dir=str(state_dir)).nrt_dir
    found = sorted(nrt_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return found[0] if found else nrt_dir / "<node>.json"


class StatusError(Exception):
    """The proxy's view cannot be read (message says what and where)."""


@dataclass(frozen=True)
class Assignment:
    pod_uid: str
    container: str
    cpus: CPUSet
    mode: str              # exclusive | share
    pod: str = ""          # namespace/name when known


@dataclass(frozen=True)
class CheckedContainer:
    pod: str
    name: str
    id: str
    mode: str              # exclusive | share | shared
    expected: CPUSet
    actual: CPUSet | None  # None: could not be read
    source: str            # "process <pid>" or "runtime"

    @property
    def agrees(self) -> bool:
        return self.actual == self.expected


@dataclass
class NodeStatus:
    node: str
    source: str
    topology: Topology
    policy: str
    scope: str
    reserved: CPUSet | None
    shared_pool: CPUSet
    free_per_numa: dict[int, int]
    assignments: list[Assignment]
    bypass_ids: frozenset[str] = frozenset()
    # the proxy said which containers it leaves alone (bypass_ids); else a pod's numapin.io/bypass annotation is
    # taken at its word, as the state files do not say which namespaces may bypass (docs/tenancy.md)
    bypass_known: bool = False
    checked: list[CheckedContainer] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    runtime_checked: bool = False
    # pods whose CPU mode was changed while they ran: pod (namespace/name, else uid) -> mode
    pod_modes: dict[str, str] = field(default_factory=dict)
    # kubelet's in-place resizes the proxy applied or refused, newest last (its /status ``resizes``)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    # the Memory Manager's tables and holders (None: memoryManagerPolicy None, or its state file is not there)
    memory: MemoryView | None = None

    @property
    def disagreements(self) -> list[CheckedContainer]:
        return [c for c in self.checked if not c.agrees]

    def to_dict(self) -> dict[str, Any]:
        def cpus(c: CPUSet | None) -> str | None:
            return None if c is None else str(c)

        return {
            "node": self.node,
            "source": self.source,
            "topologyManagerPolicy": self.policy,
            "topologyManagerScope": self.scope,
            "numaNodes": {str(n): str(self.topology.cpus_in_numa(n)) for n in self.topology.numa_nodes},
            "reservedCPUs": cpus(self.reserved),
            "sharedPool": str(self.shared_pool),
            "sharedPoolNUMANodes": str(self.topology.numa_of(self.shared_pool)),
            "freeCPUsPerNUMA": {str(n): k for n, k in sorted(self.free_per_numa.items())},
            "pinned": [{"pod": a.pod or a.pod_uid, "podUID": a.pod_uid, "container": a.container,
                        "cpus": str(a.cpus), "numaNodes": str(self.topology.numa_of(a.cpus)), "mode": a.mode}
                       for a in self.assignments],
            "runtimeChecked": self.runtime_checked,
            "containers": [{**{k: v for k, v in asdict(c).items() if k not in ("expected", "actual")},
                            "expected": str(c.expected), "actual": cpus(c.actual), "agrees": c.agrees}
                           for c in self.checked],
            "disagreements": [{"pod": c.pod, "container": c.name, "id": c.id, "expected": str(c.expected),
                               "actual": cpus(c.actual)} for c in self.disagreements],
            "podModes": dict(sorted(self.pod_modes.items())),
            "resizes": [dict(r) for r in self.resizes],
            "memory": None if self.memory is None else self.memory.to_dict(),
            "notes": list(self.notes),
        }


def resize_line(r: Mapping[str, Any]) -> str:
    """One resize as ``numapin status`` shows it: from, to, when, and why it was refused."""
    head = f"resize of {r.get('pod')} container {r.get('container')}"
    when = f"at {r.get('at')}, {r.get('ms')} ms"
    if r.get("result") == "resized":
        return (f"{head}: {r.get('from')} -> {r.get('to')} (CPUs {r.get('cpusFrom') or '-'} -> "
                f"{r.get('cpusTo') or '-'}) {when}")
    return f"{head} {r.get('result')} ({r.get('reason')}) {when}: {r.get('message')}"


# -- sources ------------------------------------------------------------------------------------------------
def _free_per_numa(topology: Topology, state: CPUState, reserved: CPUSet) -> dict[int, int]:
    free = state.default_cpuset - reserved
    return {n: len(free & topology.cpus_in_numa(n)) for n in topology.numa_nodes}


def fetch_proxy_status(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET the proxy's ``/status`` document."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise StatusError(f"{url}: HTTP {e.code}: {e.read().decode(errors='replace')[:300]}") from None
    except (urllib.error.URLError, OSError) as e:
        raise StatusError(f"{url}: cannot reach the proxy's status endpoint: {getattr(e, 'reason', e)}") from None
    except ValueError as e:
        raise StatusError(f"{url}: not JSON: {e}") from None
    if not isinstance(doc, Mapping) or doc.get("kind") != "NumapinProxyStatus":
        raise StatusError(f"{url}: not a numapin proxy status document")
    return dict(doc)


def drift_notes(drift: Any) -> list[str]:
    """The proxy's kubelet drift findings (``/status`` ``kubeletDrift``) as notes, loud."""
    if not isinstance(drift, Mapping):
        return []
    notes = [f"KUBELET DRIFT: {p.get('detail')}" for p in drift.get("problems") or [] if isinstance(p, Mapping)]
    if drift.get("refusingExclusive"):
        notes.append("KUBELET DRIFT: the proxy refuses new exclusive admissions until kubelet's CPU and Memory "
                     "Managers are back on none")
    return notes


def from_proxy_status(doc: Mapping[str, Any], source: str) -> NodeStatus:
    """The proxy's view from its ``/status`` document."""
    try:
        topology = Topology.from_dict(doc["topology"])
        assignments = [Assignment(a["podUID"], a["container"], CPUSet.parse(a["cpus"]), a["mode"])
                       for a in doc["assignments"]]
        refs = {c["podUID"]: c["pod"] for c in doc.get("containers", [])}
        assignments = [Assignment(a.pod_uid, a.container, a.cpus, a.mode, refs.get(a.pod_uid, "")) for a in assignments]
        return NodeStatus(
            node=str(doc["node"]), source=source, topology=topology,
            policy=str(doc["topologyManagerPolicy"]), scope=str(doc["topologyManagerScope"]),
            reserved=CPUSet.parse(doc["reservedCPUs"]), shared_pool=CPUSet.parse(doc["sharedPool"]),
            free_per_numa={int(k): int(v) for k, v in doc["freeCPUsPerNUMA"].items()},
            assignments=assignments,
            bypass_ids=frozenset(c["id"] for c in doc.get("containers", []) if c.get("mode") == "bypass"),
            bypass_known=True,
            notes=([] if doc.get("reconciled", True) else ["the proxy has not reconciled with the runtime yet"])
            + drift_notes(doc.get("kubeletDrift")),
            pod_modes={str(p["pod"] or p["uid"]): str(p["mode"]) for p in doc.get("podModes", [])
                       if p.get("changed")},
            resizes=[dict(r) for r in doc.get("resizes", []) if isinstance(r, Mapping)],
            memory=None if doc.get("memory") is None else MemoryView.from_document(doc["memory"]).with_pods(refs),
        )
    except (KeyError, TypeError, ValueError, AllocatorError) as e:
        raise StatusError(f"{source}: unexpected status document ({type(e).__name__}: {e})") from None


def from_state_dir(state_dir: str | Path, *, sysfs: str = "/sys", nrt_file: str | Path | None = None,
                   reserved: CPUSet | None = None) -> NodeStatus:
    """The proxy's view from its files: the state checkpoint and the published NodeResourceTopology."""
    state_path = ProxyConfig(state_dir=str(state_dir)).state_file
    try:
        state = CheckpointStore(state_path, "numapin").load()
    except AllocatorError as e:
        raise StatusError(str(e)) from None
    if state is None:
        raise StatusError(f"{state_path}: no state file (is --state-dir the proxy's --state-dir?)")
    try:
        topology = Topology.from_sysfs(sysfs)
    except AllocatorError as e:
        raise StatusError(f"--sysfs {sysfs}: {e}") from None
    notes: list[str] = []
    nrt_path = Path(nrt_file) if nrt_file else default_nrt_file(state_dir)
    node, policy, scope = "", "unknown", "unknown"
    free: dict[int, int] | None = None
    try:
        nrt = json.loads(nrt_path.read_text())
    except FileNotFoundError:
        nrt = None
        notes.append(f"{nrt_path}: no published NodeResourceTopology")
    except (OSError, ValueError) as e:
        nrt = None
        notes.append(f"{nrt_path}: cannot read the NodeResourceTopology: {e}")
    if nrt is not None:
        try:
            published = parse_nrt(nrt)
        except AllocatorError as e:
            notes.append(f"{nrt_path}: cannot read the NodeResourceTopology: {e}")
        else:
            node, policy, scope = published.name, published.topology_manager_policy, published.topology_manager_scope
            reserved = reserved if reserved is not None else published.reserved_cpus
            free = {z.numa: z.available for z in published.zones}
    if reserved is not None:
        free = _free_per_numa(topology, state, reserved)
    elif free is None:
        free = {}
    assignments = [Assignment(uid, name, cpus, state.mode(uid, name))
                   for uid, pod in sorted(state.assignments.items()) for name, cpus in sorted(pod.items())]
    return NodeStatus(node=node or "(unknown)", source=f"state files in {state_dir}", topology=topology,
                      policy=policy, scope=scope, reserved=reserved, shared_pool=state.shared_pool(),
                      free_per_numa=free, assignments=assignments, notes=notes, pod_modes=dict(state.pod_modes),
                      memory=_memory_of_state_dir(state_dir))


def _memory_of_state_dir(state_dir: str | Path) -> MemoryView | None:
    """The Memory Manager's view from its file in the state directory (None when there is none, as with
    memoryManagerPolicy None). StatusError when it is there but cannot be read."""
    path = ProxyConfig(state_dir=str(state_dir)).memory_state_file
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StatusError(f"{path}: cannot be read: {e}") from None
    try:
        policy, mem = parse_memory_checkpoint(raw, str(path))
    except AllocatorError as e:
        raise StatusError(str(e)) from None
    return MemoryView.from_document(memory_document(mem, policy))


# -- checking against the runtime -----------------------------------------------------------------------------
def check_runtime(status: NodeStatus, containers: Sequence[RuntimeContainer], *, read_processes: bool = True) -> None:
    """Fill ``status.checked``: every running container of a ready pod (bypassed pods aside) with the CPUs it should
    have and the CPUs it has; pod names of the assignments are filled in from the runtime."""
    by_key = {(a.pod_uid, a.container): a for a in status.assignments}
    refs = {c.pod_uid: c.pod for c in containers}
    status.assignments = [a if a.pod else Assignment(a.pod_uid, a.container, a.cpus, a.mode, refs.get(a.pod_uid, ""))
                          for a in status.assignments]
    if status.memory is not None:
        status.memory = status.memory.with_pods(refs)
    running = set()
    for c in containers:
        if not c.running or not c.sandbox_ready or c.id in status.bypass_ids or (c.bypass and not status.bypass_known):
            continue
        running.add((c.pod_uid, c.name))
        a = by_key.get((c.pod_uid, c.name))
        expected = a.cpus if a is not None else status.shared_pool
        mode = a.mode if a is not None else "shared"
        actual, source = c.cpuset_cpus, "runtime"
        if read_processes and c.pid is not None:
            with contextlib.suppress(OSError, LookupError, ValueError):
                actual, source = process_cpus(c.pid).cpus, f"process {c.pid}"
        status.checked.append(CheckedContainer(c.pod, c.name, c.id, mode, expected, actual, source))
    for a in status.assignments:
        if (a.pod_uid, a.container) not in running:
            status.notes.append(f"pod {a.pod or a.pod_uid} container {a.container} holds CPUs {a.cpus} but is not "
                                "running (kubelet may be restarting it; the proxy releases them when it is removed)")
    status.runtime_checked = True


# -- text ---------------------------------------------------------------------------------------------------
def marks_of(status: NodeStatus) -> tuple[dict[int, str], list[tuple[str, str]]]:
    """One mark per CPU for the drawing: ``*`` reserved, a letter per pinned container, ``.`` the rest."""
    from .render import MARK_LETTERS

    marks: dict[int, str] = {}
    legend: list[tuple[str, str]] = []
    if status.reserved:
        for cpu in status.reserved:
            marks[cpu] = "*"
        legend.append(("*", "reserved"))
    for i, a in enumerate(status.assignments):
        letter = MARK_LETTERS[i % len(MARK_LETTERS)]
        for cpu in a.cpus:
            marks[cpu] = letter
        legend.append((letter, f"{a.pod or a.pod_uid} {a.container} ({a.mode})"))
    legend.append((".", "shared pool only"))
    return marks, legend


def render_text(status: NodeStatus) -> str:
    from .render import render_topology

    topo = status.topology
    out = [f"node {status.node} (from {status.source})",
           f"topology manager: policy {status.policy}, scope {status.scope}; reserved CPUs "
           f"{status.reserved if status.reserved is not None else 'unknown'}"]
    marks, legend = marks_of(status)
    out.append(render_topology(topo, marks=marks, legend=legend))
    out.append("")
    if status.assignments:
        out.append("pinned containers:")
        for a in status.assignments:
            out.append(f"  {a.pod or a.pod_uid} {a.container}: {a.mode}, CPUs {a.cpus}, NUMA node(s) "
                       f"{topo.numa_of(a.cpus)}")
    else:
        out.append("pinned containers: none")
    for pod, mode in sorted(status.pod_modes.items()):
        out.append(f"pod {pod}: CPU mode changed while running, now {mode}")
    for r in status.resizes:
        out.append(resize_line(r))
    out.append(f"shared pool: CPUs {status.shared_pool or '(empty)'}, NUMA node(s) {topo.numa_of(status.shared_pool)}")
    free = ", ".join(f"node {n}: {k}" for n, k in sorted(status.free_per_numa.items())) or "unknown"
    out.append(f"free CPUs per NUMA node: {free}")
    if status.memory is not None:
        out.extend(status.memory.lines())
    if status.runtime_checked:
        bad = status.disagreements
        out.append(f"running containers checked against their real cpuset: {len(status.checked)}, "
                   f"{len(bad)} disagree")
        for c in status.checked:
            verdict = "ok" if c.agrees else "DISAGREES"
            out.append(f"  {verdict:9} {c.pod} {c.name} ({c.mode}): state {c.expected}, real "
                       f"{c.actual if c.actual is not None else 'unknown'} ({c.source})")
    for n in status.notes:
        out.append(f"note: {n}")
    return "\n".join(out)
