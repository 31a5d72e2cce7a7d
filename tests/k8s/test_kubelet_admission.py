"""numapin's webhook registered with the real API server as manifests/webhook registers it (its rules,
matchConditions and failure policies; called by URL on loopback with its own CA, as ``numapin certs --ip-address``
makes it), reading the NodeResourceTopology the real node's proxy publishes: a pod is stamped with its CPU intent
and pinned by kubelet's runtime calls, and a pod no node can hold is denied at admission with numapin's reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from allocator.cpuset import CPUSet
from numapin_lab.k8s import manifests
from numapin_lab.k8s.lab_node import LabNode
from numapin_lab.k8s.webhook_process import WebhookProcess
from tests.k8s.kube_pods import Pods, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.kubelet]

WEBHOOK_USER = "system:serviceaccount:numapin:numapin-webhook"  # the identity manifests/webhook/rbac.yaml binds


@pytest.fixture(scope="module")
def webhook(kubelet_node: LabNode) -> Iterator[WebhookProcess]:
    """numapin's webhook registered for this module's stories (removed at its end: the API server is shared)."""
    cp = kubelet_node.cp
    assert kubelet_node.dir is not None
    manifests.apply(cp, manifests.docs(manifests.WEBHOOK_RBAC))
    (kubelet_node.dir / "webhook").mkdir()
    hook = WebhookProcess(cp, kubelet_node.dir / "webhook", user=WEBHOOK_USER)
    try:
        hook.start()
        manifests.apply(cp, manifests.webhook_configurations_by_url(hook.url, hook.ca_pem))
        yield hook
    finally:
        cp.kubectl("delete", "--ignore-not-found", "mutatingwebhookconfiguration/numapin",
                   "validatingwebhookconfiguration/numapin", check=False)
        hook.stop()


def _free_cpus(pods: Pods) -> int | None:
    """The node's NodeResourceTopology as published: the CPUs its zones have available."""
    r = pods.cp.kubectl("get", "noderesourcetopologies", pods.node.name, "-o", "json", check=False)
    if r.returncode != 0:
        return None
    nrt: dict[str, Any] = json.loads(r.stdout)
    return sum(int(res["available"]) for zone in nrt.get("zones", []) for res in zone.get("resources", [])
               if res["name"] == "cpu")


def test_a_pod_gets_its_intent_at_admission_and_the_published_topology_follows(webhook: WebhookProcess,
                                                                                pods: Pods) -> None:
    wait_for(lambda: _free_cpus(pods) == 1, "the node's topology published with CPU 1 available")
    g = pods.create(pods.manifest("adm-g", cpu="1", cpu_limit="1"))
    assert "numapin.io/cpu-intent" in g["metadata"]["annotations"], g["metadata"]
    assert pods.cpus(g) == CPUSet.parse("1"), pods.kernel(g)
    wait_for(lambda: _free_cpus(pods) == 0, "the published topology without CPU 1")


def test_a_pod_no_node_can_hold_is_denied_at_admission(webhook: WebhookProcess, pods: Pods) -> None:
    manifest = pods.manifest("adm-too-big", cpu="2", cpu_limit="2")
    r = pods.cp.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(manifest), check=False)
    assert r.returncode != 0
    assert ('admission webhook "validate.pods.numapin.io" denied the request: no known node can ever admit pod '
            "default/adm-too-big") in r.stderr, r.stderr
    assert "the largest NUMA node (node-0) has 1 allocatable CPUs" in r.stderr, r.stderr  # from the published NRT
    assert pods.cp.kubectl("get", "pod", "adm-too-big", check=False).returncode != 0
