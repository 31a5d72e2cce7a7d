"""/validate with nodes that publish memory per NUMA node (``memoryManagerPolicy: Static``, issue 21): a pod whose
memory no candidate node could ever place is denied naming the node, the policy and the numbers; a binding to a
node whose NUMA nodes cannot hold the pod's memory now is denied; nodes publishing ``None`` judge CPUs only."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from allocator.memory.config import MemoryConfig
from allocator.memory.machine import MachineMemory
from allocator.memory.report import nrt_memory, nrt_memory_attributes
from allocator.memory.reserved import parse_reserved_memory
from allocator.node import NodeAllocator, NodeConfig
from allocator.nrt import build_nrt
from tests.webhook.helpers import Client, apply_patch, binding_request, container, make_pod, pod_request
from tests.webhook.nrt_fixtures import machine, node_doc, write_docs
from webhook.app import WebhookApp

GI = 1 << 30
BIG = machine(2, 14)  # 2 NUMA nodes x 28 CPUs


def memory_node(name: str, policy: str, *, held: tuple[int, ...] = (), published_policy: str = "Static"
                ) -> dict[str, Any]:
    """A node as its proxy publishes it: 64Gi per NUMA node, 2 x 1Gi huge pages on node 1 only; ``held``: a
    Guaranteed pod of that many Gi placed per entry (each on one NUMA node), as admitted by the node itself."""
    machine_memory = MachineMemory((
        MachineMemory.uniform((0,), 64 * GI).nodes[0],
        MachineMemory.uniform((1,), 64 * GI, ((GI, 2),)).nodes[0]))
    alloc = NodeAllocator(NodeConfig(
        topology=BIG, reserved_cpus=None, num_reserved_cpus=2, topology_manager_policy=policy,
        memory=MemoryConfig(machine_memory, "Static", parse_reserved_memory("0:memory=100Mi"))))
    for i, gi in enumerate(held):
        pod = make_pod(f"held-{i}", [container("app", "2", f"{gi}Gi")])
        pod["metadata"]["uid"] = f"held-{i}"
        assert alloc.admit_pod(pod).admitted
    state = alloc.memory_state
    assert state is not None
    doc = build_nrt(name, BIG, free_cpus=alloc.shared_pool() - alloc.reserved_cpus, reserved_cpus=alloc.reserved_cpus,
                    topology_manager_policy=policy, memory=nrt_memory(state), memory_manager_policy=published_policy,
                    zone_attributes=nrt_memory_attributes(state))
    return doc


@pytest.fixture
async def nodes(server: WebhookApp, nrt_dir: Path) -> WebhookApp:
    write_docs(nrt_dir / "m-snn.yaml", [memory_node("m-snn", "single-numa-node"), node_doc("m-snn", {"pool": "snn"})])
    write_docs(nrt_dir / "m-be.yaml", [memory_node("m-be", "best-effort"), node_doc("m-be", {"pool": "be"})])
    write_docs(nrt_dir / "m-full.yaml", [memory_node("m-full", "single-numa-node", held=(60, 60)),
                                         node_doc("m-full", {"pool": "full"})])
    write_docs(nrt_dir / "m-off.yaml", [memory_node("m-off", "single-numa-node", published_policy="None"),
                                        node_doc("m-off", {"pool": "off"})])
    for s in server.sources:
        await s.sync()
    return server


async def validate(client: Client, pod: dict[str, Any]) -> dict[str, Any]:
    pod = apply_patch(copy.deepcopy(pod), await client.admit("/mutate", pod_request(copy.deepcopy(pod))))
    return await client.admit("/validate", pod_request(pod, with_uid=True))


async def test_memory_no_numa_node_holds_is_denied_under_single_numa_node(nodes: WebhookApp, client: Client) -> None:
    resp = await validate(client, make_pod("huge", [container("app", "4", "100Gi")], node_selector={"pool": "snn"}))
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    assert "m-snn" in msg and "single-numa-node" in msg and "TopologyAffinityError" in msg
    assert "100Gi of memory" in msg and "memory 100Gi asked" in msg, msg
    # best-effort spreads it over both NUMA nodes, as kubelet would
    resp = await validate(client, make_pod("huge", [container("app", "4", "100Gi")], node_selector={"pool": "be"}))
    assert resp["allowed"] is True
    # a node publishing memoryManagerPolicy None does not judge memory
    resp = await validate(client, make_pod("huge", [container("app", "4", "100Gi")], node_selector={"pool": "off"}))
    assert resp["allowed"] is True


async def test_a_guaranteed_pod_without_cpus_of_its_own_is_judged_by_its_memory(nodes: WebhookApp,
                                                                              client: Client) -> None:
    resp = await validate(client, make_pod("shared", [container("app", "500m", "100Gi")],
                                           node_selector={"pool": "snn"}))
    assert resp["allowed"] is False and "100Gi" in resp["status"]["message"]
    resp = await validate(client, make_pod("fits", [container("app", "500m", "10Gi")],
                                           node_selector={"pool": "snn"}))
    assert resp["allowed"] is True and not resp.get("warnings")


async def test_huge_pages_a_node_has_too_few_of_are_denied(nodes: WebhookApp, client: Client) -> None:
    c = container("app", "2", "1Gi")
    c["resources"]["limits"]["hugepages-1Gi"] = "3Gi"
    c["resources"]["requests"]["hugepages-1Gi"] = "3Gi"
    resp = await validate(client, make_pod("pages", [c], node_selector={"pool": "snn"}))
    assert resp["allowed"] is False and "hugepages-1Gi" in resp["status"]["message"]
    c["resources"]["limits"]["hugepages-1Gi"] = c["resources"]["requests"]["hugepages-1Gi"] = "2Gi"
    resp = await validate(client, make_pod("pages", [c], node_selector={"pool": "snn"}))
    assert resp["allowed"] is True


async def test_binding_to_a_node_whose_memory_is_held_is_denied_with_the_numbers(
        nodes: WebhookApp, client: Client, pods_dir: Path) -> None:
    import yaml

    pod = make_pod("db", [container("db", "2", "10Gi")])
    pod = apply_patch(copy.deepcopy(pod), await client.admit("/mutate", pod_request(copy.deepcopy(pod))))
    req = pod_request(pod, with_uid=True)
    assert (await client.admit("/validate", req))["allowed"] is True  # some node could hold it
    (pods_dir / "default-db.yaml").write_text(yaml.safe_dump(req["object"]))
    for s in nodes.sources:
        await s.sync()
    resp = await client.admit("/validate", binding_request("default", "db", "m-full"))
    assert resp["allowed"] is False
    msg = resp["status"]["message"]
    # kubelet's Memory Manager finds no NUMA node (nor group) with 10Gi free: both hold 60Gi (node 1 also has
    # 2Gi of huge pages)
    assert "m-full" in msg and "[memorymanager]" in msg, msg
    assert "free memory per NUMA node: node-0=3996Mi, node-1=2Gi" in msg, msg
    assert (await client.admit("/validate", binding_request("default", "db", "m-snn")))["allowed"] is True
