"""NodeResourceTopology documents of the ecosystem's exporters, judged by the webhook.

The documents are shaped as NFD's topology-updater and the resource-topology-exporter publish them for a node whose
kubelet runs the CPU manager policy ``none`` (numapin's set-up): zones ``node-<n>`` of type ``Node`` with ``costs``
and ``cpu``, ``memory``, ``hugepages-*`` (and device) resources whose allocatable equals capacity, top-level
attributes ``topologyManagerPolicy``/``topologyManagerScope`` and the pod fingerprint (NFD, RTE), or only the
deprecated ``topologyPolicies`` (older RTE), object metadata as the API server returns it, and no numapin attribute.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from allocator.nrt import parse_nrt
from tests.webhook.helpers import Client, apply_patch, binding_request, container, make_pod, pod_request
from tests.webhook.nrt_fixtures import write_docs
from webhook.admission.synthetic_node import synthetic_reserved, synthetic_topology
from webhook.app import WebhookApp

GIB = 1024**3


def _meta(node: str) -> dict[str, Any]:
    return {"name": node, "uid": "3f0c2a7e-5b7c-4d7e-9a57-8f1de0b1c001", "resourceVersion": "48213",
            "generation": 7, "creationTimestamp": "2026-11-02T09:14:03Z",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                 "uid": "9a1c4d2e-0f3b-4e5a-8c6d-7b2e1f0a9c11"}]}


def _zone(n: int, nodes: int, cpus: int, *, allocatable: int | None = None, available: int | None = None,
          devices: dict[str, int] | None = None) -> dict[str, Any]:
    alloc = cpus if allocatable is None else allocatable
    avail = alloc if available is None else available
    mem = 64 * GIB
    resources: list[dict[str, Any]] = [
        {"name": "cpu", "capacity": str(cpus), "allocatable": str(alloc), "available": str(avail)},
        {"name": "memory", "capacity": str(mem), "allocatable": str(mem - GIB), "available": str(mem - GIB)},
        {"name": "hugepages-1Gi", "capacity": "0", "allocatable": "0", "available": "0"},
        {"name": "hugepages-2Mi", "capacity": "1Gi", "allocatable": "1Gi", "available": "1Gi"},
    ]
    for name, count in (devices or {}).items():
        resources.append({"name": name, "capacity": str(count), "allocatable": str(count), "available": str(count)})
    return {"name": f"node-{n}", "type": "Node",
            "costs": [{"name": f"node-{m}", "value": 10 if m == n else 21} for m in range(nodes)],
            "resources": resources}


def nfd_nrt(node: str, *, cpus_per_numa: int = 28, numa: int = 2, policy: str = "single-numa-node",
            scope: str = "container", **zone: Any) -> dict[str, Any]:
    """As NFD's topology-updater publishes it (v1alpha2, attributes from the kubelet configuration)."""
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": _meta(node),
            "attributes": [{"name": "topologyManagerPolicy", "value": policy},
                           {"name": "topologyManagerScope", "value": scope},
                           {"name": "nodeTopologyPodsFingerprint", "value": "pfp0v0013a8d2f6c19b7e4a0"}],
            "zones": [_zone(n, numa, cpus_per_numa, **zone) for n in range(numa)]}


def rte_nrt(node: str, *, cpus_per_numa: int = 28, numa: int = 2, legacy_only: bool = False) -> dict[str, Any]:
    """As the resource-topology-exporter publishes it: the deprecated topologyPolicies too, a device per zone; an
    older one only topologyPolicies."""
    doc: dict[str, Any] = {
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology", "metadata": _meta(node),
        "topologyPolicies": ["SingleNUMANodeContainerLevel"],
        "zones": [_zone(n, numa, cpus_per_numa, devices={"example.com/nic": 4}) for n in range(numa)]}
    if not legacy_only:
        doc["attributes"] = [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                             {"name": "topologyManagerScope", "value": "container"},
                             {"name": "nodeTopologyPodsFingerprint", "value": "pfp0v001c4e1a97b20d35f68"},
                             {"name": "nodeTopologyPodsFingerprintMethod", "value": "with-exclusive-resources"}]
    return doc


