"""``/validate``, pods/binding CREATE: would the target node's topology manager admit the pod?

The Binding names the pod and the node only; the pod comes from the ``PodCache``, the node from its
NodeResourceTopology. The node is simulated with its current free CPUs (``Simulator``); a binding the node would
reject is denied, so the pod stays Pending and the scheduler tries again (with back-off, or at once when a node is
added) instead of kubelet failing the pod after binding. Whatever cannot be judged (pod not cached, node without
topology, node configuration numapin cannot emulate) is allowed and logged: the node proxy remains the backstop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from .nodes import NodeStore
from .pods_cache import PodCache
from .review import AdmissionRequest, Verdict
from .simulate import Simulator
from .validate import pinned

__all__ = ["BindingValidator"]

log = logging.getLogger("numapin.webhook.binding")


class BindingValidator:
    def __init__(self, nodes: NodeStore, pods: PodCache, simulator: Simulator) -> None:
        self.nodes = nodes
        self.pods = pods
        self.simulator = simulator

    async def validate(self, req: AdmissionRequest) -> Verdict:
        obj = req.object
        if req.operation != "CREATE" or not isinstance(obj, Mapping):
            log.info("binding: not handled, allowed: %s", req.describe())
            return Verdict.allow()
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        target = obj.get("target")
        target = target if isinstance(target, Mapping) else {}
        namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else req.namespace
        name = meta.get("name") if isinstance(meta.get("name"), str) else req.name
        node_name = target.get("name")
        if target.get("kind", "Node") != "Node" or not isinstance(node_name, str) or not node_name:
            log.info("binding: target is not a node, allowed: %s", req.describe())
            return Verdict.allow()

        cached = self.pods.get(namespace or "", name or "")
        if cached is None:
            log.warning("binding of %s/%s to %s allowed unchecked: pod not in the cache", namespace, name, node_name)
            return Verdict.allow(f"numapin: pod {namespace}/{name} not known to the webhook; binding not checked")
        want_uid = meta.get("uid")
        if isinstance(want_uid, str) and want_uid and cached.uid and cached.uid != want_uid:
            log.warning("binding of %s/%s allowed unchecked: cached pod has uid %s, binding names %s",
                        namespace, name, cached.uid, want_uid)
            return Verdict.allow()
        info = cached.info
        if not pinned(info):
            return Verdict.allow()
        node = self.nodes.get(node_name)
        if node is None:
            log.info("binding of %s/%s to %s allowed unchecked: no NodeResourceTopology for the node",
                     namespace, name, node_name)
            return Verdict.allow()

        answer = self.simulator.cached(node, info, occupied=True)
        if answer is None:
            answer = await asyncio.to_thread(self.simulator.admit, node, info, occupied=True)
        if answer.admitted:
            return Verdict.allow()
        free = ", ".join(f"node-{z.numa}={z.available}" for z in node.zones)
        why = f"{answer.reason}: {answer.message}" if answer.reason else answer.message
        return Verdict.deny(
            f"node {node_name} would reject pod {namespace}/{name} ({why}); topology manager policy "
            f"{node.topology_manager_policy}, scope {node.topology_manager_scope}, free CPUs per NUMA node: {free}",
            reason="Forbidden")
