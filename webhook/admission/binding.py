"""``/validate``, pods/binding CREATE: would the target node's topology manager admit the pod?

The Binding names the pod and the node only; the pod comes from the ``PodCache`` (or, on a miss, from the API server:
``PodFinder``), the node from its NodeResourceTopology. The node is simulated with its current free CPUs
(``Simulator``); a binding the node would reject is denied, so the pod stays Pending and the scheduler tries again
(with back-off, or at once when a node is added) instead of kubelet failing the pod after binding. What cannot be
judged (pod not found, node without topology, node configuration numapin cannot emulate) follows the operator's
``--unjudged`` rule (``unjudged.UnjudgedRule``: allowed with a warning by default, or denied).

The published free CPUs lag behind bindings (the node proxy publishes once the containers exist), and the
scheduler, which does not see NUMA nodes, may bind several pods to a node in quick succession. So the validator
remembers the pinned pods whose binding it allowed to each node, and admits them on the simulated node before the
pod being judged, until the node publishes a new topology (a new ``numapinStateVersion``, or other free CPUs) or
``pending_seconds`` pass. This is per replica (each
replica sees the bindings routed to it).

``BindingValidator.fit`` is the judgement of one node for one pod; kube-scheduler's extender filter
(``extender_filter``) asks it for every candidate node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from allocator.memory.quantity_text import ByteQuantity
from allocator.nrt import NodeTopology
from allocator.pod import PodInfo
from webhook.admission.review import AdmissionRequest, Verdict
from webhook.admission.simulate import Simulation, Simulator
from webhook.admission.unjudged import UnjudgedRule
from webhook.admission.validate import assumption_note, judged, pinned
from webhook.cluster.nodes import NodeStore
from webhook.cluster.pods_cache import PodFinder

__all__ = ["BindingValidator", "Fit", "FitOutcome", "binding_pod", "refusal"]

log = logging.getLogger("numapin.webhook.binding")


def binding_pod(req: AdmissionRequest, meta: Mapping[str, Any]) -> tuple[str, str]:
    """The bound pod's namespace and name: the Binding's metadata, else the request's (kube-apiserver sends the
    pod's name as the request's ``name``, from the URL ``pods/<name>/binding``; the Binding's own metadata.name
    may be empty)."""

    def first(*values: Any) -> str:
        return next((v for v in values if isinstance(v, str) and v), "")

    return first(meta.get("namespace"), req.namespace), first(meta.get("name"), req.name)


FitOutcome = Literal["fits", "rejects", "no_topology", "unsupported", "not_judged"]


@dataclass(frozen=True)
class Fit:
    """A node's answer for a pod: ``fits``, ``rejects`` (``message`` says why), ``no_topology`` (the node publishes
    no NodeResourceTopology), ``unsupported`` (its configuration cannot be simulated: ``message``), ``not_judged``
    (no node's topology manager could refuse the pod: nothing pinned, no memory placed where it is published)."""

    outcome: FitOutcome
    message: str = ""
    node: NodeTopology | None = None


@dataclass(frozen=True)
class _Pending:
    at: float
    pod: tuple[str, str]
    info: PodInfo
    node_state: Any


class BindingValidator:
    def __init__(self, nodes: NodeStore, pods: PodFinder, simulator: Simulator, unjudged: UnjudgedRule, *,
                 pending_seconds: float = 60.0) -> None:
        self.nodes = nodes
        self.pods = pods
        self.unjudged = unjudged
        self.simulator = simulator
        self.pending_seconds = pending_seconds
        self._pending: dict[str, list[_Pending]] = {}
        self._calls = 0

    def pending(self, node: str) -> list[_Pending]:
        return list(self._pending.get(node, ()))

    def _expire(self, now: float) -> None:
        for node in list(self._pending):
            live = [p for p in self._pending[node] if now - p.at < self.pending_seconds]
            if live:
                self._pending[node] = live
            else:
                del self._pending[node]

    def _prior(self, node_name: str, node_state: Any, key: tuple[str, str]) -> tuple[PodInfo, ...]:
        now = time.monotonic()
        self._calls += 1
        if self._calls % 1024 == 0:
            self._expire(now)
        live = [p for p in self._pending.get(node_name, ())
                if now - p.at < self.pending_seconds and p.node_state == node_state and p.pod != key]
        if live:
            self._pending[node_name] = live
        else:
            self._pending.pop(node_name, None)
        return tuple(p.info for p in live)

    async def validate(self, req: AdmissionRequest) -> Verdict:
        obj = req.object
        if req.operation != "CREATE" or not isinstance(obj, Mapping):
            log.info("binding: not handled, allowed: %s", req.describe())
            return Verdict.allow()
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        target = obj.get("target")
        target = target if isinstance(target, Mapping) else {}
        namespace, name = binding_pod(req, meta)
        node_name = target.get("name")
        if target.get("kind", "Node") != "Node" or not isinstance(node_name, str) or not node_name:
            log.info("binding: target is not a node, allowed: %s", req.describe())
            return Verdict.allow()

        want_uid = meta.get("uid") if isinstance(meta.get("uid"), str) else None
        cached, how = await self.pods.find(namespace, name, want_uid)
        if cached is None:
            reason = "pod_unreadable" if how == "unreadable" else "pod_unknown"
            why = {"not_found": "not found in the pod cache nor by the API server",
                   "unreadable": "its resources cannot be read by numapin",
                   "failed": "not in the pod cache, and reading it from the API server failed or timed out"}.get(
                       how, how)
            return self.unjudged.verdict("validate", reason,
                                         f"binding of pod {namespace}/{name} to node {node_name} not checked: the pod "
                                         f"is {why}" if how != "unreadable" else
                                         f"binding of pod {namespace}/{name} to node {node_name} not checked: {why}")
        if want_uid and cached.uid and cached.uid != want_uid:
            log.info("binding of %s/%s allowed: the pod has uid %s, the binding names %s (the API server refuses it)",
                     namespace, name, cached.uid, want_uid)
            return Verdict.allow()
        info = self.simulator.gated(cached.info)
        if (info.namespace, info.name) != (namespace, name):
            info = replace(info, namespace=namespace, name=name)  # messages name the pod as the binding does
        fit = await self.fit(info, node_name)
        if fit.outcome == "not_judged":
            return Verdict.allow()
        if fit.outcome == "no_topology":
            return self.unjudged.verdict("validate", "node_unknown",
                                         f"binding of pod {namespace}/{name} to node {node_name} not checked: the node "
                                         "has no NodeResourceTopology")
        if fit.outcome == "unsupported":
            return self.unjudged.verdict("validate", "node_unsupported",
                                         f"binding of pod {namespace}/{name} to node {node_name} not checked: "
                                         f"{fit.message}")
        if fit.outcome == "fits":
            if not req.dry_run:
                assert fit.node is not None
                self._pending.setdefault(node_name, []).append(
                    _Pending(time.monotonic(), (namespace, name), info, fit.node.publication_key))
            return Verdict.allow()
        return Verdict.deny(fit.message, reason="Forbidden")

    async def fit(self, info: PodInfo, node_name: str) -> Fit:
        """Would ``node_name``, as it publishes its topology now (with the pods whose binding to it was just allowed),
        admit ``info``? The binding check and the scheduler extender's filter (``extender_filter``) ask the same."""
        if not judged(info):
            return Fit("not_judged")
        node = self.nodes.get(node_name)
        if node is None:
            # memory alone is judged only on nodes publishing it
            return Fit("no_topology" if pinned(info) else "not_judged")
        key = (info.namespace, info.name)
        prior = self._prior(node_name, node.publication_key, key)
        answer = self.simulator.cached(node, info, occupied=True, prior=prior)
        if answer is None:
            answer = await asyncio.to_thread(self.simulator.admit, node, info, occupied=True, prior=prior)
        if not answer.known:
            return Fit("unsupported", answer.message or "the node configuration cannot be simulated", node)
        if answer.admitted:
            return Fit("fits", node=node)
        return Fit("rejects", refusal(node, info, answer, len(prior)), node)


def refusal(node: NodeTopology, info: PodInfo, answer: Simulation, prior: int) -> str:
    """Why ``node`` would reject the pod: kubelet's reason, the node's policy and free CPUs (and memory)."""
    free = ", ".join(f"node-{z.numa}={z.available}" for z in node.zones)
    if node.memory_manager_policy != "None" and any("memory" in z.memory for z in node.zones):
        free += "; free memory per NUMA node: " + ", ".join(
            f"node-{z.numa}={ByteQuantity(z.memory['memory'][2], True)}"
            for z in node.zones if "memory" in z.memory)
    also = f"; counting {prior} pod(s) just bound to it" if prior else ""
    why = f"{answer.reason}: {answer.message}" if answer.reason else answer.message
    return (f"node {node.name} would reject pod {info.namespace}/{info.name} ({why}); topology manager policy "
            f"{node.topology_manager_policy}, scope {node.topology_manager_scope}, free CPUs per NUMA node: "
            f"{free}{also}{assumption_note(node)}")
