"""The Memory Manager's NUMA nodes in the kernel: `numapin criproxy` (a real process, ``--memory-manager-policy
Static``, the machine's real sysfs) in front of a real containerd + runc.

This machine has one NUMA node, so the kernel can only ever hold ``cpuset.mems`` ``0``: what is checked here is the
chain, for every kind of container the Memory Manager accounts, from the memory state (``memory_manager_state``)
to what containerd received (the OCI spec it made, ``linux.resources.cpu.mems``) to the kernel (the cgroup's
``cpuset.mems`` and the process's ``Mems_allowed_list``), through admission, kubelet's memory pass of a resize and
a refusal. That nodes wider than the CPUs' nodes reach the runtime is proved in process
(tests/criproxy/test_memory_proxy.py); that they reach the kernel and hold the memory, in the multi-NUMA VMs."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from allocator.memory.checkpoint import parse_memory_checkpoint
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.proxy_process import ProxyProcess, serving

from .test_e2e_containerd import EXCL, SHARED, cgroup_file, cpus_of, pid_of

pytestmark = pytest.mark.containerd

MiB = 1 << 20


@pytest.fixture(scope="module")
def lab(shared_lab: ContainerdLab) -> Iterator[ContainerdLab]:
    yield shared_lab
    asyncio.run(shared_lab.remove_all_pods())


@pytest.fixture
async def proxy(lab: ContainerdLab) -> AsyncIterator[ProxyProcess]:
    p = ProxyProcess(scratch_dir("npx-m-"), lab.socket, reserved_cpus=SHARED,
                     extra_args=("--memory-manager-policy", "Static", "--reserved-memory", "0:memory=100Mi"))
    async with serving(p, lab):
        yield p


@pytest.fixture
async def kubelet(proxy: ProxyProcess) -> AsyncIterator[CRIClient]:
    async with CRIClient(proxy.socket) as c:
        yield c


def guaranteed(k: CRIClient, cpu_milli: int, memory: int) -> pb.ContainerConfig:
    cfg = k.container_config("main", cpu_milli=cpu_milli, limit_milli=cpu_milli)
    cfg.linux.resources.memory_limit_in_bytes = memory
    cfg.linux.resources.memory_swap_limit_in_bytes = memory
    return cfg


async def start(k: CRIClient, name: str, cfg: pb.ContainerConfig, qos: str = "guaranteed") -> tuple[str, str]:
    sb = k.sandbox_config(name, f"uid-{name}", qos=qos)
    sid = await k.run_pod_sandbox(sb)
    cid = await k.create_container(sid, cfg, sb)
    await k.start_container(cid)
    return sid, cid


def memory_state(proxy: ProxyProcess) -> bytes:
    return (proxy.state_dir / "memory_manager_state").read_bytes()


def state_nodes(proxy: ProxyProcess, uid: str) -> str | None:
    """The Memory Manager's nodes of the pod's container ``main`` as the memory state file says (kubelet's checksum
    checked), None when it accounts none."""
    _, state = parse_memory_checkpoint(memory_state(proxy))
    nodes = state.nodes_of(uid, "main")
    return str(CPUSet(nodes)) if nodes else None


def mems_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Mems_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Mems_allowed_list for pid {pid}")


async def received_mems(k: CRIClient, cid: str) -> str:
    """``linux.resources.cpu.mems`` of the OCI spec containerd made of the create (and updates) it received."""
    info = json.loads((await k.container_status(cid, verbose=True)).info["info"])
    return str(info["runtimeSpec"]["linux"]["resources"]["cpu"]["mems"])


async def mems_chain(k: CRIClient, cid: str) -> tuple[str, str, str]:
    """(containerd's spec, the cgroup's cpuset.mems, the process's Mems_allowed_list) of a container."""
    pid = await pid_of(k, cid)
    return await received_mems(k, cid), cgroup_file(pid, "cpuset", "cpuset.mems"), mems_allowed(pid)


async def test_the_memory_managers_nodes_reach_containerd_and_the_kernel(kubelet: CRIClient,
                                                                       proxy: ProxyProcess) -> None:
    _, excl = await start(kubelet, "excl", guaranteed(kubelet, 1000, 64 * MiB))
    _, shared = await start(kubelet, "small", guaranteed(kubelet, 500, 32 * MiB))  # shared CPUs, memory pinned
    web_cfg = kubelet.container_config("main", cpu_milli=200)
    web_cfg.linux.resources.memory_limit_in_bytes = 32 * MiB
    _, web = await start(kubelet, "web", web_cfg, qos="burstable")  # not accounted: the pool's nodes
    assert cpus_of(await pid_of(kubelet, excl)) == (EXCL, EXCL)
    assert cpus_of(await pid_of(kubelet, shared)) == (SHARED, SHARED)
    for uid, cid in (("uid-excl", excl), ("uid-small", shared)):
        nodes = state_nodes(proxy, uid)
        assert nodes == "0"
        assert await mems_chain(kubelet, cid) == (nodes, nodes, nodes)
    assert state_nodes(proxy, "uid-web") is None
    assert await mems_chain(kubelet, web) == ("0", "0", "0")
    _, state = parse_memory_checkpoint(memory_state(proxy))
    assert state.machine[0].memory["memory"].reserved == 96 * MiB


async def test_kubelets_memory_pass_is_accounted_and_the_kernel_follows(kubelet: CRIClient,
                                                                       proxy: ProxyProcess) -> None:
    _, cid = await start(kubelet, "db", guaranteed(kubelet, 1000, 64 * MiB))
    pid = await pid_of(kubelet, cid)
    resources = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=100000, cpu_shares=1024,
                                           memory_limit_in_bytes=128 * MiB, memory_swap_limit_in_bytes=128 * MiB)
    await kubelet.update_container_resources(cid, resources)
    _, state = parse_memory_checkpoint(memory_state(proxy))
    assert [(b.resource, b.size) for b in state.blocks("uid-db", "main") or ()] == [("memory", 128 * MiB)]
    assert cgroup_file(pid, "memory", "memory.limit_in_bytes") == str(128 * MiB)
    assert await mems_chain(kubelet, cid) == ("0", "0", "0")
    assert cpus_of(pid) == (EXCL, EXCL)


