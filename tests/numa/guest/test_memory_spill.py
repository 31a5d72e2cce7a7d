"""Memory past one NUMA node as numapin's Memory Manager accounts it, on a real kernel (2s4c1t8n: eight nodes of
512 MiB and one CPU each, CPU 0 reserved). 2s4n's story (test_memory.py) spreads a pod over two nodes and touches a
little memory from a CPU of each; here one process allocates more than its own node has free, and the kernel must
put the rest on the pod's other node and nowhere else.

The proxy runs under ``restricted`` with ``--reserved-memory`` on every node covering what the guest's own processes
hold there when it starts (MemTotal - MemFree, plus HEADROOM_MIB for what they still grow: the proxy's own start),
as kubelet's documentation asks of an operator, and ``--system-reserved`` making up the sum. A Guaranteed pod with
2 CPUs and SPILL_MIB of memory (more than any node's MemTotal) is admitted on nodes 1 and 2 (its CPUs 1 and 2: the
narrowest preferred hint); memory_manager_state holds one block over both, split as kubelet splits it (node 1's
free memory first, the rest on node 2), and each node's share is no more than the kernel's MemFree on that node
when the pod starts. Its process, on CPU 1, allocates (``fallocate`` on a tmpfs mounted into it: resident pages,
zeroed by the kernel; the sandbox's own /dev/shm holds 64 MiB) more than node 1 has free: the per-node Shmem
growth is on nodes 1 and 2 only, and node 2 takes what node 1 could not.

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
from tests.numa.guest.node import WORK, GuestNode, Memory, NodeConfig, node_meminfo

S = CPUSet.parse
MIB = 1 << 20
SPILL_MIB = 560         # more than a node of 512 MiB holds, less than two hold once the system's share is reserved
HEADROOM_MIB = 64       # reserved on every node beyond what the system holds there at the proxy's start
NODES = (1, 2)          # where the pod goes: CPUs 1 and 2 (CPU 0 reserved), one per node
EVICTION_MIB = 100      # kubelet's default hard eviction threshold, part of the reservations' sum
BEFORE: dict[str, dict[int, int]] = {}


def reservations(machine: Topology) -> NodeConfig:
    """restricted, CPU 0 reserved, every node's memory reserved as the system holds it now plus HEADROOM_MIB."""
    held = {n: -(-(node_meminfo(n, "MemTotal") - node_meminfo(n, "MemFree")) // 1024) + HEADROOM_MIB
            for n in machine.numa_nodes}
    reserved = ";".join(f"{n}:memory={mib}Mi" for n, mib in sorted(held.items()))
    return NodeConfig("restricted", "0", reserved_memory=reserved,
                      extra=("--system-reserved", f"memory={sum(held.values()) - EVICTION_MIB}Mi"))


@pytest.fixture(scope="module")
def tmpfs() -> Iterator[Path]:
    """A tmpfs for the pod to fill (no node bound: its pages go where the writer's cpuset lets them); gone after."""
    mount = WORK / "spill"
    mount.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SPILL_MIB}m", "numapin-spill", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def state(node: GuestNode) -> dict[str, Any]:
    path = node.state_dir / "memory_manager_state"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_pod_larger_than_a_node_is_split_over_two_as_the_kernel_can_hold_it(node: GuestNode, machine: Topology,
                                                                             tmpfs: Path) -> None:
    total = {n: node_meminfo(n, "MemTotal") // 1024 for n in machine.numa_nodes}
    assert max(total.values()) < SPILL_MIB, f"a node holds {SPILL_MIB} MiB (MemTotal MiB: {total})"
    node.configure(reservations(machine))
    BEFORE["free"] = {n: node_meminfo(n, "MemFree") for n in machine.numa_nodes}
    BEFORE["shmem"] = {n: node_meminfo(n, "Shmem") for n in machine.numa_nodes}
    # more than node 1 has free now: the kernel must place the rest elsewhere
    fill = BEFORE["free"][NODES[0]] // 1024 + 32
    command = ("sh", "-c", f"taskset -c {NODES[0]} fallocate -l {fill}M /spill/fill; echo $? > /fill.tmp; "
                           f"mv /fill.tmp /fill.rc; exec sleep 86400")  # the status whole when seen
    BEFORE["fill"] = {0: fill}
    node.run("spill", "2", limit="2", memory=Memory(SPILL_MIB), command=command, mounts=[(str(tmpfs), "/spill")])
    k = node.settled("spill", S("1-2"), S("1-2"))
    assert (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (S("1-2"), S("1-2"), S("1-2"), S("1-2")), k
    doc = state(node)
    [(_, blocks)] = (doc.get("entries") or {}).items()
    assert blocks == {"app": [{"numaAffinity": list(NODES), "type": "memory", "size": SPILL_MIB * MIB}]}, blocks
    tables = {int(n): s["memoryMap"]["memory"] for n, s in doc["machineState"].items()}
    share = {n: t["reserved"] for n, t in tables.items()}
    first = tables[NODES[0]]["allocatable"]
    assert share == {n: first if n == NODES[0] else SPILL_MIB * MIB - first if n == NODES[1] else 0
                     for n in machine.numa_nodes}, f"per-node split (bytes): {share}"
    over = {n: (share[n] // MIB, BEFORE["free"][n] // 1024) for n in NODES if share[n] > BEFORE["free"][n] * 1024}
    assert not over, f"shares past the kernel's free memory (node: share MiB, MemFree MiB): {over}"


def test_memory_its_process_allocates_past_its_first_node_lands_on_the_second_and_no_other(
        node: GuestNode, machine: Topology) -> None:
    rc = Path(f"/proc/{node.kernel('spill').pid}/root/fill.rc")
    deadline = time.monotonic() + 120  # the kernel zeroes every page: seconds under emulation
    while not rc.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    fill = BEFORE["fill"][0]
    assert rc.exists() and rc.read_text().strip() == "0", f"fallocate of {fill} MiB failed in the container"
    grown = {n: (node_meminfo(n, "Shmem") - BEFORE["shmem"][n]) // 1024 for n in machine.numa_nodes}
    first, second = NODES
    assert grown[first] + grown[second] >= fill * 0.95, f"Shmem grew (MiB): {grown}; {fill} MiB allocated"
    assert grown[second] >= 16, f"nothing spilled to node {second} (Shmem grew, MiB: {grown})"
    assert grown[first] >= BEFORE["free"][first] // 1024 * 3 // 4, f"node {first} was not filled first: {grown}"
    assert all(g < 8 for n, g in grown.items() if n not in NODES), f"memory landed elsewhere (MiB): {grown}"
