"""The multi-NUMA machines the end-to-end tests boot (numapin_lab.numa_vm), and what each must look like.

A shape is a numa-vm.sh topology (``<S>s<C>c<T>t<N>n``) plus the cgroup layout, memory per node, an optional PCI
device on a NUMA node, and the guest test files (tests/numa/guest) run in one boot of it. ``expected_topology``
derives the machine from the spec alone, the way QEMU lays it out: CPU ids socket by socket, core by core, the
threads of a core consecutive; the cores of a socket split evenly over its nodes; one L3 cache per socket;
distances 10 local, 12 within a socket, 20 across sockets (numa-vm.sh's defaults).

Shared by the host side (which boots the VMs) and the guest side (which checks the machine it runs on).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from allocator.topology import CPUInfo, Topology
from numapin_lab.numa_vm import topology_spec

__all__ = ["DEVICE_PORT", "SHAPES", "SHAPE_ENV", "SHARED_ENV", "Shape", "current_shape", "expected_topology"]

SHAPE_ENV = "NUMAPIN_VM_SHAPE"     # the shape's name, set for the guest's pytest
IN_VM_ENV = "NUMAPIN_IN_VM"        # "1" in the guest: tests/numa/guest is collected only then
SHARED_ENV = "NUMAPIN_VM_SHARED"   # the host directory shared read-write with the guest (reports, logs)
DEVICE_PORT = "numapin.dev"        # the virtio-serial port of the PCI device put on a NUMA node
LOCAL, SOCKET, REMOTE = 10, 12, 20


@dataclass(frozen=True)
class Shape:
    name: str
    topology: str
    guest_tests: tuple[str, ...]          # files under tests/numa/guest
    more_tests: tuple[str, ...] = ()      # other test files of the repository (relative to its root) run in the boot
    cgroup: str = "v1"
    mem_per_node_mib: int | None = None
    device_node: int | None = None        # a PCI device (virtio-serial port DEVICE_PORT) on this NUMA node
    timeout: int = 1200                   # seconds for the whole VM run (generous: the host may be overloaded)
    init: str = "busybox"                 # PID 1: numa-vm.sh's busybox, or systemd (numapin_lab.systemd_vm; cgroup v2)
    kernel_args: str = ""                 # more of the guest kernel's command line (boot-time 1 GiB huge pages)
    # about how long its boot takes on the host beside the rest of the suite (2 CPUs; the summary's `boots` line):
    # the boots are queued longest first, so the two lanes end close together
    seconds: int = 85
    # containerds of numapin_lab.cri.containerd_versions its guest tests run besides the system's (e.g. "2.x" for the
    # NRI story): the host makes sure they are in the cache before the boot (the guest must never download)
    containerds: tuple[str, ...] = ()

    @property
    def smt(self) -> bool:
        return topology_spec(self.topology)[2] > 1


# Every check runs on 2s4n, then the proxy's reliability churn (test_churn.py, last: it takes the node's
# containerd over). The other shapes run the sysfs check and the single-numa-node story, whose outcome depends
# on their layout (each boot costs ~30 s before the first check, a proxy configuration 10-15 s, a pod 5-10 s).
_CORE = ("test_machine.py", "test_single_numa_node.py")

SHAPES: dict[str, Shape] = {s.name: s for s in (
    # 2 sockets x 2 cores x 2 threads, 4 nodes of one core; a PCI device on node 2
    # (files ordered so that consecutive checks share a proxy configuration: fewer restarts)
    # (test_resize.py ends on test_single_numa_node.py's configuration)
    Shape("2s4n", "2s4n", ("test_machine.py", "test_resize.py", "test_single_numa_node.py", "test_device.py",
                           "test_spread.py", "test_prefer_closest.py", "test_restricted_refuses.py",
                           "test_memory.py", "test_full_pcpus.py", "test_nri.py", "test_churn.py"),
          device_node=2, timeout=2700, seconds=600, containerds=("2.x",)),
    # 1 socket x 4 cores, no SMT, 2 nodes of 2 GiB; pure cgroup v2 (the host and the other shapes are v1); one
    # 1 GiB huge page reserved on node 1 at boot (the per-node syntax of the kernel's hugepages=)
    Shape("1s2n-nosmt", "1s2n-nosmt", (*_CORE, "test_hugepages_1g.py"), cgroup="v2", mem_per_node_mib=2048,
          kernel_args="hugepagesz=1G hugepages=1:1", seconds=110),
    # 2 sockets x 4 cores, 8 nodes of one CPU and 512 MiB
    Shape("2s4c1t8n", "2s4c1t8n", (*_CORE, "test_memory_spill.py"), mem_per_node_mib=512, seconds=100),
    # kubeadm's node: systemd as PID 1, pure cgroup v2, containerd 2.1 then 1.7 (the cache's, not the system's 1.6:
    # tests/install/test_systemd_host.py runs that one on a systemd host) with runc's systemd cgroup driver, pods in
    # kubelet's slices; 1 socket x 2 cores x 2 threads, 2 nodes
    # (seconds: about twice its 1.6 boot's 155 s, by QEMU's CPU: 301 s against 129-199 s; timeout: two containerds'
    # stories, which took 562 s of guest time alone at load 3.5-8, and may be slower beside the suite)
    Shape("1s2n-systemd", "1s2n", ("test_systemd_driver.py",), cgroup="v2", init="systemd", timeout=1200,
          seconds=300, containerds=("2.x", "1.7")),
)}


def current_shape() -> Shape:
    """The shape this guest was booted as (``$NUMAPIN_VM_SHAPE``)."""
    name = os.environ.get(SHAPE_ENV, "")
    if name not in SHAPES:
        raise LookupError(f"${SHAPE_ENV}={name!r}: not one of {', '.join(SHAPES)} (these tests run inside the VMs "
                          f"booted by tests/numa/test_multi_numa.py)")
    return SHAPES[name]


def expected_topology(topology: str) -> Topology:
    s_count, cores, threads, nodes = topology_spec(topology)
    nodes_per_socket = nodes // s_count
    cores_per_node = cores // nodes_per_socket
    cpus = []
    for s in range(s_count):
        for c in range(cores):
            first = (s * cores + c) * threads
            node = s * nodes_per_socket + c // cores_per_node
            cpus += [CPUInfo(cpu=first + t, core=first, socket=s, numa=node, uncore=s) for t in range(threads)]

    def distance(a: int, b: int) -> int:
        if a == b:
            return LOCAL
        return SOCKET if a // nodes_per_socket == b // nodes_per_socket else REMOTE

    dist = {a: tuple(distance(a, b) for b in range(nodes)) for a in range(nodes)}
    return Topology(cpus=tuple(cpus), numa_nodes=tuple(range(nodes)), numa_distances=dist)