@pytest.mark.parametrize("doc", [nfd_nrt("w"), rte_nrt("w"), rte_nrt("w", legacy_only=True)],
                         ids=["nfd", "rte", "rte-legacy"])
def test_exporter_documents_parse_with_their_assumptions(doc: dict[str, Any]) -> None:
    n = parse_nrt(doc)
    assert (n.topology_manager_policy, n.topology_manager_scope) == ("single-numa-node", "container")
    assert [(z.numa, z.capacity, z.allocatable, z.available, z.reserved) for z in n.zones] == [
        (0, 28, 28, 28, 0), (1, 28, 28, 28, 0)]
    assert n.zones[0].distances == {0: 10, 1: 21}
    said = "; ".join(n.assumptions)
    assert "no numapin attributes" in said
    assert "reserved CPUs = capacity - allocatable (node-0: 0, node-1: 0)" in said
    assert "one thread per core" in said
    assert ("deprecated topologyPolicies SingleNUMANodeContainerLevel" in said) == ("attributes" not in doc)


def test_reserved_cpus_are_derived_from_allocatable() -> None:
    n = parse_nrt(nfd_nrt("w", allocatable=26, available=20))
    assert [z.reserved for z in n.zones] == [2, 2] and n.largest_numa is not None
    assert n.largest_numa.allocatable == 26
    assert "reserved CPUs = capacity - allocatable (node-0: 2, node-1: 2)" in n.assumptions
    topo = synthetic_topology(n)
    assert len(synthetic_reserved(n, topo)) == 4


def test_numapins_own_documents_assume_nothing(tmp_path: Path) -> None:
    from tests.webhook.nrt_fixtures import machine, nrt

    assert parse_nrt(nrt("w", machine(2, 4), reserved="0")).assumptions == ()


@pytest.fixture
async def exporters(server: WebhookApp, nrt_dir: Path, caplog: pytest.LogCaptureFixture) -> WebhookApp:
    caplog.set_level(logging.INFO, logger="numapin")
    write_docs(nrt_dir / "nfd.yaml", [nfd_nrt("nfd-node")])
    write_docs(nrt_dir / "rte.yaml", [rte_nrt("rte-node", legacy_only=True)])
    for s in server.sources:
        await s.sync()
    return server


async def _create(client: Client, pod: dict[str, Any], *, allowed: bool = True, pods_dir: Path | None = None
                  ) -> dict[str, Any]:
    """Mutate and validate as kube-apiserver does; an allowed pod is stored (in the webhook's --pods-dir, which it
    reads on a cache miss as it reads a pod from the API server)."""
    pod = apply_patch(copy.deepcopy(pod), await client.admit("/mutate", pod_request(copy.deepcopy(pod))))
    req = pod_request(pod, with_uid=True)
    resp = await client.admit("/validate", req)
    assert resp["allowed"] is allowed, resp
    if allowed and pods_dir is not None:
        meta = req["object"]["metadata"]
        (pods_dir / f"{meta['namespace']}-{meta['name']}.yaml").write_text(yaml.safe_dump(req["object"]))
    return resp


