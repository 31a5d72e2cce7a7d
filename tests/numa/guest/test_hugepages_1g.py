"""1 GiB huge pages on a real multi-NUMA kernel (1s2n-nosmt: two nodes of 2 GiB, CPUs 0-1 on node 0, 2-3 on node 1),
judged from the kernel. The guest kernel reserves one 1 GiB page on node 1 at boot (``hugepagesz=1G hugepages=1:1``
on its command line: written to node 0's ``nr_hugepages`` at run time, the same guest got no page, the kernel
finding no free 1 GiB-aligned range there). numapin's Memory Manager (single-numa-node, CPU 0 reserved, 100Mi of
memory reserved on node 0) reads it from sysfs as kubelet's cAdvisor does: node 1 publishes ``hugepages-1Gi`` 1Gi in
its NodeResourceTopology zone, node 0 none. A Guaranteed pod asking ``hugepages-1Gi: 1Gi`` gets its CPU and memory
node on node 1 (its CPU alone would have given it node 0's CPU 1), the page it allocates (``fallocate`` of 1 GiB on
a hugetlbfs mount with ``pagesize=1G``) comes out of node 1's pool, and memory_manager_state holds the page on node
1; a pod asking two pages (more than any node has) is refused with kubelet's reason (UnexpectedAdmissionError: the
Memory Manager cannot place them) and takes nothing.

The decisions are replayed on the host against the allocator (tests/numa/test_memory_story_model.py)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.guest.node import WORK, GuestNode, Memory, NodeConfig

S = CPUSet.parse
GIB = 1 << 30
PAGE_NODE = 1           # the node whose 1 GiB page the kernel reserved at boot (tests.numa.shapes: kernel_args)
SINGLE = NodeConfig("single-numa-node", "0", reserved_memory="0:memory=100Mi")
PAGES = Memory(64, hugepages_1g_gib=1)
TOO_MANY = Memory(64, hugepages_1g_gib=2)
RESOURCE = "hugepages-1Gi"


def gigantic(node: int, name: str) -> int:
    return int(Path(f"/sys/devices/system/node/node{node}/hugepages/hugepages-1048576kB/{name}").read_text())


def state(node: GuestNode) -> dict[str, Any]:
    path = node.state_dir / "memory_manager_state"
    return json.loads(path.read_text()) if path.exists() else {}


def nrt_zone_resources(node: GuestNode, zone: str) -> dict[str, dict[str, str]]:
    """The proxy's NodeResourceTopology file: ``zone``'s resources by name (empty before its first write)."""
    path = node.work / "nrt.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    for z in doc.get("zones") or ():
        if z.get("name") == zone:
            return {r["name"]: r for r in z.get("resources") or ()}
    return {}


@pytest.fixture(scope="module")
def hugetlbfs() -> Iterator[Path]:
    """A hugetlbfs mount of the 1 GiB pages for the pods; unmounted after."""
    mount = WORK / "hugepages-1g"
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=1G", "numapin-gigantic", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_the_kernel_holds_one_1g_page_on_node_1(machine: Topology) -> None:
    pages = {n: (gigantic(n, "nr_hugepages"), gigantic(n, "free_hugepages")) for n in machine.numa_nodes}
    assert pages == {n: (1, 1) if n == PAGE_NODE else (0, 0) for n in machine.numa_nodes}, \
        f"1 GiB pages per node (reserved, free): {pages}; the kernel's command line: " \
        f"{Path('/proc/cmdline').read_text().strip()}"


def test_the_proxy_publishes_the_page_on_its_node(node: GuestNode) -> None:
    node.configure(SINGLE)
    deadline = time.monotonic() + 30  # the file is written in the background after the reconciliation
    while RESOURCE not in nrt_zone_resources(node, f"node-{PAGE_NODE}") and time.monotonic() < deadline:
        time.sleep(0.2)
    zones = {n: nrt_zone_resources(node, f"node-{n}").get(RESOURCE) for n in (0, PAGE_NODE)}
    want = {"name": RESOURCE, "capacity": "1Gi", "allocatable": "1Gi", "available": "1Gi"}
    assert zones[PAGE_NODE] == want, zones
    assert zones[0] is None or zones[0]["capacity"] == "0", zones


def test_pod_asking_a_1g_page_gets_the_cpu_memory_and_page_of_its_node(node: GuestNode, hugetlbfs: Path) -> None:
    # the exit status written whole before it is seen (a rename): the shell's redirection creates the file first,
    # and a read between that and the write saw it empty
    command = ("sh", "-c", "fallocate -l 1G /gigantic/pod; echo $? > /fallocate.tmp; mv /fallocate.tmp /fallocate.rc; "
               "exec sleep 86400")
    node.run("gigantic", "1", limit="1", memory=PAGES, mounts=[(str(hugetlbfs), "/gigantic")], command=command)
    k = node.settled("gigantic", S("2"), S("1"))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (S("2"), S("1"), S("2"), S("1")), k
    rc = Path(f"/proc/{k.pid}/root/fallocate.rc")
    deadline = time.monotonic() + 120  # the kernel zeroes the whole page first: seconds under emulation
    while not rc.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert rc.read_text().strip() == "0", "fallocate of a 1 GiB page failed in the container"
    free = {n: gigantic(n, "free_hugepages") for n in (0, PAGE_NODE)}
    assert free == {0: 0, PAGE_NODE: 0}, f"free 1 GiB pages per node after the pod took one: {free}"
    doc = state(node)
    [(_, blocks)] = (doc.get("entries") or {}).items()
    assert blocks == {"app": [{"numaAffinity": [PAGE_NODE], "type": "memory", "size": 64 << 20},
                              {"numaAffinity": [PAGE_NODE], "type": RESOURCE, "size": GIB}]}, blocks
    table = doc["machineState"][str(PAGE_NODE)]["memoryMap"][RESOURCE]
    assert (table["total"], table["reserved"], table["free"]) == (GIB, GIB, 0), table


def test_more_1g_pages_than_any_node_has_are_refused(node: GuestNode) -> None:
    before = state(node).get("entries")
    refusal = node.refuse("too-many-gigantic", "1", limit="1", memory=TOO_MANY)
    assert refusal.code == "RESOURCE_EXHAUSTED", refusal
    assert "UnexpectedAdmissionError" in refusal.message, refusal
    assert "failed to find NUMA nodes to extend the current topology hint" in refusal.message, refusal
    assert state(node).get("entries") == before, "the refused pod holds memory"