async def test_memory_no_node_holds_is_refused_and_nothing_reaches_containerd(
        kubelet: CRIClient, proxy: ProxyProcess, lab: ContainerdLab) -> None:
    before = memory_state(proxy)
    sb = kubelet.sandbox_config("huge", "uid-huge")
    sid = await kubelet.run_pod_sandbox(sb)
    with pytest.raises(grpc.aio.AioRpcError) as e:  # far more than the machine's one NUMA node holds
        await kubelet.create_container(sid, guaranteed(kubelet, 1000, 1 << 50), sb)
    assert e.value.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "memory" in (e.value.details() or "")
    assert memory_state(proxy) == before
    async with CRIClient(lab.socket) as direct:
        assert [c for c in await direct.list_containers() if c.pod_sandbox_id == sid] == []


async def test_a_resize_rolled_back_leaves_both_states_and_both_files_as_they_were(
        kubelet: CRIClient, proxy: ProxyProcess) -> None:
    """The CPU and the memory of a container change in one call (500m -> 1 CPU of its own, 64Mi -> 128Mi); the
    kernel refuses to narrow a shared container off the CPU (a child cgroup holds it): the resize is rolled back,
    and the pair of files, the memory limit and every cpuset are as before."""
    from .test_mode_rollback_containerd import cpu_held_by_a_child_cgroup

    _, web = await start(kubelet, "web", kubelet.container_config("main", cpu_milli=200), qos="burstable")
    _, db = await start(kubelet, "db", guaranteed(kubelet, 500, 64 * MiB))
    web_pid, db_pid = await pid_of(kubelet, web), await pid_of(kubelet, db)
    files = (proxy.state_dir / "cpu_manager_state", proxy.state_dir / "memory_manager_state")
    before = [f.read_bytes() for f in files]
    limit = cgroup_file(db_pid, "memory", "memory.limit_in_bytes")
    resources = pb.LinuxContainerResources(cpu_period=100000, cpu_quota=100000, cpu_shares=1024,
                                           memory_limit_in_bytes=128 * MiB, memory_swap_limit_in_bytes=128 * MiB)
    with cpu_held_by_a_child_cgroup(web_pid, EXCL), pytest.raises(grpc.aio.AioRpcError) as e:
        await kubelet.update_container_resources(db, resources)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "rolled back" in (e.value.details() or "")
    assert [f.read_bytes() for f in files] == before
    assert cgroup_file(db_pid, "memory", "memory.limit_in_bytes") == limit == str(64 * MiB)
    assert cpus_of(db_pid)[0] == cpus_of(web_pid)[0]  # both on the whole shared pool again
    url = f"http://127.0.0.1:{proxy.port}/status"  # the proxy's memory state (not only its files) as before
    status = json.loads(await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read()))
    assert [h["size"] for h in status["memory"]["holders"] if h["podUID"] == "uid-db"] == [64 * MiB]
    await kubelet.update_container_resources(db, resources)  # the cause gone: kubelet's retry works
    assert cpus_of(db_pid) == (EXCL, EXCL) and state_nodes(proxy, "uid-db") == "0"
    assert cgroup_file(db_pid, "memory", "memory.limit_in_bytes") == str(128 * MiB)
    _, state = parse_memory_checkpoint(memory_state(proxy))
    assert [(b.resource, b.size) for b in state.blocks("uid-db", "main") or ()] == [("memory", 128 * MiB)]
