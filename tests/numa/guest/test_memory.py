"""kubelet's Memory Manager (``--memory-manager-policy Static``, docs/memory.md) on a real multi-NUMA kernel, judged
from the kernel: ``/proc/<pid>/status`` (Cpus_allowed_list, Mems_allowed_list), the cpuset cgroup, per-node
``meminfo`` and huge-page counters. 2s4n: 1 GiB of memory and two CPUs per NUMA node; CPU 7 reserved (node 0 keeps
two free CPUs, so a move off it is memory's doing), 100Mi of memory reserved on node 0 (kubelet's default eviction
threshold, what the reservations must add up to). Two stories, one proxy configuration each:

- single-numa-node, with eight 2Mi huge pages reserved on node 2 only (sysfs, before the proxy starts): a Guaranteed
  pod asking more memory than any node's allocatable is refused with kubelet's reason and takes nothing; two pods
  that each fit a node but not together: the first gets node 0's CPU and memory, the second node 1's although node 0
  still has a free CPU; a pod asking huge pages gets its CPU and memory node on node 2 (the CPUs alone would have
  given it node 0) and the pages it allocates (``fallocate`` on a hugetlbfs mount) come out of node 2's pool; a pod
  asking more pages than any node has is refused with kubelet's reason (the Memory Manager cannot place them:
  UnexpectedAdmissionError, as kubelet's allocation fails);
- restricted: a pod with 4 CPUs and more memory than a node holds is admitted on two nodes (its CPUs need two as
  well, so the merged hint is preferred): Mems_allowed_list and cpuset.mems are both nodes, the proxy's
  memory_manager_state holds one block over both, and memory its processes touch from a CPU of each node lands on
  that node (per-node Shmem).

The expected CPUs follow kubelet's rules (the lowest of the narrowest preferred merged hints, CPUs taken as its CPU
manager takes them) and were checked against the allocator on this machine's model (tests.numa.shapes).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.guest.node import WORK, GuestNode, Memory, NodeConfig, node_meminfo

S = CPUSet.parse
RESERVED_MEMORY = "0:memory=100Mi"
SINGLE = NodeConfig("single-numa-node", "7", reserved_memory=RESERVED_MEMORY)
RESTRICTED = NodeConfig("restricted", "7", reserved_memory=RESERVED_MEMORY)
BIG_MIB = 1100          # more than any node of 1 GiB holds, less than two
FITS_ONE_MIB = 600      # one fits a node's allocatable, two do not
PAGES_NODE, PAGES = 2, 8
PAGES_USED = 4          # what the huge-page pod allocates (8Mi)
TOUCH_MIB = 24          # what the wide pod writes to its /dev/shm from a CPU of each of its nodes
SHMEM_BEFORE: dict[int, int] = {}


def hugepages_file(node: int, name: str) -> Path:
    return Path(f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/{name}")


def memtotal_mib(machine: Topology) -> dict[int, int]:
    return {n: node_meminfo(n, "MemTotal") // 1024 for n in machine.numa_nodes}


def memory_entries(node: GuestNode) -> dict[str, dict[str, list[dict[str, object]]]]:
    """The proxy's memory_manager_state's entries (pod uid -> container -> blocks); none before its first write."""
    path = node.state_dir / "memory_manager_state"
    return (json.loads(path.read_text()).get("entries") or {}) if path.exists() else {}


@pytest.fixture(scope="module")
def hugepages() -> Iterator[Path]:
    """Eight 2Mi pages on node 2 (none elsewhere), a hugetlbfs mount of them for the pods; both undone after."""
    mount = WORK / "hugepages"
    mount.mkdir(parents=True, exist_ok=True)
    hugepages_file(PAGES_NODE, "nr_hugepages").write_text(f"{PAGES}\n")
    subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "numapin-hugepages", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        hugepages_file(PAGES_NODE, "nr_hugepages").write_text("0\n")


def test_machine_has_the_memory_the_stories_assume(hugepages: Path, machine: Topology) -> None:
    total = memtotal_mib(machine)
    assert all(t < BIG_MIB for t in total.values()), f"a node holds {BIG_MIB} MiB (MemTotal MiB: {total})"
    assert 2 * FITS_ONE_MIB > total[0] - 100 >= FITS_ONE_MIB, f"node 0's allocatable (MemTotal MiB: {total})"
    pages = {n: int(hugepages_file(n, "nr_hugepages").read_text()) for n in machine.numa_nodes}
    assert pages == {n: PAGES if n == PAGES_NODE else 0 for n in machine.numa_nodes}, pages


def test_pod_larger_than_a_node_is_refused_under_single_numa_node(node: GuestNode) -> None:
    node.configure(SINGLE)
    refusal = node.refuse("big", "1", limit="1", memory=Memory(BIG_MIB))
    assert refusal.code == "FAILED_PRECONDITION", refusal
    assert "TopologyAffinityError" in refusal.message and "single-numa-node" in refusal.message, refusal
    assert f"memory {BIG_MIB}Mi asked" in refusal.message, refusal
    assert memory_entries(node) == {}, "the refused pod holds memory"


def test_two_pods_that_fit_a_node_each_but_not_together_take_two_nodes(node: GuestNode) -> None:
    node.run("first", "1", limit="1", memory=Memory(FITS_ONE_MIB))
    node.run("second", "1", limit="1", memory=Memory(FITS_ONE_MIB))
    first = node.settled("first", S("0"), S("0"))
    second = node.settled("second", S("2"), S("1"))  # node 0's CPU 1 is free, its memory is not
    assert (first.cpus, first.mems, first.cgroup_cpus, first.cgroup_mems) == (S("0"), S("0"), S("0"), S("0")), first
    assert (second.cpus, second.mems, second.cgroup_cpus, second.cgroup_mems) == (S("2"), S("1"), S("2"),
                                                                                 S("1")), second


def test_huge_page_pod_gets_the_cpu_and_memory_of_the_node_with_the_pages(node: GuestNode, hugepages: Path) -> None:
    size = PAGES_USED * 2
    command = ("sh", "-c", f"fallocate -l {size}M /hugepages/pod; echo $? > /fallocate.tmp; "
                          "mv /fallocate.tmp /fallocate.rc; exec sleep 86400")  # the status whole when seen
    node.run("pages", "1", limit="1", memory=Memory(64, hugepages_2m_mib=size),
             mounts=[(str(hugepages), "/hugepages")], command=command)
    k = node.settled("pages", S("4"), S("2"))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (S("4"), S("2"), S("4"), S("2")), k
    rc = Path(f"/proc/{k.pid}/root/fallocate.rc")
    deadline = time.monotonic() + 60
    while not rc.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rc.read_text().strip() == "0", "fallocate of huge pages failed in the container"
    free = int(hugepages_file(PAGES_NODE, "free_hugepages").read_text())
    assert free == PAGES - PAGES_USED, f"node {PAGES_NODE} has {free} free pages of {PAGES}"


def test_more_huge_pages_than_any_node_has_are_refused(node: GuestNode) -> None:
    refusal = node.refuse("too-many-pages", "1", limit="1", memory=Memory(64, hugepages_2m_mib=2 * (PAGES + 2)))
    assert refusal.code == "RESOURCE_EXHAUSTED", refusal
    assert "UnexpectedAdmissionError" in refusal.message, refusal
    assert "failed to find NUMA nodes to extend the current topology hint" in refusal.message, refusal
    node.prepare_proxy()  # the next story's proxy imports meanwhile


def test_restricted_spreads_a_pod_larger_than_a_node_over_two_nodes(node: GuestNode, machine: Topology) -> None:
    node.configure(RESTRICTED)
    SHMEM_BEFORE.update({m: node_meminfo(m, "Shmem") for m in machine.numa_nodes})
    write = [f"taskset -c {cpu} dd if=/dev/zero of=/dev/shm/fill-{cpu} bs=1M count={TOUCH_MIB}" for cpu in (0, 2)]
    node.run("wide", "4", limit="4", memory=Memory(BIG_MIB),
             command=("sh", "-c", " && ".join(write) + "; exec sleep 86400"))
    k = node.settled("wide", S("0-3"), S("0-1"))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (S("0-3"), S("0-1"), S("0-3"), S("0-1")), k
    [(_, blocks)] = memory_entries(node).items()
    assert blocks == {"app": [{"numaAffinity": [0, 1], "type": "memory", "size": BIG_MIB << 20}]}, blocks


def test_the_memory_it_touches_lands_on_both_its_nodes(node: GuestNode, machine: Topology) -> None:
    want = TOUCH_MIB * 1024 * 0.9
    deadline = time.monotonic() + 120  # dd under emulation
    while time.monotonic() < deadline and \
            min(node_meminfo(m, "Shmem") - SHMEM_BEFORE[m] for m in (0, 1)) < want:
        time.sleep(0.5)
    grown = {m: node_meminfo(m, "Shmem") - SHMEM_BEFORE[m] for m in machine.numa_nodes}
    assert grown[0] >= want and grown[1] >= want, f"Shmem grew (kB): {grown}"
    assert all(g < 8 * 1024 for m, g in grown.items() if m not in (0, 1)), f"memory landed elsewhere (kB): {grown}"
