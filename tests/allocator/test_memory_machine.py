"""Memory per NUMA node read from sysfs (allocator.memory.machine) and huge-page resource names."""

from __future__ import annotations

import pytest

from allocator.errors import ConfigError, TopologyError
from allocator.memory import MachineMemory, NodeMemory, hugepage_resource, hugepage_size, read_machine_memory
from tests.fixtures.make_sysfs import MACHINES, build, write_node_memory

GI = 1 << 30
MI = 1 << 20


@pytest.mark.parametrize(("size", "name"), [
    (2 * MI, "hugepages-2Mi"), (GI, "hugepages-1Gi"), (64 * 1024, "hugepages-64Ki"), (32 * MI, "hugepages-32Mi"),
    (16 * GI, "hugepages-16Gi"),
])
def test_hugepage_names_both_ways(size, name):
    assert hugepage_resource(size) == name
    assert hugepage_size(name) == size


@pytest.mark.parametrize("bad", ["memory", "hugepages-", "hugepages-2Xi", "hugepages-two"])
def test_bad_hugepage_names_are_refused(bad):
    with pytest.raises(ConfigError):
        hugepage_size(bad)


def test_default_machine_tree_has_64gi_per_node_and_no_pages(sysfs_machine):
    mm = read_machine_memory(sysfs_machine("xeon-6258r"))
    assert mm.node_ids == (0, 1)
    assert mm.node(0) == NodeMemory(0, 64 * GI, ((2 * MI, 0), (GI, 0)))
    assert mm.resources() == ("memory", "hugepages-2Mi", "hugepages-1Gi")
    assert mm.capacity() == {"memory": 128 * GI, "hugepages-2Mi": 0, "hugepages-1Gi": 0}


def test_pages_per_node_and_memory_only_node(tmp_path):
    root = build(MACHINES["cpuless-node"], tmp_path)
    write_node_memory(root, 1, 32 * 1024 * 1024, ((2048, 512), (1048576, 4)))
    write_node_memory(root, 2, 16 * 1024 * 1024)
    mm = read_machine_memory(root)
    assert mm.node_ids == (0, 1, 2)
    assert mm.node(1).totals() == {"memory": 32 * GI, "hugepages-2Mi": GI, "hugepages-1Gi": 4 * GI}
    assert mm.node(2) == NodeMemory(2, 16 * GI, ((2 * MI, 0), (GI, 0)))


def test_missing_or_garbled_meminfo_is_a_clear_error(tmp_path):
    root = build(MACHINES["vm-2"], tmp_path)
    meminfo = root / "devices/system/node/node0/meminfo"
    meminfo.write_text("Node 0 MemFree: 12 kB\n")
    with pytest.raises(TopologyError, match="MemTotal"):
        read_machine_memory(root)
    meminfo.unlink()
    with pytest.raises(TopologyError, match="cannot read"):
        read_machine_memory(root)
    with pytest.raises(TopologyError, match="does not exist"):
        read_machine_memory(tmp_path / "nowhere")


def test_garbled_page_count(tmp_path):
    root = build(MACHINES["vm-2"], tmp_path)
    (root / "devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages").write_text("lots\n")
    with pytest.raises(TopologyError, match="nr_hugepages"):
        read_machine_memory(root)


def test_json_round_trip_and_errors():
    mm = MachineMemory((NodeMemory(1, 8 * GI, ((2 * MI, 16),)), NodeMemory(0, 4 * GI)))
    assert mm.node_ids == (0, 1)
    assert MachineMemory.from_dict(mm.to_dict()) == mm
    with pytest.raises(ConfigError, match="repeat"):
        MachineMemory((NodeMemory(0, 1), NodeMemory(0, 2)))
    with pytest.raises(ConfigError, match="non-negative"):
        MachineMemory.from_dict({"nodes": [{"node": 0, "memory": -1}]})
    with pytest.raises(ConfigError, match="page count"):
        MachineMemory.from_dict({"nodes": [{"node": 0, "memory": 1, "hugepages": {"hugepages-2Mi": "x"}}]})
