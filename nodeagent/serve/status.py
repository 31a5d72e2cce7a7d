"""The proxy's ``/status`` document (JSON, served next to ``/metrics`` by ``http_server``): what ``numapin status``
shows.

Built on the event loop (the allocator and the registry are only touched there), from anything shaped like the
running proxy (``ProxyView``: ``app.CriProxy`` is one) — this module does not import the app.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Protocol

from allocator.memory.report import memory_document
from allocator.node import NodeAllocator, NodeConfig
from nodeagent.decisions.mode_apply import ModeApplier
from nodeagent.decisions.registry import Registry
from nodeagent.decisions.resize import Resizer
from nodeagent.node.kubelet_watch import KubeletWatch

__all__ = ["STATUS_VERSION", "ProxyView", "StatusConfig", "status_document"]

STATUS_VERSION = 1


class StatusConfig(Protocol):
    """What the document says of the agent's configuration (``criproxy.config.ProxyConfig`` is one)."""

    @property
    def node_name(self) -> str: ...
    @property
    def listen(self) -> str: ...
    @property
    def runtime_endpoint(self) -> str: ...
    @property
    def state_file(self) -> Path: ...
    @property
    def nrt_path(self) -> Path: ...


class ProxyView(Protocol):
    """What the status document is made of (the running proxy's parts)."""

    @property
    def config(self) -> StatusConfig: ...
    @property
    def node_config(self) -> NodeConfig: ...
    @property
    def allocator(self) -> NodeAllocator: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def reconciled(self) -> asyncio.Event: ...
    @property
    def modes(self) -> ModeApplier: ...
    @property
    def resizer(self) -> Resizer: ...
    @property
    def kubelet(self) -> KubeletWatch: ...


def status_document(proxy: ProxyView) -> dict[str, Any]:
    """A snapshot of the proxy's view of the node (call on the proxy's event loop). The values are new objects
    (strings, numbers, lists and dicts of them): the document may be encoded in another thread."""
    cfg = proxy.config
    nc = proxy.node_config
    alloc = proxy.allocator
    state = alloc.state
    assignments = [
        {"podUID": uid, "container": name, "cpus": str(cpus), "mode": state.mode(uid, name)}
        for uid, pod in sorted(state.assignments.items()) for name, cpus in sorted(pod.items())
    ]
    containers = [
        {"id": t.id, "sandboxId": t.sandbox_id, "podUID": t.pod_uid, "pod": t.pod_ref, "name": t.name,
         "mode": t.mode, "cpus": None if t.cpus is None else str(t.cpus),
         "mems": None if t.mems is None else str(t.mems), "exited": t.exited}
        for t in sorted(proxy.registry.containers.values(), key=lambda t: (t.pod_ref, t.name, t.id))
    ]
    return {
        "kind": "NumapinProxyStatus",
        "version": STATUS_VERSION,
        "node": cfg.node_name,
        "listen": cfg.listen,
        "runtimeEndpoint": cfg.runtime_endpoint,
        "stateFile": str(cfg.state_file),
        "nrtFile": str(cfg.nrt_path),
        "reconciled": proxy.reconciled.is_set(),
        "topologyManagerPolicy": nc.topology_manager_policy,
        "topologyManagerScope": nc.topology_manager_scope,
        "topologyManagerPolicyOptions": dict(nc.topology_manager_policy_options),
        "cpuManagerPolicyOptions": dict(nc.cpu_manager_policy_options),
        "topology": nc.topology.to_dict(),
        "reservedCPUs": str(alloc.reserved_cpus),
        "sharedPool": str(alloc.shared_pool()),
        "freeCPUsPerNUMA": {str(n): k for n, k in alloc.free_cpus_per_numa().items()},
        "assignments": assignments,
        "containers": containers,
        # every pod's CPU mode (``changed``: set while it ran, see nodeagent.decisions.mode_apply)
        "podModes": proxy.modes.modes(),
        # kubelet's in-place resizes, newest last (see nodeagent.decisions.resize)
        "resizes": proxy.resizer.recent(),
        # what the proxy sees of kubelet's configuration (nodeagent.node.kubelet_drift)
        "kubeletDrift": {"checked": proxy.kubelet.checked, **proxy.kubelet.report.to_dict()},
        # the Memory Manager's tables per NUMA node and who holds what (None: memoryManagerPolicy None)
        "memory": None if alloc.memory_state is None else memory_document(alloc.memory_state),
        # the door's own state (the NRI plugin: its connection to the runtime; None for the proxy)
        "door": door() if callable(door := getattr(proxy, "door_status", None)) else None,
    }

