from __future__ import annotations

import pytest

from allocator.cpuset import CPUSet
from allocator.errors import TopologyError
from allocator.nrt import NRT_API_VERSION, build_nrt, parse_nrt
from allocator.topology import CPUInfo, Topology
from webhook.admission.synthetic_node import OCCUPIED_POD_UID, synthetic_reserved, synthetic_state, synthetic_topology


def two_numa_smt() -> Topology:
    # 2 NUMA nodes x 8 cores x 2 threads; cpu c and c+16 are siblings; NUMA = (c % 16) // 8
    cpus = [CPUInfo(cpu=c, core=c % 16, socket=(c % 16) // 8, numa=(c % 16) // 8, uncore=(c % 16) // 8)
            for c in range(32)]
    return Topology(cpus=tuple(cpus), numa_nodes=(0, 1), numa_distances={0: (10, 21), 1: (21, 10)})


def test_build_and_parse_round_trip() -> None:
    t = two_numa_smt()
    doc = build_nrt("worker-1", t, free_cpus=CPUSet.parse("1-5,17-21,8-15"), reserved_cpus=CPUSet.parse("0,16"),
                    topology_manager_policy="single-numa-node", topology_manager_scope="pod",
                    topology_manager_policy_options={"prefer-closest-numa-nodes": "true"},
                    cpu_manager_policy_options={"full-pcpus-only": "true"}, labels={"zone": "a"})
    assert doc["apiVersion"] == NRT_API_VERSION and doc["kind"] == "NodeResourceTopology"
    assert doc["metadata"]["name"] == "worker-1"
    assert [z["name"] for z in doc["zones"]] == ["node-0", "node-1"]
    assert doc["zones"][0]["resources"] == [{"name": "cpu", "capacity": "16", "allocatable": "14",
                                             "available": "10"}]
    assert doc["zones"][1]["costs"] == [{"name": "node-0", "value": 21}, {"name": "node-1", "value": 10}]
    attrs = {a["name"]: a["value"] for a in doc["attributes"]}
    assert attrs["topologyManagerPolicy"] == "single-numa-node"
    assert attrs["topologyManagerOptionPreferClosestNumaNodes"] == "true"
    assert doc["topologyPolicies"] == ["SingleNUMANodePodLevel"]

    n = parse_nrt(doc)
    assert n.name == "worker-1" and n.labels == {"zone": "a"}
    assert n.topology_manager_policy == "single-numa-node" and n.topology_manager_scope == "pod"
    assert n.topology_manager_policy_options == {"prefer-closest-numa-nodes": "true"}
    assert n.cpu_manager_policy_options == {"full-pcpus-only": "true"}
    assert n.threads_per_core == 2
    z0, z1 = n.zones
    assert (z0.capacity, z0.allocatable, z0.available, z0.available_cores, z0.socket) == (16, 14, 10, 5, 0)
    assert (z1.capacity, z1.allocatable, z1.available, z1.available_cores) == (16, 16, 8, 0)
    assert n.largest_numa == z1
    assert n.reserved_cpus == CPUSet.parse("0,16")


def test_synthetic_machine_matches_the_counts() -> None:
    t = two_numa_smt()
    doc = build_nrt("w", t, free_cpus=CPUSet.parse("1-5,17-21,8-15"), reserved_cpus=CPUSet.parse("0,16"))
    n = parse_nrt(doc)
    st = synthetic_topology(n)
    assert st.num_cpus == 32 and st.threads_per_core == 2 and st.cpu_numa_nodes == (0, 1)
    assert st.distance(0, 1) == 21
    reserved = synthetic_reserved(n, st)
    assert len(reserved) == 2 and st.numa_of(reserved) == CPUSet([0])
    state = synthetic_state(n, st)
    free = state.default_cpuset - reserved
    for z in n.zones:
        in_numa = free & st.cpus_in_numa(z.numa)
        assert len(in_numa) == z.available
        whole = sum(1 for core in st.cores if st.cpus_in_core(core).issubset(in_numa))
        assert whole == z.available_cores
    assert set(state.assignments) == {OCCUPIED_POD_UID}
    empty = synthetic_state(n, st, occupied=False)
    assert empty.assignments == {} and empty.default_cpuset == st.all_cpus


@pytest.mark.parametrize(("mutate", "field"), [
    (lambda d: d.update(kind="Node"), "kind"),
    (lambda d: d["metadata"].pop("name"), "metadata.name"),
    (lambda d: d["zones"][0]["resources"][0].update(available="99"), "zones[0].resources[0].available"),
    (lambda d: d["zones"][0]["resources"][0].update(capacity="lots"), "zones[0].resources[0].capacity"),
    (lambda d: d["attributes"][0].update(value="sometimes"), "attributes.topologyManagerPolicy"),
    (lambda d: d["attributes"].append({"name": "numapinReservedCPUs", "value": "3-1"}),
     "attributes.numapinReservedCPUs"),
])
def test_bad_documents_name_the_field(mutate, field) -> None:  # type: ignore[no-untyped-def]
    doc = build_nrt("w", two_numa_smt(), free_cpus=CPUSet.parse("1-15"), reserved_cpus=CPUSet.parse("0"))
    mutate(doc)
    with pytest.raises(TopologyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_nrt(doc)


def test_legacy_topology_policies_understood() -> None:
    doc = {"apiVersion": "topology.node.k8s.io/v1alpha1", "kind": "NodeResourceTopology",
           "metadata": {"name": "old"}, "topologyPolicies": ["SingleNUMANodeContainerLevel"],
           "zones": [{"name": "node-0", "type": "Node",
                      "resources": [{"name": "cpu", "capacity": 8, "allocatable": 7, "available": "7000m"}]}]}
    n = parse_nrt(doc)
    assert n.topology_manager_policy == "single-numa-node" and n.topology_manager_scope == "container"
    assert n.zones[0].available == 7


def test_documents_the_node_proxy_publishes_are_understood() -> None:
    """Contract with the proxy: it publishes ``build_nrt`` of its NodeAllocator (criproxy/app.py nrt_document);
    the webhook reads that back with the same free CPUs per NUMA node."""
    from allocator.node import NodeAllocator, NodeConfig

    t = two_numa_smt()
    node = NodeAllocator(NodeConfig(topology=t, reserved_cpus=CPUSet.parse("0,16"),
                                    topology_manager_policy="single-numa-node", topology_manager_scope="pod",
                                    topology_manager_policy_options={"prefer-closest-numa-nodes": "true"}))
    pinned = {"metadata": {"uid": "u1", "name": "p", "namespace": "d"},
              "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "8", "memory": "1Gi"}}}]}}
    assert node.admit_pod(pinned).admitted
    nc = node.config
    doc = build_nrt("worker-9", t, free_cpus=node.state.default_cpuset - node.reserved_cpus,
                    reserved_cpus=node.reserved_cpus, topology_manager_policy=nc.topology_manager_policy,
                    topology_manager_scope=nc.topology_manager_scope,
                    topology_manager_policy_options=nc.topology_manager_policy_options,
                    cpu_manager_policy_options=nc.cpu_manager_policy_options)
    n = parse_nrt(doc)
    assert n.name == "worker-9"
    assert (n.topology_manager_policy, n.topology_manager_scope) == ("single-numa-node", "pod")
    assert n.topology_manager_policy_options == {"prefer-closest-numa-nodes": "true"}
    assert {z.numa: z.available for z in n.zones} == node.free_cpus_per_numa()
    st = synthetic_topology(n)
    assert st.distance(0, 1) == 21
    state = synthetic_state(n, st)
    assert len(state.default_cpuset - synthetic_reserved(n, st)) == sum(node.free_cpus_per_numa().values())
