"""single-numa-node through numapin's other door, on a real multi-NUMA kernel (2s4n: NUMA node n is core n, CPUs
2n and 2n+1; CPU 0 reserved): containerd 2.x (Debian's, from the host's cache) with NRI on and ``numapin nri``
plugged into it; kubelet's client talks to containerd itself, as it does in NRI mode. One compact story, judged
from the guest kernel: a shared pod runs on every CPU and node; an exclusive pod gets one whole node's CPUs and its
memory node, and the memory it touches lands there; the shared pod is narrowed off that node's CPUs and memory
node; a pod that fits no single node fails its creation with kubelet's reason and takes nothing; an in-place growth
of the exclusive pod that cannot stay in its node is refused and changes nothing; deleting it widens the shared pod
back.

Its own node (a second containerd beside the boot's 1.6, its own state and cgroup root) for this module only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.guest.node import WORK, GuestNode, Memory, NodeConfig, node_meminfo
from tests.numa.guest.test_single_numa_node import (
    MIB,
    RESERVED,
    assert_everywhere,
    assert_memory_landed,
    assert_off_node,
    largest_node,
)

CONTAINERD = "2.x"  # the shape's ``containerds`` (tests/numa/shapes.py): the host filled the cache before the boot
SHMEM_BEFORE: dict[int, int] = {}
DB_MEMORY = Memory(MIB + 48)  # the pinned pod's memory limit: its /dev/shm file is charged to it


@pytest.fixture(scope="module")
def nri_node() -> Iterator[GuestNode]:
    n = GuestNode(WORK.with_name("numapin-nri"), nri=CONTAINERD).start()
    try:
        yield n
    finally:
        n.stop()


def exclusive_cpus(node: GuestNode) -> list[str]:
    """The CPU sets of the exclusive containers in the plugin's kubelet-format ``cpu_manager_state``."""
    state = json.loads(Path(node.state_dir / "cpu_manager_state").read_text())
    return sorted(cpus for pod in (state.get("entries") or {}).values() for cpus in pod.values())


def test_shared_pod_runs_on_every_cpu_and_node(nri_node: GuestNode, machine: Topology) -> None:
    nri_node.configure(NodeConfig("single-numa-node", str(RESERVED)))
    assert nri_node.lab.version.startswith("2."), nri_node.lab.version
    nri_node.run("web", "250m")
    assert_everywhere(nri_node, "web", machine)


def test_exclusive_pod_gets_one_whole_node_and_its_memory(nri_node: GuestNode, machine: Topology) -> None:
    size, n = largest_node(machine)
    SHMEM_BEFORE.update({m: node_meminfo(m, "Shmem") for m in machine.numa_nodes})
    nri_node.run("db", str(size), limit=str(size), memory=DB_MEMORY,
                 command=("sh", "-c", f"dd if=/dev/zero of=/dev/shm/fill bs=1M count={MIB} && exec sleep 86400"))
    want = machine.cpus_in_numa(n) - RESERVED
    # by the time kubelet's StartContainer of db has returned, db runs on its node and the shared pod is off it
    db, web = nri_node.kernel("db"), nri_node.kernel("web")
    assert (db.cpus, db.mems, db.cgroup_cpus, db.cgroup_mems) == (want, CPUSet([n]), want, CPUSet([n])), db
    assert web.cgroup_cpus is not None and not (web.cpus & want or web.cgroup_cpus & want), web
    assert n not in web.mems, web
    assert_memory_landed(n, SHMEM_BEFORE, machine)


def test_shared_pod_narrowed_off_that_node_with_its_memory(nri_node: GuestNode, machine: Topology) -> None:
    assert_off_node(nri_node, "web", machine, largest_node(machine)[1])


def test_pod_fitting_no_single_node_fails_its_creation_with_kubelets_reason(nri_node: GuestNode,
                                                                           machine: Topology) -> None:
    size, n = largest_node(machine)
    before = nri_node.kernel("web")
    refusal = nri_node.refuse("big", str(size + 1), limit=str(size + 1))
    # containerd wraps the plugin's error; numapin's message (kubelet's reason) is in it
    assert "TopologyAffinityError" in refusal.message and "single-numa-node" in refusal.message, refusal
    assert nri_node.kernel("web") == before, "the refused pod changed the shared pod's cpuset"
    assert exclusive_cpus(nri_node) == [str(machine.cpus_in_numa(n) - RESERVED)], "the refused pod took CPUs"


def test_growth_out_of_its_node_is_refused_and_changes_nothing(nri_node: GuestNode, machine: Topology) -> None:
    size, n = largest_node(machine)
    db, web = nri_node.kernel("db"), nri_node.kernel("web")
    # kubelet's call (the pod's memory limit along) fails with numapin's message
    refusal = nri_node.refuse_resize("db", str(size + 1), memory_mib=DB_MEMORY.memory_mib)
    assert "resize refused (TopologyAffinityError)" in refusal.message, refusal
    assert f"from {size} to {size + 1} exclusive CPU(s)" in refusal.message, refusal
    assert "single-numa-node" in refusal.message and "keeps running as it was" in refusal.message, refusal
    assert (nri_node.kernel("db"), nri_node.kernel("web")) == (db, web)
    assert exclusive_cpus(nri_node) == [str(machine.cpus_in_numa(n) - RESERVED)]


def test_deleting_the_exclusive_pod_widens_the_shared_pod_back(nri_node: GuestNode, machine: Topology) -> None:
    nri_node.delete("db")
    assert_everywhere(nri_node, "web", machine)
    assert exclusive_cpus(nri_node) == []
