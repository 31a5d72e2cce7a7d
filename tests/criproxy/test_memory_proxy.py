"""The proxy with ``--memory-manager-policy Static`` (kubelet's Memory Manager, issue 21), in process against the
in-process CRI runtime on a two-NUMA-node fixture sysfs (CPUs 0-3 and 4-7, 4Gi of memory per node): what reaches
the runtime as ``cpuset_mems``, the pair of state files, the start-up reconcile, NRT, metrics and configuration
errors."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from allocator.memory.checkpoint import parse_memory_checkpoint
from criproxy.app import CriProxy
from criproxy.config import ProxyConfig, load_config
from numapin.cli import main
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy import inproc_proxy as inproc
from tests.fixtures.make_sysfs import write_node_memory

GI = 1 << 30
NODE_KB = 4 * GI // 1024


def memory_sysfs(sysfs: Path, pages_2m: tuple[int, int] = (0, 0)) -> Path:
    for node in (0, 1):
        write_node_memory(sysfs, node, NODE_KB, ((2048, pages_2m[node]),))
    return sysfs


def proxy_config(tmp: Path, runtime: MemoryRuntime, sysfs: Path, **over: object) -> ProxyConfig:
    """The pinning tests' proxy with the Memory Manager on (100Mi reserved on node 0, topology manager
    best-effort)."""
    memory: dict[str, object] = {"node_name": "node-m", "memory_manager_policy": "Static",
                                 "reserved_memory": "0:memory=100Mi", "topology_manager_policy": "best-effort"}
    return inproc.proxy_config(tmp, runtime, sysfs, **{**memory, **over})


@pytest.fixture
async def proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path,
                request: pytest.FixtureRequest) -> AsyncIterator[CriProxy]:
    over = dict(getattr(request, "param", {}))
    sysfs = memory_sysfs(two_numa_sysfs, over.pop("pages_2m", (0, 0)))  # type: ignore[arg-type]
    async with inproc.running_proxy(proxy_config(short_tmp, runtime, sysfs, **over)) as p:
        yield p


def container(name: str, cpu_milli: int, memory: int, hugepages_2m: int = 0) -> pb.ContainerConfig:
    cfg = CRIClient.container_config(name, cpu_milli=cpu_milli, limit_milli=cpu_milli)
    cfg.linux.resources.memory_limit_in_bytes = memory
    # kubelet lists every huge-page size of the node, 0 for the sizes the container does not ask
    cfg.linux.resources.hugepage_limits.append(pb.HugepageLimit(page_size="2MB", limit=hugepages_2m))
    cfg.linux.resources.hugepage_limits.append(pb.HugepageLimit(page_size="1GB", limit=0))
    return cfg


async def run(k: CRIClient, name: str, cfg: pb.ContainerConfig) -> tuple[str, str]:
    sb = k.sandbox_config(name, f"uid-{name}")
    sid = await k.run_pod_sandbox(sb)
    cid = await k.create_container(sid, cfg, sb)
    await k.start_container(cid)
    return sid, cid


def memory_file(proxy: CriProxy) -> dict:
    return json.loads(proxy.config.memory_state_file.read_text())


def resources(runtime: MemoryRuntime, cid: str) -> pb.LinuxContainerResources:
    return runtime.containers[cid].resources


async def test_memory_larger_than_a_node_spans_both_nodes_under_best_effort(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, cid = await run(kubelet, "big", container("app", 1000, 6 * GI))
    res = resources(runtime, cid)
    assert res.cpuset_mems == "0-1"  # the Memory Manager's nodes, wider than the CPU's node
    assert len(res.cpuset_cpus.split(",")) == 1 and "-" not in res.cpuset_cpus
    doc = memory_file(proxy)
    blocks = doc["entries"]["uid-big"]["app"]
    assert blocks == [{"numaAffinity": [0, 1], "type": "memory", "size": 6 * GI}]
    _, state = parse_memory_checkpoint(proxy.config.memory_state_file.read_bytes())  # kubelet's checksum holds
    assert state.nodes_of("uid-big", "app") == (0, 1)


async def test_a_guaranteed_container_on_the_shared_pool_keeps_its_memory_nodes_through_narrowing(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, small = await run(kubelet, "small", container("app", 500, 3 * GI))  # 500m: shared CPUs, memory pinned
    res = resources(runtime, small)
    assert res.cpuset_cpus == "0-7" and res.cpuset_mems == "0"
    _, big = await run(kubelet, "excl", container("app", 4000, 3 * GI))  # 4 CPUs of node 1, its memory on 1
    assert (resources(runtime, big).cpuset_cpus, resources(runtime, big).cpuset_mems) == ("4-7", "1")
    # the pool narrowed to 0-3; the shared Guaranteed container keeps the Memory Manager's node
    assert (resources(runtime, small).cpuset_cpus, resources(runtime, small).cpuset_mems) == ("0-3", "0")
    report = await proxy.converger.converge_once("test")
    assert report.failed == 0
    assert resources(runtime, small).cpuset_mems == "0"


@pytest.mark.parametrize("proxy", [{"topology_manager_policy": "single-numa-node"}], indirect=True)
async def test_single_numa_node_refuses_memory_no_node_holds_and_records_nothing(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    sb = kubelet.sandbox_config("huge", "uid-huge")
    sid = await kubelet.run_pod_sandbox(sb)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await kubelet.create_container(sid, container("app", 1000, 6 * GI), sb)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "TopologyAffinityError" in (e.value.details() or "")
    assert "memory" in (e.value.details() or "")
    assert runtime.containers == {}
    assert "uid-huge" not in memory_file(proxy).get("entries", {})


@pytest.mark.parametrize("proxy", [{"pages_2m": (0, 512), "topology_manager_policy": "restricted"}], indirect=True)
async def test_hugepages_from_cri_steer_the_cpus_to_the_node_with_the_pages(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, cid = await run(kubelet, "pages", container("app", 1000, 256 << 20, hugepages_2m=512 << 20))
    res = resources(runtime, cid)
    assert res.cpuset_mems == "1" and int(res.cpuset_cpus) in range(4, 8)
    types = {b["type"]: b["numaAffinity"] for b in memory_file(proxy)["entries"]["uid-pages"]["app"]}
    assert types == {"memory": [1], "hugepages-2Mi": [1]}


async def test_state_pair_nrt_and_metrics_follow_admission_and_release(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    sid, cid = await run(kubelet, "p", container("app", 1000, 2 * GI))
    cpu_doc = json.loads(proxy.config.state_file.read_text())
    assert "uid-p" in cpu_doc["entries"] and "uid-p" in memory_file(proxy)["entries"]
    await asyncio.sleep(0)
    doc = proxy.nrt_document()
    zones = {z["name"]: {r["name"]: r for r in z["resources"]} for z in doc["zones"]}
    node = [n for n, z in zones.items() if z["memory"]["available"] != z["memory"]["allocatable"]]
    assert len(node) == 1
    assert {a["name"]: a["value"] for a in doc["attributes"]}["memoryManagerPolicy"] == "Static"
    url = f"http://127.0.0.1:{proxy.metrics_port}/metrics"

    async def reserved_bytes() -> list[float]:
        body = (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
        return sorted(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
                      if line.startswith('numapin_criproxy_memory_bytes{kind="reserved"')
                      and 'resource="memory"' in line)

    # the NRT loop publishes the metrics after the admission: wait for it (a loaded machine may take seconds)
    deadline = asyncio.get_running_loop().time() + 30
    reserved = await reserved_bytes()
    while reserved != [0.0, float(2 * GI)] and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
        reserved = await reserved_bytes()
    assert reserved == [0.0, float(2 * GI)]
    await kubelet.stop_container(cid)
    await kubelet.stop_pod_sandbox(sid)
    await kubelet.remove_container(cid)
    await kubelet.remove_pod_sandbox(sid)
    assert "uid-p" not in memory_file(proxy).get("entries", {})
    assert "uid-p" not in json.loads(proxy.config.state_file.read_text()).get("entries", {})


async def test_restart_loads_the_memory_state_and_drops_entries_of_containers_gone(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    cfg = proxy_config(short_tmp, runtime, memory_sysfs(two_numa_sysfs))
    p = await CriProxy(cfg).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    async with CRIClient(cfg.listen) as k:
        _, kept = await run(k, "kept", container("app", 500, 1 * GI))
        _, gone = await run(k, "gone", container("app", 1000, 1 * GI))
    await p.stop()
    del runtime.containers[gone]  # removed while the proxy was down
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        assert p.allocator.container_mems("uid-kept", "app") is not None
        assert p.allocator.container_mems("uid-gone", "app") is None
        entries = memory_file(p)["entries"]
        assert "uid-kept" in entries and "uid-gone" not in entries
        assert resources(runtime, kept).cpuset_mems == str(p.allocator.container_mems("uid-kept", "app"))
    finally:
        await p.stop()


async def test_a_drifted_memory_file_refuses_the_start_and_is_kept(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    cfg = proxy_config(short_tmp, runtime, memory_sysfs(two_numa_sysfs))
    p = await CriProxy(cfg).start()
    await p.stop()
    # the machine changed under the file (node 1 lost a gigabyte): kubelet would refuse its own file too
    write_node_memory(two_numa_sysfs, 1, NODE_KB - (1 << 20), ((2048, 0),))
    before = cfg.memory_state_file.read_bytes()
    from allocator.errors import CheckpointError
    with pytest.raises(CheckpointError, match=r"memory_manager_state.*expected machine state is different"):
        await CriProxy(cfg).start()
    assert cfg.memory_state_file.read_bytes() == before


@pytest.mark.parametrize(("args", "needle"), [
    (["--reserved-memory", "0:memory"], "the reserved limit has incorrect value, expected type=quantatity"),
    (["--reserved-memory", "x:memory=1Gi"], "failed to convert the NUMA node ID, exptected integer, got x"),
    (["--reserved-memory", "0:memory=1Gi"], 'the total amount "1Gi" of type "memory" is not equal to the value '
                                            '"100Mi" determined by Node Allocatable feature'),
    (["--reserved-memory", "7:memory=100Mi"], "references a NUMA node 7 that does not exist"),
    (["--reserved-memory", "0:memory=100Mi", "--memory-manager-policy", "static"], 'unknown policy: "static"'),
    (["--eviction-hard", "memory.available"], "expected signal<threshold"),
    (["--eviction-hard", "memory.available<0"], "you should specify the system reserved memory"),
    (["--reserved-memory", "0:memory=1Gi", "--system-reserved", "memory=oops"], "oops"),
])
def test_bad_memory_configuration_exits_2_with_kubelets_message(
        tmp_path: Path, two_numa_sysfs: Path, capsys: pytest.CaptureFixture[str], args: list[str],
        needle: str) -> None:
    sysfs = memory_sysfs(two_numa_sysfs)
    rc = main(["criproxy", "--sysfs", str(sysfs), "--state-dir", str(tmp_path / "s"), "--listen",
               str(tmp_path / "p.sock"), "--reserved-cpus", "0", "--memory-manager-policy", "Static", *args])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert err.startswith("numapin criproxy: ") and needle in err, err


def test_reservations_adding_up_to_node_allocatable_build_the_node(short_tmp: Path, runtime: MemoryRuntime,
                                                                    two_numa_sysfs: Path) -> None:
    from criproxy.app import node_parts_of
    cfg = proxy_config(short_tmp, runtime, memory_sysfs(two_numa_sysfs), reserved_memory="0:memory=1Gi;1:memory=1Gi",
                       kube_reserved="memory=1948Mi,cpu=1")
    parts = node_parts_of(cfg)
    assert parts.memory_policy is not None
    assert parts.config.memory is not None and parts.config.memory.machine.capacity()["memory"] == 8 * GI
    assert node_parts_of(proxy_config(short_tmp, runtime, two_numa_sysfs,
                                      memory_manager_policy="None", reserved_memory="")).memory_policy is None


def test_reserved_memory_in_the_config_file(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("memoryManagerPolicy: Static\nreservedMemory:\n  - numaNode: 0\n    limits:\n      memory: 1124Mi\n"
                 "  - numaNode: 1\n    limits:\n      memory: 1Gi\nkubeReserved:\n  memory: 2Gi\n"
                 "evictionHard:\n  memory.available: 100Mi\n")
    cfg = load_config(str(f), {})
    assert cfg.memory_manager_policy == "Static"
    assert [r.to_flag() for r in cfg.reserved_memory] == ["0:memory=1124Mi", "1:memory=1Gi"]
    assert cfg.kube_reserved == {"memory": "2Gi"} and cfg.eviction_hard == "100Mi"


def memory_pass(cpu_milli: int, memory: int) -> pb.LinuxContainerResources:
    """kubelet's memory pass of a Guaranteed container's resize: the new memory limit with the CPU values as they
    are (kubelet sends the whole block, no cpuset)."""
    return pb.LinuxContainerResources(cpu_period=100000, cpu_quota=cpu_milli * 100,
                                      cpu_shares=cpu_milli * 1024 // 1000, memory_limit_in_bytes=memory)


def state_pair(proxy: CriProxy) -> tuple[bytes, bytes]:
    return proxy.config.state_file.read_bytes(), proxy.config.memory_state_file.read_bytes()


async def test_a_memory_resize_is_accounted_and_extends_the_nodes_when_they_cannot_hold_it(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, cid = await run(kubelet, "db", container("app", 1000, 1 * GI))
    assert resources(runtime, cid).cpuset_mems == "0"
    await kubelet.update_container_resources(cid, memory_pass(1000, 3 * GI))
    res = resources(runtime, cid)
    assert (res.memory_limit_in_bytes, res.cpuset_mems, res.cpuset_cpus) == (3 * GI, "0", "1")
    assert memory_file(proxy)["entries"]["uid-db"]["app"] == [
        {"numaAffinity": [0], "type": "memory", "size": 3 * GI}]
    # 6Gi: node 0 cannot hold it (4Gi less 100Mi reserved): the nodes extended as kubelet extends a hint
    await kubelet.update_container_resources(cid, memory_pass(1000, 6 * GI))
    res = resources(runtime, cid)
    assert (res.memory_limit_in_bytes, res.cpuset_mems, res.cpuset_cpus) == (6 * GI, "0-1", "1")
    _, state = parse_memory_checkpoint(proxy.config.memory_state_file.read_bytes())  # kubelet's checksum holds
    assert state.nodes_of("uid-db", "app") == (0, 1)
    assert proxy.allocator.container_mems("uid-db", "app") == CPUSet.parse("0-1")
    # a shrink keeps the nodes (a node is given back only when the container goes)
    await kubelet.update_container_resources(cid, memory_pass(1000, 2 * GI))
    assert (resources(runtime, cid).memory_limit_in_bytes, resources(runtime, cid).cpuset_mems) == (2 * GI, "0-1")
    assert memory_file(proxy)["entries"]["uid-db"]["app"][0]["size"] == 2 * GI
    assert [(r["result"], r["reason"]) for r in proxy.resizer.recent()] == [("resized", None)] * 3
    assert "memory 3Gi -> 6Gi, NUMA nodes [0] -> [0, 1]" in proxy.resizer.recent()[1]["message"]


async def test_a_memory_resize_no_placement_holds_is_refused_and_changes_neither_file(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, cid = await run(kubelet, "db", container("app", 1000, 1 * GI))
    _, other = await run(kubelet, "other", container("app", 1000, 3 * GI))  # node 1 (node 0 holds db's 1Gi)
    assert resources(runtime, other).cpuset_mems == "1"
    before = state_pair(proxy)
    states = proxy.pinning.mems.snapshot()
    calls = len(runtime.requests("UpdateContainerResources"))
    # 5Gi: node 0 alone cannot, nodes 0-1 would break kubelet's group rule (node 1 serves "other" alone): Deferred
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await kubelet.update_container_resources(cid, memory_pass(1000, 5 * GI))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "resize refused (Deferred)" in (e.value.details() or "")
    # 9Gi: more than the node's allocatable memory: Infeasible
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await kubelet.update_container_resources(cid, memory_pass(1000, 9 * GI))
    assert "resize refused (Infeasible)" in (e.value.details() or "")
    assert state_pair(proxy) == before and proxy.pinning.mems.snapshot() == states
    assert len(runtime.requests("UpdateContainerResources")) == calls  # never forwarded
    assert resources(runtime, cid).memory_limit_in_bytes == 1 * GI
    assert [(r["result"], r["reason"]) for r in proxy.resizer.recent()] == [("refused", "Deferred"),
                                                                          ("refused", "Infeasible")]


async def test_a_resize_refused_for_kubelet_drift_restores_both_states_and_both_files(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    """CPU and memory change in one call: the memory is accounted, then the CPUs of its own are refused while
    kubelet's CPU Manager is static; the pair of states and of files is as before."""
    root = short_tmp / "kubelet"
    root.mkdir()
    (root / "config.yaml").write_text("cpuManagerPolicy: static\n")
    cfg = proxy_config(short_tmp, runtime, memory_sysfs(two_numa_sysfs), kubelet_config=str(root / "config.yaml"),
                       kubelet_root_dir=str(root), kubelet_check_period="0",
                       proc_root=inproc.proc_without_kubelet(short_tmp))
    async with inproc.running_proxy(cfg) as p, CRIClient(cfg.listen) as k:
        _, cid = await run(k, "db", container("app", 500, 1 * GI))  # the shared pool: admitted while drifting
        before, states = state_pair(p), p.pinning.mems.snapshot()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await k.update_container_resources(cid, memory_pass(1000, 2 * GI))
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no new exclusive CPUs while kubelet would write cpusets too" in (e.value.details() or "")
        assert state_pair(p) == before and p.pinning.mems.snapshot() == states
        assert resources(runtime, cid).memory_limit_in_bytes == 1 * GI
        assert p.resizer.recent()[-1]["reason"] == "KubeletDrift"
        # kubelet's memory pass alone (no CPUs of its own) is accounted while it drifts
        await k.update_container_resources(cid, memory_pass(500, 2 * GI))
        assert memory_file(p)["entries"]["uid-db"]["app"][0]["size"] == 2 * GI
        assert resources(runtime, cid).cpuset_mems == "0"


