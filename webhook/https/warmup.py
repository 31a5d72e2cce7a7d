"""Warm-up before /readyz says ready: one synthetic review through each decision path, in process.

The first review of each kind pays for what is done once: code paths run for the first time, the simulator's and
the quantities' caches empty, the body parser's and the answer encoder's first use. ``warm_up`` sends one pod CREATE
through /mutate's path and the mutated pod through /validate's (body parsing, review parsing, decision, answer
encoding, exactly as the server does, without HTTP), and simulates the pod on one known node as a binding would.
Nothing is counted in the request metrics, nothing is remembered as a bound pod and no pod is looked up: the pod is
made up (namespace ``numapin-warmup``) and never reaches the pod cache or the API server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from allocator.pod import PodInfo
from webhook.admission.mutate import mutate_pod
from webhook.admission.review import AdmissionRequest, Verdict, json_bytes, parse_review, respond
from webhook.admission.simulate import Simulator
from webhook.cluster.nodes import NodeStore
from webhook.https.request_body import BodyParser

__all__ = ["WarmedUp", "warm_up", "warmup_pod"]

Decide = Callable[[AdmissionRequest], Awaitable[Verdict]]


@dataclass(frozen=True)
class WarmedUp:
    seconds: float
    verdicts: tuple[str, ...]   # the labels of the synthetic mutate and validate verdicts


def warmup_pod() -> dict[str, Any]:
    """A Guaranteed pod in exclusive mode: an init container, a native sidecar and two app containers, one with a
    whole CPU (the shape of most pinned pods)."""
    def container(name: str, cpu: str) -> dict[str, Any]:
        res = {"cpu": cpu, "memory": "64Mi"}
        return {"name": name, "image": "numapin.invalid/warmup:0", "resources": {"requests": res, "limits": res}}

    sidecar = container("sidecar", "100m")
    sidecar["restartPolicy"] = "Always"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "warmup", "namespace": "numapin-warmup",
                         "annotations": {"qos.gocrane.io/cpu-manager": "exclusive"}},
            "spec": {"initContainers": [container("init", "1"), sidecar],
                     "containers": [container("app", "1"), container("helper", "200m")]}}


def _review(operation_object: dict[str, Any], uid: str) -> bytes:
    request = {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "numapin-warmup",
               "name": "warmup", "operation": "CREATE", "object": operation_object, "oldObject": None,
               "dryRun": True, "userInfo": {"username": "numapin:warmup"}}
    return json_bytes({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})


async def _through(parser: BodyParser, decide: Decide, body: bytes) -> str:
    req = parse_review(await parser.parse([body]))
    verdict = await decide(req)
    json_bytes(respond(req, verdict))
    return verdict.label


async def warm_up(*, parser: BodyParser, mutate: Decide, validate: Decide, nodes: NodeStore,
                  simulator: Simulator) -> WarmedUp:
    started = time.perf_counter()
    pod = warmup_pod()
    labels = [await _through(parser, mutate, _review(pod, "numapin-warmup-mutate"))]
    stored, _ = mutate_pod(pod)
    stored["metadata"]["uid"] = "numapin-warmup-pod"
    labels.append(await _through(parser, validate, _review(stored, "numapin-warmup-validate")))
    names = nodes.names()
    node = nodes.get(names[0]) if names else None
    if node is not None:  # a binding's simulation with the node's free CPUs
        info = PodInfo.from_pod(stored)
        if simulator.cached(node, info, occupied=True) is None:
            await asyncio.to_thread(simulator.admit, node, info, occupied=True)
    return WarmedUp(seconds=time.perf_counter() - started, verdicts=tuple(labels))
