"""Pinning decisions through the proxy (in process) against the in-process CRI runtime."""

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
from allocator.intent import INTENT_ANNOTATION, encode_intent
from allocator.pod import ContainerInfo, PodInfo
from criproxy.app import CriProxy
from criproxy.intercept.interceptors import ProxyInterceptors
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy.inproc_proxy import proxy_config, running_proxy


@pytest.fixture
async def proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path, request) -> AsyncIterator[CriProxy]:
    over = getattr(request, "param", {})
    async with running_proxy(proxy_config(short_tmp, runtime, two_numa_sysfs, **over)) as p:
        yield p


def state_file(proxy: CriProxy) -> dict:
    return json.loads(proxy.config.state_file.read_text())


async def run_pod(k: CRIClient, name: str, cpu: int | None, limit: int | None = None, *, qos: str = "guaranteed",
                  annotations: dict[str, str] | None = None, containers: tuple[str, ...] = ("app",),
                  uid: str | None = None) -> tuple[str, dict[str, str], pb.PodSandboxConfig]:
    cfg = k.sandbox_config(name, uid or f"uid-{name}", qos=qos, annotations=annotations)
    sid = await k.run_pod_sandbox(cfg)
    ids = {}
    for c in containers:
        cid = await k.create_container(sid, k.container_config(c, cpu_milli=cpu, limit_milli=limit), cfg)
        await k.start_container(cid)
        ids[c] = cid
    return sid, ids, cfg


def created_resources(runtime: MemoryRuntime, cid: str) -> pb.LinuxContainerResources:
    return runtime.containers[cid].resources


