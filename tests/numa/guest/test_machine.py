"""The machine as numapin reads it from the guest kernel's sysfs is exactly the one QEMU was told to build:
CPUs, cores and SMT siblings, sockets, NUMA nodes, L3 groups and distances (tests/numa/shapes.py derives it
from the topology spec alone)."""

from __future__ import annotations

from pathlib import Path

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.shapes import Shape, expected_topology


def test_topology_read_from_sysfs_is_the_machine(shape: Shape, machine: Topology) -> None:
    want = expected_topology(shape.topology)
    assert machine.to_dict() == want.to_dict()
    assert machine == want


def test_kernel_files_agree(shape: Shape, machine: Topology) -> None:
    """The raw files the reader uses, read here directly: node cpulists, SMT siblings, L3 sharing, distances."""
    sysfs = Path("/sys/devices/system")
    for n in machine.numa_nodes:
        assert CPUSet.parse((sysfs / f"node/node{n}/cpulist").read_text()) == machine.cpus_in_numa(n)
        row = tuple(int(x) for x in (sysfs / f"node/node{n}/distance").read_text().split())
        assert row == tuple(machine.distance(n, m) for m in machine.numa_nodes)
    for c in machine.cpus:
        siblings = CPUSet.parse((sysfs / f"cpu/cpu{c.cpu}/topology/thread_siblings_list").read_text())
        assert siblings == machine.cpus_in_core(c.core)
        l3 = CPUSet.parse((sysfs / f"cpu/cpu{c.cpu}/cache/index3/shared_cpu_list").read_text())
        assert l3 == machine.cpus_in_uncore(c.uncore)
    assert machine.threads_per_core == (2 if shape.smt else 1)
