"""The proxy's ``/status`` document (JSON, served next to ``/metrics``): what ``numapin status`` shows.

Built on the event loop (the allocator and the registry are only touched there); the metrics server's thread
asks for it with ``status_from_thread``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import CriProxy

__all__ = ["STATUS_VERSION", "status_document", "status_from_thread"]

STATUS_VERSION = 1


def status_document(proxy: CriProxy) -> dict[str, Any]:
    """A snapshot of the proxy's view of the node (call on the proxy's event loop)."""
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
        # every pod's CPU mode (``changed``: set while it ran, see criproxy.mode_apply)
        "podModes": proxy.modes.modes(),
    }


def status_from_thread(proxy: CriProxy, loop: asyncio.AbstractEventLoop, timeout: float = 10.0) -> dict[str, Any]:
    """``status_document`` from another thread (the metrics server's), computed on ``loop``."""

    async def build() -> dict[str, Any]:
        return status_document(proxy)

    return asyncio.run_coroutine_threadsafe(build(), loop).result(timeout)
