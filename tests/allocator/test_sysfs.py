"""Topology.from_sysfs on generated trees of real machines (tests/fixtures/make_sysfs.py)."""

from __future__ import annotations

import pytest

from allocator import CPUSet, Topology, TopologyError
from tests.fixtures.make_sysfs import MACHINES, build

S = CPUSet.parse


def test_vm_without_cache_information(sysfs_machine):
    t = Topology.from_sysfs(sysfs_machine("vm-2"))
    assert t.all_cpus == S("0-1") and t.cores == (0, 1) and t.sockets == (0,)
    assert t.numa_nodes == (0,) and t.threads_per_core == 1
    assert t.uncores == (0,)  # no L3 reported: the socket stands in for it
    assert t.distance(0, 0) == 10


def test_xeon_gold_6258r(sysfs_machine):
    t = Topology.from_sysfs(sysfs_machine("xeon-6258r"))
    assert t.num_cpus == 112 and t.num_cores == 56 and t.threads_per_core == 2 and t.num_sockets == 2
    assert t.cpus_in_numa(0) == S("0-27,56-83") and t.cpus_in_numa(1) == S("28-55,84-111")
    assert t.cpus_in_socket(1) == S("28-55,84-111")
    # core id = lowest thread id (kubelet), not sysfs core_id (which restarts at 0 on every socket)
    assert t.cpu(57).core == 1 and t.cpu(84).core == 28 and t.cpu(28).core == 28
    assert t.cpus_in_core(28) == S("28,84")
    assert t.uncores == (0, 1) and t.cpus_in_uncore(1) == S("28-55,84-111")
    assert t.distance(0, 1) == 21 and t.distance(1, 1) == 10


def test_xeon_e5_2680_v3(sysfs_machine):
    t = Topology.from_sysfs(sysfs_machine("e5-2680v3"))
    assert t.num_cpus == 48 and t.num_cores == 24
    assert t.cpus_in_numa(0) == S("0-11,24-35") and t.cpus_in_numa(1) == S("12-23,36-47")
    assert t.cpus_in_core(12) == S("12,36")


def test_epyc_nps4_with_ccx_l3_groups(sysfs_machine):
    t = Topology.from_sysfs(sysfs_machine("epyc-7763-nps4"))
    assert t.num_cpus == 256 and t.num_cores == 128 and t.num_sockets == 2
    assert t.numa_nodes == tuple(range(8))
    assert t.cpus_in_numa(0) == S("0-15,128-143") and t.cpus_in_numa(5) == S("80-95,208-223")
    assert t.numas_in_socket(1) == S("4-7")
    assert len(t.uncores) == 16
    assert t.cpu(8).uncore == 1 and t.cpus_in_uncore(1) == S("8-15,136-143")
    assert t.cpu(64).uncore == 8 and t.cpu(200).uncore == 9  # 200 = second thread of core 72
    assert t.distance(0, 1) == 12 and t.distance(0, 4) == 32 and t.distance(7, 7) == 10


def test_sixteen_numa_nodes(sysfs_machine):
    t = Topology.from_sysfs(sysfs_machine("numa-16"))
    assert t.num_numa_nodes == 16 and t.num_cpus == 128 and t.num_sockets == 4
    assert t.cpus_in_numa(15) == S("60-63,124-127")
    assert t.sockets_of_numas([4, 5, 15]) == S("1,3")
    assert len(t.numa_distances[3]) == 16 and t.distance(3, 2) == 12 and t.distance(3, 4) == 32


def test_offline_cpus_left_out(sysfs_machine):
    root = sysfs_machine("offline-8")
    t = Topology.from_sysfs(root)
    assert t.all_cpus == S("0,2,4-6")
    # core 1 has only CPU 5 online: its id is the lowest *online* thread
    assert t.cpu(5).core == 5 and t.cpus_in_core(5) == S("5")
    assert t.cpus_in_core(0) == S("0,4") and t.cpus_in_core(2) == S("2,6")
    assert t.cpus_in_numa(0) == S("0,2,4-6")
    assert (root / "devices/system/cpu/cpu7").is_dir()  # the directory is there, the CPU is not used
    with pytest.raises(TopologyError, match="cpu 7 is not on this machine"):
        t.cpu(7)


def test_cpu_less_numa_node(sysfs_machine):
    t = Topology.from_sysfs(sysfs_machine("cpuless-node"))
    assert t.numa_nodes == (0, 1, 2) and t.cpu_numa_nodes == (0, 1)
    assert t.cpus_in_numa(2) == CPUSet() and t.cpus_in_numa(1) == S("4-7,12-15")
    assert t.distance(0, 2) == 17 and t.distance(2, 2) == 10


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_json_round_trip(sysfs_machine, name):
    t = Topology.from_sysfs(sysfs_machine(name))
    assert Topology.from_dict(t.to_dict()) == t


def test_not_a_sysfs_root(tmp_path):
    with pytest.raises(TopologyError, match=r"is .* a sysfs root"):
        Topology.from_sysfs(tmp_path)


def test_bad_files_named(tmp_path):
    root = build(MACHINES["vm-2"], tmp_path)
    (root / "devices/system/cpu/cpu1/topology/physical_package_id").write_text("zero\n")
    with pytest.raises(TopologyError, match="cpu1/topology/physical_package_id: expected an integer"):
        Topology.from_sysfs(root)
    root = build(MACHINES["vm-2"], tmp_path / "b")
    (root / "devices/system/node/node0/cpulist").write_text("1-0\n")
    with pytest.raises(TopologyError, match="node0/cpulist"):
        Topology.from_sysfs(root)
    root = build(MACHINES["vm-2"], tmp_path / "c")
    (root / "devices/system/node/node0/distance").write_text("ten\n")
    with pytest.raises(TopologyError, match="node0/distance: expected integers"):
        Topology.from_sysfs(root)


def test_unknown_package_id_is_socket_0(tmp_path):
    root = build(MACHINES["vm-2"], tmp_path)
    for cpu in (0, 1):
        (root / f"devices/system/cpu/cpu{cpu}/topology/physical_package_id").write_text("-1\n")
    t = Topology.from_sysfs(root)
    assert t.sockets == (0,) and t.cpus_in_socket(0) == S("0-1")