@pytest.mark.parametrize("node", ["nfd-node", "rte-node"])
async def test_binding_to_an_exporters_node_is_judged(exporters: WebhookApp, client: Client, node: str,
                                                      pods_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Under single-numa-node with 28 CPUs per NUMA node (zero reserved), a 30-CPU container is refused and a
    20-CPU one admitted; the denial says what was assumed."""
    await _create(client, make_pod(f"fits-{node}", [container("app", "20")], node_selector={"x": "y"}),
                  pods_dir=pods_dir)
    await _create(client, make_pod(f"big-{node}", [container("app", "30")], node_selector={"x": "y"}),
                  pods_dir=pods_dir)
    resp = await client.admit("/validate", binding_request("default", f"fits-{node}", node))
    assert resp["allowed"] is True and not resp.get("warnings"), resp
    resp = await client.admit("/validate", binding_request("default", f"big-{node}", node))
    assert resp["allowed"] is False, resp
    msg = resp["status"]["message"]
    assert f"node {node} would reject pod default/big-{node}" in msg and "TopologyAffinityError" in msg
    assert "assuming: no numapin attributes" in msg and "node-0: 0, node-1: 0" in msg
    assert "cannot be simulated" not in caplog.text
    # the assumptions are logged when the document is loaded, once per node (not per judgement, not per re-read)
    write_docs(Path(exporters.opts.nrt_dir) / "nfd.yaml", [nfd_nrt("nfd-node")])  # re-read
    for s in exporters.sources:
        await s.sync()
    logged = [r.getMessage() for r in caplog.get_records("setup") + caplog.get_records("call")
              if "leaves things out" in r.getMessage() and r.getMessage().startswith(f"node {node}:")]
    assert len(logged) == 1 and "reserved CPUs = capacity - allocatable (node-0: 0, node-1: 0)" in logged[0]


async def test_pod_no_exporters_node_could_ever_admit_is_denied(exporters: WebhookApp, client: Client) -> None:
    resp = await _create(client, make_pod("huge", [container("app", "30")]), allowed=False)
    msg = resp["status"]["message"]
    assert resp["status"]["code"] == 403 and "no known node can ever admit pod default/huge (2 candidate" in msg
    assert "has 28 allocatable CPUs" in msg and "assuming:" in msg
    await _create(client, make_pod("ok", [container("app", "28")]))


def test_random_exporter_documents_are_parsed_and_simulated() -> None:
    """Seeded random documents of the exporters' shape (1-8 NUMA nodes, any policy and scope, allocatable <=
    capacity, available <= allocatable, attributes or only topologyPolicies or nothing, costs or none, extra
    resources): every one parses, and the simulation of a random pod on it is known (judged, never "cannot be
    simulated")."""
    import random

    from allocator.pod import PodInfo
    from webhook.admission.simulate import Simulator

    rng = random.Random(20261123)
    sim = Simulator()
    policies = ["none", "best-effort", "restricted", "single-numa-node"]
    legacy = {"none": "None", "best-effort": "BestEffort", "restricted": "Restricted",
              "single-numa-node": "SingleNUMANodeContainerLevel"}
    for i in range(150):
        numa = rng.randint(1, 8)
        policy, scope = rng.choice(policies), rng.choice(["container", "pod"])
        zones = []
        for n in range(numa):
            cap = rng.randint(1, 64)
            alloc = rng.randint(0, cap) if rng.random() < 0.3 else cap
            zone = _zone(n, numa, cap, allocatable=alloc, available=rng.randint(0, alloc),
                         devices={"example.com/gpu": 1} if rng.random() < 0.3 else None)
            if rng.random() < 0.3:
                del zone["costs"]
            zones.append(zone)
        doc: dict[str, Any] = {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
                               "metadata": _meta(f"n{i}"), "zones": zones}
        form = rng.choice(["attributes", "legacy", "both", "nothing"])
        if form in ("attributes", "both"):
            doc["attributes"] = [{"name": "topologyManagerPolicy", "value": policy},
                                 {"name": "topologyManagerScope", "value": scope}]
        if form in ("legacy", "both"):
            doc["topologyPolicies"] = [legacy[policy]]
        node = parse_nrt(doc)
        assert node.assumptions and "no numapin attributes" in node.assumptions[0]
        cpus = rng.randint(1, 70)
        pod = PodInfo.from_pod(make_pod("p", [container("app", str(cpus))]))
        for occupied in (False, True):
            answer = sim.admit(node, pod, occupied=occupied)
            assert answer.known, (doc, answer)
            room = node.total_available if occupied else node.total_allocatable
            assert not answer.admitted or cpus <= room, (doc, cpus, occupied, answer)
            largest = max(z.available if occupied else z.allocatable for z in node.zones)
            if form != "nothing" and policy == "single-numa-node" and cpus > largest:
                assert not answer.admitted, (doc, cpus, occupied, answer)
        assert node.topology_manager_policy == (policy if form != "nothing" else "none")
