"""A PCI device on a non-zero NUMA node (a virtio-serial controller behind a PCIe expander bridge on that node),
single-numa-node, CPU 0 reserved: its character device maps to that node through the kernel's sysfs; an exclusive
container given the device gets the CPUs and memory of that node (not the lowest free node); once that node is
full, another pod with the device is refused while a pod without it still fits elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from nodeagent.node.devices import device_numa_node
from tests.numa.guest.node import GuestNode, NodeConfig
from tests.numa.shapes import DEVICE_PORT, Shape


@pytest.fixture(scope="module")
def device() -> str:
    """The /dev path of the virtio-serial port DEVICE_PORT."""
    for port in Path("/sys/class/virtio-ports").iterdir():
        if (port / "name").read_text().strip() == DEVICE_PORT:
            return f"/dev/{port.name}"
    raise AssertionError(f"no virtio-serial port named {DEVICE_PORT} in /sys/class/virtio-ports")


def test_device_numa_node_read_from_sysfs(shape: Shape, device: str) -> None:
    pci = Path(f"/sys/class/virtio-ports/{Path(device).name}/device").resolve().parent
    assert (pci / "numa_node").read_text().strip() == str(shape.device_node), pci
    assert device_numa_node(device) == shape.device_node


def test_exclusive_container_with_the_device_runs_on_its_node(node: GuestNode, shape: Shape, machine: Topology,
                                                              device: str) -> None:
    node.configure(NodeConfig("single-numa-node", "0"))
    assert shape.device_node is not None
    want = machine.cpus_in_numa(shape.device_node)
    node.run("dev", str(len(want)), limit=str(len(want)), devices=[device])
    k = node.settled("dev", want, CPUSet([shape.device_node]))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (want, CPUSet([shape.device_node]), want,
                                                              CPUSet([shape.device_node])), k


def test_device_pod_refused_when_its_node_is_full(node: GuestNode, shape: Shape, machine: Topology,
                                                  device: str) -> None:
    assert shape.device_node is not None
    size = str(len(machine.cpus_in_numa(shape.device_node)))
    refusal = node.refuse("dev2", size, limit=size, devices=[device])  # other nodes have room, not the device's
    assert "TopologyAffinityError" in refusal.message, refusal
    node.run("nodev", size, limit=size)  # without the device it fits elsewhere
    assert shape.device_node not in node.kernel("nodev").mems