async def test_guaranteed_container_gets_exclusive_cpus_and_shared_ones_are_narrowed_first(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, shared, _ = await run_pod(kubelet, "web", 500, qos="burstable")
    assert created_resources(runtime, shared["app"]).cpuset_cpus == "0-7"
    assert created_resources(runtime, shared["app"]).cpuset_mems == "0-1"
    _, pinned, _ = await run_pod(kubelet, "db", 2000, 2000)
    res = created_resources(runtime, pinned["app"])
    assert CPUSet.parse(res.cpuset_cpus) == CPUSet.parse("1-2")
    assert res.cpuset_mems == "0"
    assert res.cpu_quota == -1  # CFS quota lifted for a pinned container
    assert created_resources(runtime, shared["app"]).cpuset_cpus == "0,3-7"
    # zero isolation window: the shared container was narrowed before the exclusive one was created
    order = [(c.method, c.request) for c in runtime.calls if c.method in ("UpdateContainerResources",
                                                                         "CreateContainer")]
    narrow = next(i for i, (m, r) in enumerate(order) if m == "UpdateContainerResources"
                  and pb.UpdateContainerResourcesRequest.FromString(r).container_id == shared["app"])
    create = next(i for i, (m, r) in enumerate(order) if m == "CreateContainer"
                  and pb.CreateContainerRequest.FromString(r).sandbox_config.metadata.name == "db")
    assert narrow < create
    st = state_file(proxy)
    assert st["policyName"] == "numapin"
    assert st["entries"] == {"uid-db": {"app": "1-2"}}


async def test_only_fields_numapin_owns_change_on_the_wire(proxy: CriProxy, kubelet: CRIClient,
                                                           runtime: MemoryRuntime) -> None:
    cfg = kubelet.sandbox_config("db", "uid-db")
    sid = await kubelet.run_pod_sandbox(cfg)
    cc = kubelet.container_config("app", cpu_milli=1000, limit_milli=1000)
    cc.envs.add(key="A", value="B")
    cc.mounts.add(container_path="/data", host_path="/tmp")
    cc.linux.resources.unified["memory.high"] = "max"
    cc.linux.resources.hugepage_limits.add(page_size="2MB", limit=0)
    req = pb.CreateContainerRequest(pod_sandbox_id=sid, config=cc, sandbox_config=cfg)
    # the exact bytes sent (map entries in a fixed order: two serializations of a message with maps may order them
    # differently), so the runtime's bytes can be compared with them
    sent = req.SerializeToString(deterministic=True)
    stub = kubelet.channel.unary_unary(kubelet.path("CreateContainer", "RuntimeService"),
                                       request_serializer=lambda raw: raw,
                                       response_deserializer=pb.CreateContainerResponse.FromString)
    await stub(sent, timeout=30)
    [received] = runtime.requests("CreateContainer")
    expected = pb.CreateContainerRequest.FromString(sent)
    expected.config.linux.resources.cpuset_cpus = "1"
    expected.config.linux.resources.cpuset_mems = "0"
    expected.config.linux.resources.cpu_quota = -1
    assert received == expected.SerializeToString(deterministic=True)


async def test_state_is_written_before_the_create_is_forwarded(proxy: CriProxy, kubelet: CRIClient,
                                                               runtime: MemoryRuntime) -> None:
    seen: list[dict] = []
    runtime.hooks["CreateContainer"] = lambda raw: seen.append(state_file(proxy)["entries"])
    await run_pod(kubelet, "db", 1000, 1000)
    assert seen == [{"uid-db": {"app": "1"}}]


@pytest.mark.parametrize("proxy", [{"topology_manager_policy": "single-numa-node"}], indirect=True)
async def test_rejection_names_pod_container_and_policy_and_forwards_nothing(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    before = proxy.config.state_file.read_bytes()
    cfg = kubelet.sandbox_config("big", "uid-big")
    sid = await kubelet.run_pod_sandbox(cfg)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.create_container(sid, kubelet.container_config("app", cpu_milli=5000, limit_milli=5000), cfg)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    msg = err.value.details()
    for word in ("default/big", "app", "single-numa-node", "TopologyAffinityError"):
        assert word in msg
    assert runtime.requests("CreateContainer") == []
    assert proxy.config.state_file.read_bytes() == before
    assert proxy.allocator.state.assignments == {}


async def test_no_free_cpus_is_resource_exhausted(proxy: CriProxy, kubelet: CRIClient,
                                                  runtime: MemoryRuntime) -> None:
    await run_pod(kubelet, "a", 7000, 7000)
    cfg = kubelet.sandbox_config("b", "uid-b")
    sid = await kubelet.run_pod_sandbox(cfg)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.create_container(sid, kubelet.container_config("app", cpu_milli=1000, limit_milli=1000), cfg)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "default/b" in err.value.details()


async def test_runtime_failure_releases_the_allocation(proxy: CriProxy, kubelet: CRIClient,
                                                       runtime: MemoryRuntime) -> None:
    _, shared, _ = await run_pod(kubelet, "web", 100, qos="besteffort")
    runtime.fail_next["CreateContainer"] = (grpc.StatusCode.UNKNOWN, "runc create failed")
    cfg = kubelet.sandbox_config("db", "uid-db")
    sid = await kubelet.run_pod_sandbox(cfg)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.create_container(sid, kubelet.container_config("app", cpu_milli=2000, limit_milli=2000), cfg)
    assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNKNOWN, "runc create failed")
    assert state_file(proxy).get("entries", {}) == {}
    assert created_resources(runtime, shared["app"]).cpuset_cpus == "0-7"  # widened again
    cid = await kubelet.create_container(sid, kubelet.container_config("app", cpu_milli=2000, limit_milli=2000), cfg)
    assert created_resources(runtime, cid).cpuset_cpus == "1-2"


def resized(cpu_milli: int, **extra: object) -> pb.LinuxContainerResources:
    """What kubelet (cpuManagerPolicy none) sends for a Guaranteed container resized to ``cpu_milli``."""
    return pb.LinuxContainerResources(cpu_period=100000, cpu_quota=cpu_milli * 100,
                                      cpu_shares=cpu_milli * 1024 // 1000, **extra)


async def test_kubelet_update_of_the_same_size_keeps_the_pin(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    """kubelet's memory pass (CPU at its current values) or a retry: the cpuset kubelet never sets stays numapin's, the
    quota stays lifted, the rest of kubelet's values go through."""
    _, ids, _ = await run_pod(kubelet, "db", 1000, 1000)
    await kubelet.update_container_resources(ids["app"], resized(1000, cpuset_cpus="0-7",
                                                                 memory_limit_in_bytes=1 << 28))
    res = created_resources(runtime, ids["app"])
    assert (res.cpuset_cpus, res.cpuset_mems, res.cpu_shares, res.cpu_quota) == ("1", "0", 1024, -1)
    assert res.memory_limit_in_bytes == 1 << 28


@pytest.mark.parametrize("proxy", [{"relay": "frames"}, {"relay": "grpc"}], indirect=True)
async def test_kubelet_resize_grows_and_shrinks_a_pinned_container_in_place(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, web, _ = await run_pod(kubelet, "web", 500, qos="burstable")
    _, ids, _ = await run_pod(kubelet, "db", 1000, 1000)
    db = ids["app"]
    assert created_resources(runtime, db).cpuset_cpus == "1"
    # 1 -> 3: keeps CPU 1, grows on its NUMA node; the shared container narrowed off the new CPUs
    await kubelet.update_container_resources(db, resized(3000))
    res = created_resources(runtime, db)
    assert (res.cpuset_cpus, res.cpuset_mems, res.cpu_shares, res.cpu_quota) == ("1-3", "0", 3072, -1)
    assert created_resources(runtime, web["app"]).cpuset_cpus == "0,4-7"
    assert list(state_file(proxy)["entries"].values()) == [{"app": "1-3"}]
    # what kubelet reads back: the limit it set (the runtime applied no quota)
    linux = (await kubelet.container_status(db)).status.resources.linux
    assert (linux.cpu_quota, linux.cpu_period, linux.cpu_shares) == (300000, 100000, 3072)
    # so that ContainerStatus is held (the frame relay's pass-through): the pinned container's, not the shared one's
    unchanged = ProxyInterceptors(proxy.pinning, proxy.resizer, proxy.starts, proxy.api).pass_through()
    assert not unchanged["ContainerStatus"](pb.ContainerStatusRequest(container_id=db).SerializeToString())
    assert unchanged["ContainerStatus"](pb.ContainerStatusRequest(container_id=web["app"]).SerializeToString())
    # 3 -> 2: gives back a CPU the growth added, the pool widens after
    await kubelet.update_container_resources(db, resized(2000))
    assert created_resources(runtime, db).cpuset_cpus == "1-2"
    assert created_resources(runtime, web["app"]).cpuset_cpus == "0,3-7"
    # 2 -> 6: CPUs 1-3 are NUMA node 0's free ones: the growth spills to node 1 (topology manager none)
    await kubelet.update_container_resources(db, resized(6000))
    assert created_resources(runtime, db).cpuset_cpus == "1-6"
    assert created_resources(runtime, web["app"]).cpuset_cpus == "0,7"
    # 6 -> 8: refused (7 allocatable CPUs), nothing changes; the call fails with kubelet's reason
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.update_container_resources(db, resized(8000))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "UnexpectedAdmissionError" in (err.value.details() or "")
    assert created_resources(runtime, db).cpuset_cpus == "1-6"
    assert created_resources(runtime, db).cpu_shares == 6144  # the refused call was never forwarded
    # a Guaranteed container's shares must agree with its limit (its QoS class cannot change)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.update_container_resources(db, pb.LinuxContainerResources(
            cpu_period=100000, cpu_quota=200000, cpu_shares=1024))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "disagrees with the CPU limit 2000m" in (err.value.details() or "")
    assert created_resources(runtime, db).cpuset_cpus == "1-6"


async def test_kubelet_resize_between_the_shared_pool_and_cpus_of_its_own(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    """Fractional <-> integer, with and without the webhook's intent (which states the size at creation)."""
    _, web, _ = await run_pod(kubelet, "web", 500, qos="burstable")
    intent = encode_intent(PodInfo(uid="uid-i", namespace="default", name="i", qos_class="Guaranteed",
                                   cpu_manager=None, bypass=False,
                                   containers=(ContainerInfo("app", "app", 1500, 1500),)))
    _, plain, _ = await run_pod(kubelet, "p", 1500, 1500)
    _, annotated, _ = await run_pod(kubelet, "i", 1500, 1500, annotations={INTENT_ANNOTATION: intent}, uid="uid-i")
    for cid in (plain["app"], annotated["app"]):
        assert created_resources(runtime, cid).cpuset_cpus == "0-7"
    await kubelet.update_container_resources(plain["app"], resized(2000))
    res = created_resources(runtime, plain["app"])
    assert (res.cpuset_cpus, res.cpu_quota) == ("1-2", -1)
    await kubelet.update_container_resources(annotated["app"], resized(1000))
    assert created_resources(runtime, annotated["app"]).cpuset_cpus == "3"
    assert created_resources(runtime, web["app"]).cpuset_cpus == "0,4-7"
    # back to fractional: the shared pool again, kubelet's quota kept, the pool widened
    await kubelet.update_container_resources(plain["app"], resized(1500))
    res = created_resources(runtime, plain["app"])
    assert (res.cpuset_cpus, res.cpu_quota) == ("0-2,4-7", 150000)
    assert created_resources(runtime, web["app"]).cpuset_cpus == "0-2,4-7"
    status = proxy.resizer.recent()
    assert [(r["pod"], r["result"], r["from"], r["to"]) for r in status] == [
        ("default/p", "resized", "shared pool", "2 CPU(s) exclusive"),
        ("default/i", "resized", "shared pool", "1 CPU(s) exclusive"),
        ("default/p", "resized", "2 CPU(s) exclusive", "shared pool")]


@pytest.mark.parametrize("proxy", [{"topology_manager_policy": "single-numa-node"}], indirect=True)
async def test_a_resize_single_numa_node_cannot_keep_in_one_node_is_refused(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, ids, _ = await run_pod(kubelet, "db", 2000, 2000)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.update_container_resources(ids["app"], resized(5000))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.value.details() or ""
    assert "TopologyAffinityError" in details and "single-numa-node" in details and "from 2 to 5" in details
    assert created_resources(runtime, ids["app"]).cpuset_cpus == "1-2"
    await kubelet.update_container_resources(ids["app"], resized(3000))
    assert created_resources(runtime, ids["app"]).cpuset_cpus == "1-3"


async def test_recreated_container_gets_its_cpus_back_and_removal_releases(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    sid, ids, cfg = await run_pod(kubelet, "db", 2000, 2000)
    await run_pod(kubelet, "other", 1000, 1000)
    first = created_resources(runtime, ids["app"]).cpuset_cpus
    await kubelet.stop_container(ids["app"])
    again = await kubelet.create_container(sid, kubelet.container_config("app", cpu_milli=2000, limit_milli=2000,
                                                                         attempt=1), cfg)
    assert created_resources(runtime, again).cpuset_cpus == first
    await kubelet.remove_container(ids["app"])  # the dead instance: the new one keeps the CPUs
    assert state_file(proxy)["entries"]["uid-db"] == {"app": first}
    await kubelet.stop_container(again)
    await kubelet.remove_container(again)
    assert "uid-db" not in state_file(proxy)["entries"]


async def test_stopped_sandbox_releases_the_pod_and_widens_the_pool(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, shared, _ = await run_pod(kubelet, "web", 200, qos="burstable")
    sid, _, _ = await run_pod(kubelet, "db", 3000, 3000, containers=("a", "b"))
    assert CPUSet.parse(created_resources(runtime, shared["app"]).cpuset_cpus) == CPUSet.parse("0,7")
    await kubelet.stop_pod_sandbox(sid)
    assert state_file(proxy).get("entries", {}) == {}
    assert created_resources(runtime, shared["app"]).cpuset_cpus == "0-7"
    await kubelet.remove_pod_sandbox(sid)
    assert proxy.registry.sandboxes.get(sid) is None


async def test_share_mode_pins_but_keeps_cpus_in_the_shared_pool(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, shared, _ = await run_pod(kubelet, "web", 200, qos="burstable")
    _, ids, _ = await run_pod(kubelet, "cache", 2000, 2000, qos="burstable",
                              annotations={"qos.gocrane.io/cpu-manager": "share"})
    assert created_resources(runtime, ids["app"]).cpuset_cpus == "1-2"
    assert created_resources(runtime, shared["app"]).cpuset_cpus == "0-7"
    assert state_file(proxy)["entries"] == {"uid-cache": {"app": "1-2"}}
    _, excl, _ = await run_pod(kubelet, "db", 1000, 1000)
    assert created_resources(runtime, excl["app"]).cpuset_cpus == "3"
    assert created_resources(runtime, shared["app"]).cpuset_cpus == "0-2,4-7"


async def test_bypass_pods_and_the_proxy_itself_pass_untouched(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    # a bypass in a namespace the operator lists, and lets run on every CPU, is left alone (tests/criproxy/
    # test_bypass.py: everywhere else)
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs, self_pod_namespace="kube-system",
                       self_pod_name="numapin-abc", bypass_namespaces="default",
                       bypass_all_cpus_namespaces="default")
    p = await CriProxy(cfg).start()
    try:
        async with CRIClient(cfg.listen) as k:
            await run_pod(k, "db", 1000, 1000)
            for name, ann in (("tool", {"numapin.io/bypass": "true"}), ("numapin-abc", {})):
                sb = k.sandbox_config(name, f"uid-{name}", namespace="kube-system" if not ann else "default",
                                      annotations=ann)
                sid = await k.run_pod_sandbox(sb)
                req = pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=sb, config=k.container_config(
                    "c", cpu_milli=1000, limit_milli=1000))
                await k.call("CreateContainer", req, pb.CreateContainerResponse)
                assert runtime.requests("CreateContainer")[-1] == req.SerializeToString()
            _, late, _ = await run_pod(k, "db2", 1000, 1000)
            # bypassed containers were never narrowed
            assert all(pb.UpdateContainerResourcesRequest.FromString(r).container_id in late.values() or True
                       for r in runtime.requests("UpdateContainerResources"))
            assert len(runtime.requests("UpdateContainerResources")) == 0
            assert p.allocator.state.assignments.keys() == {"uid-db", "uid-db2"}
    finally:
        await p.stop()


async def test_intent_annotation_is_the_source_of_truth(proxy: CriProxy, kubelet: CRIClient,
                                                        runtime: MemoryRuntime) -> None:
    pod = PodInfo(uid="uid-i", namespace="default", name="i", qos_class="Guaranteed", cpu_manager=None,
                  bypass=False, containers=(ContainerInfo("init", "init", 1000, 1000, 1 << 20, 1 << 20),
                                            ContainerInfo("app", "app", 2000, 2000, 1 << 20, 1 << 20)))
    cfg = kubelet.sandbox_config("i", "uid-i", qos="burstable",  # CRI says burstable: the annotation wins
                                 annotations={INTENT_ANNOTATION: encode_intent(pod)})
    sid = await kubelet.run_pod_sandbox(cfg)
    init = await kubelet.create_container(sid, kubelet.container_config("init"), cfg)
    assert created_resources(runtime, init).cpuset_cpus == "1"
    app = await kubelet.create_container(sid, kubelet.container_config("app"), cfg)
    assert CPUSet.parse(created_resources(runtime, app).cpuset_cpus) == CPUSet.parse("1-2")  # init's CPU reused
    cfg.annotations[INTENT_ANNOTATION] = "{broken"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.create_container(sid, kubelet.container_config("app"), cfg)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert INTENT_ANNOTATION in err.value.details()


async def test_concurrent_creates_never_assign_a_cpu_twice(proxy: CriProxy, kubelet: CRIClient,
                                                           runtime: MemoryRuntime) -> None:
    async def one(i: int) -> str | None:
        try:
            _, ids, _ = await run_pod(kubelet, f"p{i}", 1000, 1000)
        except grpc.aio.AioRpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return None
        return created_resources(runtime, ids["app"]).cpuset_cpus

    got = await asyncio.gather(*(one(i) for i in range(10)))
    pinned = [CPUSet.parse(c) for c in got if c is not None]
    assert len(pinned) == 7
    assert sorted(c.min() for c in pinned) == [1, 2, 3, 4, 5, 6, 7]


async def test_restart_reconciles_dropped_adopted_and_drifted(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs)
    p = await CriProxy(cfg).start()
    async with CRIClient(cfg.listen) as k:
        _, web, _ = await run_pod(k, "web", 200, qos="burstable")
        _, db, _ = await run_pod(k, "db", 2000, 2000)
        _, gone, _ = await run_pod(k, "gone", 1000, 1000)
    await p.stop()
    # while the proxy is down: a container disappears, a cpuset drifts, a container appears
    del runtime.containers[gone["app"]]
    runtime.containers[web["app"]].resources.cpuset_cpus = "0-7"
    runtime.containers[db["app"]].resources.cpuset_cpus = "5"
    async with CRIClient(runtime.socket_path) as direct:
        sb = direct.sandbox_config("new", "uid-new", qos="besteffort")
        sid = await direct.run_pod_sandbox(sb)
        new = await direct.create_container(sid, direct.container_config("c"), sb)
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        rep = p.last_reconcile
        assert rep is not None and rep.dropped == (("uid-gone", "app"),)
        assert state_file(p)["entries"] == {"uid-db": {"app": "1-2"}}
        assert runtime.containers[db["app"]].resources.cpuset_cpus == "1-2"
        assert runtime.containers[web["app"]].resources.cpuset_cpus == "0,3-7"
        assert runtime.containers[new].resources.cpuset_cpus == "0,3-7"
    finally:
        await p.stop()


async def test_nrt_document_and_metrics(proxy: CriProxy, kubelet: CRIClient) -> None:
    await run_pod(kubelet, "db", 2000, 2000)
    for _ in range(1500):
        doc = json.loads(proxy.config.nrt_path.read_text()) if proxy.config.nrt_path.exists() else {}
        if doc and doc["zones"][0]["resources"][0]["available"] == "1":
            break
        await asyncio.sleep(0.02)
    assert doc["apiVersion"] == "topology.node.k8s.io/v1alpha2" and doc["metadata"]["name"] == "node-a"
    attrs = {a["name"]: a["value"] for a in doc["attributes"]}
    assert (attrs["topologyManagerPolicy"], attrs["topologyManagerScope"]) == ("none", "container")
    z0, z1 = doc["zones"]
    assert (z0["name"], z0["type"]) == ("node-0", "Node")
    assert z0["resources"] == [{"name": "cpu", "capacity": "4", "allocatable": "3", "available": "1"}]
    assert z1["resources"] == [{"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}]
    assert z0["costs"] == [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 20}]
    # the webhook reads it back
    from allocator.nrt import parse_nrt

    node = parse_nrt(doc)
    assert node.total_available == 5
    assert proxy.config.nrt_path.parent.name == "nrt"
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=10).read().decode())
    assert 'numapin_criproxy_allocations_total{mode="exclusive"} 1.0' in text
    assert 'numapin_criproxy_relay_seconds_count{code="OK",method="CreateContainer"} 1.0' in text


async def test_v1alpha2_create_is_pinned_too(proxy: CriProxy, runtime: MemoryRuntime) -> None:
    async with CRIClient(proxy.config.listen, api="runtime.v1alpha2") as old_kubelet:
        _, ids, _ = await run_pod(old_kubelet, "db", 1000, 1000)
    assert created_resources(runtime, ids["app"]).cpuset_cpus == "1"


async def test_events_stream_through_the_full_proxy(proxy: CriProxy, kubelet: CRIClient,
                                                    runtime: MemoryRuntime) -> None:
    stream = kubelet.container_events()
    while not runtime._events:
        await asyncio.sleep(0.01)
    _, ids, _ = await run_pod(kubelet, "db", 1000, 1000)
    ev = await asyncio.wait_for(stream.read(), 10)
    assert (ev.container_id, ev.container_event_type) == (ids["app"], pb.CONTAINER_CREATED_EVENT)
    stream.cancel()


async def test_kubelet_state_is_imported_once(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    from allocator.checkpoint import CheckpointStore
    from allocator.state import CPUState

    kubelet_file = short_tmp / "kubelet_cpu_manager_state"
    CheckpointStore(kubelet_file, "static").save(CPUState(default_cpuset=CPUSet.parse("0-2,5-7"),
                                                          assignments={"uid-old": {"app": CPUSet.parse("3-4")}}))
    async with CRIClient(runtime.socket_path) as direct:  # the pod kubelet pinned is running
        sb = direct.sandbox_config("old", "uid-old")
        sid = await direct.run_pod_sandbox(sb)
        cid = await direct.create_container(sid, direct.container_config("app", cpuset_cpus="3-4"), sb)
        await direct.start_container(cid)
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs, import_kubelet_state=str(kubelet_file))
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        assert state_file(p)["entries"] == {"uid-old": {"app": "3-4"}}
        assert state_file(p)["policyName"] == "numapin"
        async with CRIClient(cfg.listen) as k:
            _, ids, _ = await run_pod(k, "new", 2000, 2000)
        assert CPUSet.parse(created_resources(runtime, ids["app"]).cpuset_cpus).isdisjoint(CPUSet.parse("3-4"))
    finally:
        await p.stop()


async def test_stopped_shared_containers_are_not_narrowed(proxy: CriProxy, kubelet: CRIClient,
                                                          runtime: MemoryRuntime) -> None:
    _, done, _ = await run_pod(kubelet, "job", 100, qos="besteffort")
    _, live, _ = await run_pod(kubelet, "web", 100, qos="besteffort")
    await kubelet.stop_container(done["app"])
    await run_pod(kubelet, "db", 1000, 1000)
    narrowed = {pb.UpdateContainerResourcesRequest.FromString(r).container_id
                for r in runtime.requests("UpdateContainerResources")}
    assert narrowed == {live["app"]}


async def test_garbage_request_is_invalid_argument(proxy: CriProxy, runtime: MemoryRuntime) -> None:
    async with grpc.aio.insecure_channel("unix:" + proxy.config.listen) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await ch.unary_unary("/runtime.v1.RuntimeService/CreateContainer")(b"\x12\x05ab", timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "CreateContainer" in err.value.details()
    assert runtime.requests("CreateContainer") == []


@pytest.mark.parametrize("proxy", [{"reconcile_period": "0.1"}], indirect=True)
async def test_periodic_reconcile_repairs_drift(proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, ids, _ = await run_pod(kubelet, "db", 2000, 2000)
    _, web, _ = await run_pod(kubelet, "web", 100, qos="besteffort")
    runtime.containers[ids["app"]].resources.cpuset_cpus = "0-7"  # someone else wrote the cpusets
    runtime.containers[web["app"]].resources.cpuset_cpus = "1"
    for _ in range(1500):
        if (runtime.containers[ids["app"]].resources.cpuset_cpus, runtime.containers[web["app"]].resources.cpuset_cpus
                ) == ("1-2", "0,3-7"):
            break
        await asyncio.sleep(0.02)
    assert runtime.containers[ids["app"]].resources.cpuset_cpus == "1-2"
    assert runtime.containers[web["app"]].resources.cpuset_cpus == "0,3-7"


async def test_relay_never_waits_on_the_allocation_lock(proxy: CriProxy, kubelet: CRIClient,
                                                        runtime: MemoryRuntime) -> None:
    _, ids, _ = await run_pod(kubelet, "web", 100, qos="besteffort")
    async with proxy.pinning.lock:  # an allocation in progress (e.g. a slow narrowing)
        assert (await kubelet.version()).runtime_name == "memory"
        assert [c.id for c in await kubelet.list_containers()] == [ids["app"]]
        await kubelet.container_status(ids["app"])
        await kubelet.update_container_resources(ids["app"], pb.LinuxContainerResources(cpu_shares=4))
        await kubelet.stop_container(ids["app"])


@pytest.mark.parametrize("proxy", [{"topology_manager_policy": "single-numa-node"}], indirect=True)
async def test_rejections_are_counted_by_reason(proxy: CriProxy, kubelet: CRIClient) -> None:
    cfg = kubelet.sandbox_config("big", "uid-big")
    sid = await kubelet.run_pod_sandbox(cfg)
    with pytest.raises(grpc.aio.AioRpcError):
        await kubelet.create_container(sid, kubelet.container_config("app", cpu_milli=5000, limit_milli=5000), cfg)
    text = await asyncio.to_thread(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{proxy.metrics_port}/metrics", timeout=10).read().decode())
    assert 'numapin_criproxy_rejections_total{reason="TopologyAffinityError"} 1.0' in text


@pytest.mark.parametrize("proxy", [{"topology_manager_policy": "single-numa-node"}], indirect=True)
async def test_device_numa_node_steers_the_cpus(proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime,
                                                two_numa_sysfs: Path) -> None:
    import os

    st = os.stat("/dev/null")
    dev = two_numa_sysfs / f"dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}/device"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    cfg = kubelet.sandbox_config("gpu", "uid-gpu")
    sid = await kubelet.run_pod_sandbox(cfg)
    cc = kubelet.container_config("app", cpu_milli=2000, limit_milli=2000,
                                  devices=[pb.Device(container_path="/dev/accel0", host_path="/dev/null",
                                                     permissions="rw")])
    cid = await kubelet.create_container(sid, cc, cfg)
    res = created_resources(runtime, cid)
    assert CPUSet.parse(res.cpuset_cpus).issubset(CPUSet.parse("4-7")) and res.cpuset_mems == "1"


async def test_restart_keeps_cpus_admitted_for_containers_not_created_yet(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    pod = PodInfo(uid="uid-i", namespace="default", name="i", qos_class="Guaranteed", cpu_manager=None,
                  bypass=False, containers=(ContainerInfo("init", "init", 1000, 1000, 1 << 20, 1 << 20),
                                            ContainerInfo("app", "app", 3000, 3000, 1 << 20, 1 << 20)))
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs)
    p = await CriProxy(cfg).start()
    async with CRIClient(cfg.listen) as k:
        sb = k.sandbox_config("i", "uid-i", annotations={INTENT_ANNOTATION: encode_intent(pod)})
        sid = await k.run_pod_sandbox(sb)
        await k.create_container(sid, k.container_config("init"), sb)  # the whole pod is admitted here
    admitted = state_file(p)["entries"]["uid-i"]
    await p.stop()
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        assert state_file(p)["entries"]["uid-i"] == admitted  # "app" does not exist yet but keeps its CPUs
        async with CRIClient(cfg.listen) as k:
            app = await k.create_container(sid, k.container_config("app"), sb)
        assert CPUSet.parse(created_resources(runtime, app).cpuset_cpus) == CPUSet.parse(admitted["app"])
    finally:
        await p.stop()


async def test_without_intent_an_exited_earlier_container_passes_its_cpus_on(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    cfg = kubelet.sandbox_config("job", "uid-job")
    sid = await kubelet.run_pod_sandbox(cfg)
    init = await kubelet.create_container(sid, kubelet.container_config("init", cpu_milli=2000, limit_milli=2000), cfg)
    await kubelet.start_container(init)
    runtime.exit(init, 0)  # ran to completion
    app = await kubelet.create_container(sid, kubelet.container_config("app", cpu_milli=2000, limit_milli=2000), cfg)
    assert created_resources(runtime, app).cpuset_cpus == created_resources(runtime, init).cpuset_cpus == "1-2"
    assert proxy.allocator.free_cpus_per_numa() == {0: 1, 1: 4}
    # a second app container while the first still runs gets CPUs of its own
    app2 = await kubelet.create_container(sid, kubelet.container_config("app2", cpu_milli=1000, limit_milli=1000),
                                          cfg)
    assert created_resources(runtime, app2).cpuset_cpus == "3"


async def test_a_removed_container_is_not_allocated_again(proxy: CriProxy, kubelet: CRIClient,
                                                          runtime: MemoryRuntime) -> None:
    cfg = kubelet.sandbox_config("p", "uid-p")
    sid = await kubelet.run_pod_sandbox(cfg)
    ids = {}
    for n in ("c0", "c1"):
        ids[n] = await kubelet.create_container(sid, kubelet.container_config(n, cpu_milli=1000, limit_milli=1000),
                                                cfg)
        await kubelet.start_container(ids[n])
    await kubelet.stop_container(ids["c0"])
    await kubelet.remove_container(ids["c0"])
    await kubelet.create_container(sid, kubelet.container_config("c2", cpu_milli=1000, limit_milli=1000), cfg)
    assert set(state_file(proxy)["entries"]["uid-p"]) == {"c1", "c2"}