async def test_numapin_status_shows_memory_per_numa_node_and_who_holds_it(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime, capsys: pytest.CaptureFixture[str]) -> None:
    from numapin.node_status import fetch_proxy_status, from_proxy_status, from_state_dir, render_text

    await run(kubelet, "big", container("app", 1000, 6 * GI))  # nodes 0-1
    url = f"http://127.0.0.1:{proxy.metrics_port}/status"
    live = from_proxy_status(await asyncio.to_thread(fetch_proxy_status, url), "test")
    files = from_state_dir(proxy.config.state_dir, sysfs=proxy.config.sysfs)
    for status in (live, files):
        assert status.memory is not None
        text = render_text(status)
        assert "memory per NUMA node (Memory Manager policy Static):" in text
        assert "node 0: 1 container block(s), in the group of NUMA nodes 0-1" in text
        # node 0: 4Gi less 100Mi reserved, all of it held (6Gi taken node by node in ascending order)
        assert "memory 0 free of 3996Mi allocatable (3996Mi held, 100Mi reserved for the system, 4Gi total)" in text
        assert "memory 1948Mi free of 4Gi allocatable (2148Mi held, 0 reserved for the system, 4Gi total)" in text
        doc = status.to_dict()["memory"]
        assert doc["nodes"]["1"]["resources"]["memory"]["reserved"] == 6 * GI - (4 * GI - (100 << 20))
        assert [(h["podUID"], h["type"], h["numaNodes"]) for h in doc["holders"]] == [("uid-big", "memory", [0, 1])]
    assert "default/big app: memory 6Gi on NUMA node(s) 0-1" in render_text(live)  # the live view knows the name
    rc = await asyncio.to_thread(main, ["status", "--status-url", url, "--no-runtime"])
    assert rc == 0 and "memory held by containers:" in capsys.readouterr().out


