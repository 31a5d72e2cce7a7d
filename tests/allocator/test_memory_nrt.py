"""NodeResourceTopology zones with ``memory`` and ``hugepages-<size>`` (allocator.nrt with allocator.memory)."""

from __future__ import annotations

import pytest

from allocator import NodeAllocator, NodeConfig
from allocator.errors import TopologyError
from allocator.memory import MachineMemory, parse_reserved_memory
from allocator.memory.config import MemoryConfig
from allocator.memory.report import nrt_memory
from allocator.nrt import build_nrt, parse_nrt
from tests.allocator.memory_tables import GI, MI, container, pod
from tests.topologies import xeon_gold_6258r


def _node() -> NodeAllocator:
    machine = MachineMemory.uniform((0, 1), 64 * GI, ((2 * MI, 1024), (GI, 2)))
    return NodeAllocator(NodeConfig(topology=xeon_gold_6258r(), num_reserved_cpus=2,
                                    topology_manager_policy="single-numa-node",
                                    memory=MemoryConfig(machine, "Static", parse_reserved_memory("0:memory=100Mi"))))


def test_zones_publish_memory_and_huge_pages_and_read_back():
    n = _node()
    assert n.admit_pod(pod("p", container("app", 10 * GI, cpu=2000, hugepages={"hugepages-1Gi": GI}))).admitted
    assert n.memory_state is not None
    doc = build_nrt("n1", n.topology, free_cpus=n.shared_pool() - n.reserved_cpus, reserved_cpus=n.reserved_cpus,
                    topology_manager_policy="single-numa-node", memory=nrt_memory(n.memory_state),
                    memory_manager_policy="Static")
    zone0 = {r["name"]: r for r in doc["zones"][0]["resources"]}
    assert [r["name"] for r in doc["zones"][0]["resources"]] == ["cpu", "memory", "hugepages-1Gi", "hugepages-2Mi"]
    # 64Gi total; allocatable without the 100Mi reserved and the 4Gi of huge pages; available without the pod's 10Gi
    assert zone0["memory"] == {"name": "memory", "capacity": "64Gi", "allocatable": "61340Mi",
                               "available": "51100Mi"}
    assert zone0["hugepages-1Gi"] == {"name": "hugepages-1Gi", "capacity": "2Gi", "allocatable": "2Gi",
                                      "available": "1Gi"}
    parsed = parse_nrt(doc)
    assert parsed.memory_manager_policy == "Static"
    assert parsed.zones[0].memory["memory"] == (64 * GI, 61340 * MI, 51100 * MI)
    assert parsed.zones[1].memory["hugepages-1Gi"] == (2 * GI, 2 * GI, 2 * GI)
    n.release_pod("p")
    again = parse_nrt(build_nrt("n1", n.topology, free_cpus=n.shared_pool() - n.reserved_cpus,
                                reserved_cpus=n.reserved_cpus, topology_manager_policy="single-numa-node",
                                memory=nrt_memory(n.memory_state), memory_manager_policy="Static"))
    assert again.shape_key == parsed.shape_key  # the same machine
    assert again.state_key != parsed.state_key  # memory given back: another answer now
    assert again.zones[0].memory["memory"][2] == 61340 * MI


def test_without_memory_the_document_is_unchanged():
    t = xeon_gold_6258r()
    doc = build_nrt("n1", t, free_cpus=t.all_cpus)
    assert all(len(z["resources"]) == 1 for z in doc["zones"])
    assert "memoryManagerPolicy" not in {a["name"] for a in doc["attributes"]}
    assert parse_nrt(doc).zones[0].memory == {} and parse_nrt(doc).memory_manager_policy is None


FOREIGN = {  # as NFD's topology-updater publishes a node: no numapin attribute, quantities in Ki
    "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
    "metadata": {"name": "worker-1"},
    "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                   {"name": "topologyManagerScope", "value": "container"}],
    "zones": [{"name": "node-0", "type": "Node", "resources": [
        {"name": "cpu", "capacity": "32", "allocatable": "30", "available": "30"},
        {"name": "memory", "capacity": "67108864Ki", "allocatable": "66060288Ki", "available": "61865984Ki"},
        {"name": "hugepages-2Mi", "capacity": "1Gi"},
        {"name": "example.com/nic", "capacity": "4"},
    ]}],
}


