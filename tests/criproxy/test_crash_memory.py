"""SIGKILL the proxy with ``--memory-manager-policy Static`` between its steps: after a restart the pair of state
files (cpu_manager_state, memory_manager_state) agrees with itself and with the runtime: no memory entry without a
container, every running Guaranteed container accounted, the memory file's machine state adding up to its entries.

The proxy is a real process in front of the in-process runtime, which kills it from inside the call the proxy is
making (tests/criproxy/crash_proxy.py); the kill between the two files' writes is made by putting back the CPU file the
proxy had before the admission (what a kill after the memory file's rename and before the CPU file's leaves)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from allocator.memory.checkpoint import parse_memory_checkpoint
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy.crash_proxy import Proxy, check_invariants, kill_during, kill_during_removal, restart, running
from tests.fixtures.make_sysfs import write_node_memory

GI = 1 << 30


@pytest.fixture
async def proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> AsyncIterator[Proxy]:
    for node in (0, 1):
        write_node_memory(two_numa_sysfs, node, 4 * GI // 1024, ((2048, 0),))
    p = Proxy(short_tmp, runtime.socket_path, two_numa_sysfs)
    p.args += ["--memory-manager-policy", "Static", "--reserved-memory", "0:memory=100Mi",
               "--topology-manager-policy", "best-effort"]
    async with running(p):
        yield p


def memory_entries(proxy: Proxy) -> dict[str, dict[str, list[dict]]]:
    return json.loads((proxy.state.parent / "memory_manager_state").read_text()).get("entries", {})


def check_pair(proxy: Proxy, runtime: MemoryRuntime) -> None:
    check_invariants(proxy, runtime)  # the CPU file: no leak, no CPU twice, every container on its decision
    path = proxy.state.parent / "memory_manager_state"
    _, state = parse_memory_checkpoint(path.read_bytes(), str(path))  # kubelet's checksum holds
    uid_of = {sid: cfg.metadata.uid for sid, cfg in runtime.sandboxes.items()}
    live = {(uid_of[c.sandbox_id], c.config.metadata.name): c for c in runtime.containers.values()
            if c.state != pb.CONTAINER_EXITED}
    held = {(uid, name) for uid, pod in memory_entries(proxy).items() for name in pod}
    present = {(uid_of[c.sandbox_id], c.config.metadata.name) for c in runtime.containers.values()}
    assert held <= present, f"memory held by containers that do not exist: {held - present}"
    assert set(live) <= held, f"running Guaranteed containers without memory: {set(live) - held}"
    for resource in state.resources():
        by_entries = sum(b.size for _, _, b in state.iter_blocks() if b.resource == resource)
        by_machine = sum(ns.memory[resource].reserved for ns in state.machine.values() if resource in ns.memory)
        assert by_entries == by_machine, f"{resource}: entries hold {by_entries}, the machine state {by_machine}"
    for (uid, name), c in live.items():  # each runs on the Memory Manager's nodes
        nodes = state.nodes_of(uid, name)
        assert c.resources.cpuset_mems == str(CPUSet(nodes)), (uid, name)


def guaranteed(k: CRIClient, cpu: int, memory: int) -> pb.ContainerConfig:
    cfg = k.container_config("app", cpu_milli=cpu, limit_milli=cpu)
    cfg.linux.resources.memory_limit_in_bytes = memory
    return cfg


async def run(k: CRIClient, name: str, cpu: int, memory: int) -> tuple[str, pb.PodSandboxConfig, str]:
    cfg = k.sandbox_config(name, f"uid-{name}")
    sid = await k.run_pod_sandbox(cfg)
    cid = await k.create_container(sid, guaranteed(k, cpu, memory), cfg)
    await k.start_container(cid)
    return sid, cfg, cid


@pytest.mark.parametrize("kill_in", ["CreateContainer", "UpdateContainerResources"])
async def test_kill_during_create_or_narrowing_leaves_a_consistent_pair(proxy: Proxy, runtime: MemoryRuntime,
                                                                        kill_in: str) -> None:
    async with CRIClient(proxy.socket, timeout=10) as k:
        await run(k, "shared", 500, GI)  # a Guaranteed container on the shared pool, narrowed below
        cfg = k.sandbox_config("db", "uid-db")
        sid = await k.run_pod_sandbox(cfg)
        await kill_during(proxy, runtime, kill_in, lambda: k.create_container(sid, guaranteed(k, 2000, 3 * GI), cfg))
    await restart(proxy)
    check_pair(proxy, runtime)
    async with CRIClient(proxy.socket, timeout=10) as k:  # kubelet retries the create
        cid = await k.create_container(sid, guaranteed(k, 2000, 3 * GI), cfg)
        await k.start_container(cid)
        # 3Gi: one 4Gi NUMA node (node 0 holds the shared container's 1Gi: node 1)
        assert runtime.containers[cid].resources.cpuset_mems == "1"
    check_pair(proxy, runtime)


@pytest.mark.parametrize("kill_in", ["RemoveContainer", "StopPodSandbox", "RemovePodSandbox"])
async def test_kill_during_removal_gives_the_memory_back(proxy: Proxy, runtime: MemoryRuntime, kill_in: str) -> None:
    async with CRIClient(proxy.socket, timeout=10) as k:
        await run(k, "web", 500, GI)
        dsid, _, cid = await run(k, "db", 3000, 3 * GI)
        await kill_during_removal(k, proxy, runtime, kill_in, dsid, cid)
    await restart(proxy)
    check_pair(proxy, runtime)
    assert "uid-db" not in memory_entries(proxy)
    async with CRIClient(proxy.socket, timeout=10) as k:  # db's node is free again: 3Gi fit there once more
        await run(k, "big", 1000, 3 * GI)
    check_pair(proxy, runtime)


async def test_kill_between_the_two_files_writes(proxy: Proxy, runtime: MemoryRuntime) -> None:
    cpu_file = proxy.state
    async with CRIClient(proxy.socket, timeout=10) as k:
        await run(k, "web", 500, GI)
        before = cpu_file.read_bytes()
        cfg = k.sandbox_config("db", "uid-db")
        sid = await k.run_pod_sandbox(cfg)
        await kill_during(proxy, runtime, "CreateContainer",
                          lambda: k.create_container(sid, guaranteed(k, 2000, 2 * GI), cfg))
    proxy.reap()
    # killed before the runtime heard of it (the pair is written before the create is forwarded): no container
    for cid in [c.id for c in runtime.containers.values() if c.sandbox_id == sid]:
        del runtime.containers[cid]
    shutil.copyfile(cpu_file, cpu_file.with_name("after"))
    cpu_file.write_bytes(before)  # the memory file has db's entry, the CPU file not: killed between the renames
    assert "uid-db" in memory_entries(proxy)
    await proxy.start()
    check_pair(proxy, runtime)
    assert "uid-db" not in memory_entries(proxy)