async def test_kubelets_memory_file_is_imported_when_its_checksum_holds_and_refused_when_not(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    """A node moving from kubelet's Memory Manager: kubelet's ``memory_manager_state`` (kubelet's format and
    checksum, no numapin field) holds a running container's memory; ``--import-kubelet-memory-state`` takes it over.
    The same file with a checksum that does not hold refuses the start, and both files stay as they were."""
    from allocator.memory import memory_checksum, serialize_memory_checkpoint
    from allocator.memory.state import MemoryState
    from allocator.pod import ContainerInfo, PodInfo
    from criproxy.app import node_parts_of

    kubelet_file = short_tmp / "kubelet_memory_manager_state"
    cfg = proxy_config(short_tmp, runtime, memory_sysfs(two_numa_sysfs),
                       import_kubelet_memory_state=str(kubelet_file))
    async with CRIClient(runtime.socket_path) as direct:  # the container kubelet started while it held the memory
        await run(direct, "k", container("app", 500, 5 * GI))
    policy = node_parts_of(cfg).memory_policy
    assert policy is not None
    state = MemoryState()
    policy.start(state)
    c = ContainerInfo("app", "app", 500, 500, 5 * GI, 5 * GI)
    policy.allocate(state, PodInfo("uid-k", "default", "k", "Guaranteed", None, False, (c,)), "app", None)
    good = serialize_memory_checkpoint(state, numapin=False)
    doc = json.loads(good)
    assert "numapin" not in doc and doc["checksum"] == memory_checksum(doc)
    kubelet_file.write_text(json.dumps({**doc, "checksum": doc["checksum"] ^ 1}))
    from allocator.errors import CheckpointError
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        await CriProxy(cfg).start()
    assert not cfg.memory_state_file.exists() and json.loads(kubelet_file.read_text())["checksum"] != doc["checksum"]
    kubelet_file.write_bytes(good)
    async with inproc.running_proxy(cfg) as p:
        assert p.allocator.container_mems("uid-k", "app") == CPUSet.parse("0-1")
        assert memory_file(p)["entries"]["uid-k"]["app"] == doc["entries"]["uid-k"]["app"]
        assert json.loads(cfg.memory_state_file.read_text())["numapin"]["schemaVersion"] >= 1
    assert kubelet_file.read_bytes() == good  # kubelet's file is read, never written


async def test_a_live_mode_change_moves_the_memory_with_the_cpus(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    """Crane's modes on a running Burstable pod (accounted by its memory limit while pinned) and a Guaranteed one
    (accounted whatever its mode, as kubelet)."""
    from allocator.intent import INTENT_ANNOTATION, encode_intent
    from allocator.pod import CPU_MANAGER_ANNOTATION, ContainerInfo, PodInfo
    from nodeagent.decisions.mode_request import ModeRequest

    async def run_in(name: str, qos: str, cfg: pb.ContainerConfig, intent: PodInfo | None = None) -> str:
        annotations = {CPU_MANAGER_ANNOTATION: "none"}
        if intent is not None:
            annotations[INTENT_ANNOTATION] = encode_intent(intent)
        sb = kubelet.sandbox_config(name, f"uid-{name}", qos=qos, annotations=annotations)
        sid = await kubelet.run_pod_sandbox(sb)
        cid = await kubelet.create_container(sid, cfg, sb)
        await kubelet.start_container(cid)
        return cid

    cache_cfg = CRIClient.container_config("app", cpu_milli=2000, limit_milli=2000)
    cache_cfg.linux.resources.memory_limit_in_bytes = 3 * GI
    # Burstable (no memory request): CRI cannot tell, the webhook's intent on the sandbox does
    burstable = PodInfo("uid-cache", "default", "cache", "Burstable", "none", False,
                        (ContainerInfo("app", "app", 2000, 2000, None, 3 * GI),))
    cache = await run_in("cache", "burstable", cache_cfg, burstable)
    db = await run_in("db", "guaranteed", container("app", 1000, 2 * GI))  # no intent: classed from CRI

    def placed(cid: str) -> tuple[str, str]:
        return resources(runtime, cid).cpuset_cpus, resources(runtime, cid).cpuset_mems

    def entries() -> dict:
        return memory_file(proxy).get("entries", {})

    # mode none: the shared pool; the Burstable pod's memory is not accounted, the Guaranteed pod's is (kubelet's)
    assert placed(cache) == ("0-7", "0-1") and "uid-cache" not in entries()
    db_nodes = entries()["uid-db"]["app"][0]["numaAffinity"]
    assert placed(db) == ("0-7", str(CPUSet(db_nodes)))
    answer = await proxy.modes.request(ModeRequest("default", "cache", "exclusive", "local"))
    assert answer.outcome == "changed", answer
    cpus, mems = placed(cache)
    [block] = entries()["uid-cache"]["app"]  # its memory limit placed in the merge with its CPUs
    assert (block["type"], block["size"]) == ("memory", 3 * GI)
    assert mems == str(CPUSet(block["numaAffinity"])) == str(proxy.allocator.topology.numa_of(CPUSet.parse(cpus)))
    assert len(CPUSet.parse(cpus)) == 2
    pair = state_pair(proxy)
    answer = await proxy.modes.request(ModeRequest("default", "cache", "share", "local"))
    assert answer.outcome == "changed", answer
    assert entries()["uid-cache"]["app"] == [block] and placed(cache)[1] == mems  # pinned still: its blocks kept
    assert state_pair(proxy)[1] == pair[1]
    answer = await proxy.modes.request(ModeRequest("default", "cache", "none", "local"))
    assert answer.outcome == "changed", answer
    assert "uid-cache" not in entries() and placed(cache) == ("0-7", "0-1")  # given back; the pool's nodes again
    # the Guaranteed pod: exclusive CPUs, then the shared pool again; its memory stays where it is throughout
    for mode in ("exclusive", "none"):
        answer = await proxy.modes.request(ModeRequest("default", "db", mode, "local"))
        assert answer.outcome == "changed", answer
        assert entries()["uid-db"]["app"][0]["numaAffinity"] == db_nodes
        assert placed(db)[1] == str(CPUSet(db_nodes))
    assert placed(db)[0] == "0-7"