def test_foreign_documents_with_memory_are_understood():
    node = parse_nrt(FOREIGN)
    z = node.zones[0]
    assert z.memory == {"memory": (64 * GI, 63 * GI, 59 * GI), "hugepages-2Mi": (GI, GI, GI)}
    assert node.memory_manager_policy is None


@pytest.mark.parametrize(("resource", "match"), [
    ({"name": "memory", "capacity": "1Gi", "allocatable": "2Gi"}, "more than capacity"),
    ({"name": "memory", "capacity": "2Gi", "allocatable": "1Gi", "available": "2Gi"}, "more than allocatable"),
    ({"name": "hugepages-2Mi", "capacity": "lots"}, r"zones\[0\].resources\[1\].capacity"),
    ({"name": "memory", "capacity": True}, "must be a quantity"),
])
def test_bad_memory_resources_name_the_field(resource, match):
    doc = {**FOREIGN, "zones": [{"name": "node-0", "type": "Node", "resources": [
        {"name": "cpu", "capacity": "4"}, resource]}]}
    with pytest.raises(TopologyError, match=match):
        parse_nrt(doc)


def test_the_published_node_gives_the_same_memory_hints_as_the_node():
    from allocator.memory.report import nrt_memory_attributes
    from allocator.memory.synthetic import memory_from_nrt

    n = NodeAllocator(NodeConfig(
        topology=xeon_gold_6258r(), num_reserved_cpus=2, topology_manager_policy="best-effort",
        memory=MemoryConfig(MachineMemory.uniform((0, 1), 64 * GI, ((2 * MI, 1024), (GI, 2))), "Static",
                            parse_reserved_memory("0:memory=100Mi"))))
    assert n.admit_pod(pod("a", container("app", 70 * GI, cpu=2000))).admitted  # a group {0, 1}
    assert n.memory_state is not None and n.memory_state.machine[1].cells == (0, 1)
    doc = build_nrt("n1", n.topology, free_cpus=n.shared_pool() - n.reserved_cpus, memory=nrt_memory(n.memory_state),
                    memory_manager_policy="Static", zone_attributes=nrt_memory_attributes(n.memory_state))
    published = parse_nrt(doc)
    assert published.zones[0].memory_assignments == 1 and str(published.zones[0].memory_cells) == "0-1"
    built = memory_from_nrt(published)
    assert built is not None
    policy, state = built
    assert state.machine == n.memory_state.machine
    for probe in (pod("x", container("app", GI, cpu=2000)), pod("y", container("app", 20 * GI, cpu=2000)),
                  pod("z", container("app", GI, cpu=2000, hugepages={"hugepages-1Gi": GI}))):
        assert policy.topology_hints(state, probe, "app") == n.memory_policy.topology_hints(  # type: ignore[union-attr]
            n.memory_state, probe, "app")


def test_a_foreign_document_with_memory_rebuilds_a_node():
    from allocator.memory.synthetic import memory_from_nrt

    built = memory_from_nrt(parse_nrt(FOREIGN))
    assert built is not None
    policy, state = built
    t = state.machine[0].memory["memory"]
    # the 1Gi reserved is taken as the node's huge pages (NFD's memory allocatable may include them)
    assert (t.total, t.system_reserved, t.allocatable, t.reserved, t.free) == (64 * GI, 0, 63 * GI, 4 * GI, 59 * GI)
    assert state.machine[0].assignments == 1  # holds memory: taken as allocated alone
    assert policy.topology_hints(state, pod("p", container("app", 60 * GI)), "app") == {}
    assert memory_from_nrt(parse_nrt(build_nrt("n", xeon_gold_6258r(), free_cpus=xeon_gold_6258r().all_cpus))) is None
