"""Container restarts, failed creates, init-container reuse across proxy restarts and the start-up admission gate,
through the proxy (in process) over real unix sockets against the in-process CRI runtime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from allocator.intent import INTENT_ANNOTATION, encode_intent
from allocator.pod import ContainerInfo, PodInfo
from criproxy.app import CriProxy
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy.test_pinning import created_resources, proxy_config, run_pod, state_file

S = CPUSet.parse


@pytest.fixture
async def proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> AsyncIterator[CriProxy]:
    p = await CriProxy(proxy_config(short_tmp, runtime, two_numa_sysfs)).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    yield p
    await p.stop()


@pytest.fixture
async def kubelet(proxy: CriProxy) -> AsyncIterator[CRIClient]:
    c = CRIClient(proxy.config.listen)
    yield c
    await c.close()


def cpus(runtime: MemoryRuntime, cid: str) -> CPUSet:
    return S(created_resources(runtime, cid).cpuset_cpus)


def live_pinned(runtime: MemoryRuntime, pod_uid: str) -> dict[str, CPUSet]:
    return {c.config.metadata.name: S(c.resources.cpuset_cpus) for c in runtime.containers.values()
            if runtime.sandboxes[c.sandbox_id].metadata.uid == pod_uid and c.state != pb.CONTAINER_EXITED}


async def create(k: CRIClient, sid: str, cfg: pb.PodSandboxConfig, name: str, cpu: int = 1000, *,
                 attempt: int = 0, kind: str | None = None, start: bool = True) -> str:
    cc = k.container_config(name, cpu_milli=cpu, limit_milli=cpu, attempt=attempt)
    if kind is not None:
        cc.annotations["io.kubernetes.container.type"] = kind
    cid = await k.create_container(sid, cc, cfg)
    if start:
        await k.start_container(cid)
    return cid


@pytest.mark.parametrize("code", [1, 137])
async def test_crashed_app_container_keeps_its_cpus_while_a_sibling_is_first_created(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime, code: int) -> None:
    cfg = kubelet.sandbox_config("p", "uid-p")
    sid = await kubelet.run_pod_sandbox(cfg)
    app1 = await create(kubelet, sid, cfg, "app1")
    mine = cpus(runtime, app1)
    runtime.exit(app1, code)  # crashed; kubelet creates app2 (its image pull was slow) while app1 is down
    app2 = await create(kubelet, sid, cfg, "app2")
    assert cpus(runtime, app2).isdisjoint(mine)
    again = await create(kubelet, sid, cfg, "app1", attempt=1)  # re-created: its own CPUs back
    assert cpus(runtime, again) == mine
    live = live_pinned(runtime, "uid-p")
    assert live["app1"].isdisjoint(live["app2"])


async def test_app_container_that_exited_0_before_its_sibling_gets_cpus_of_its_own_when_recreated(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    """CRI alone cannot tell this app container from an init container (older kubelets): its sibling reuses its
    CPUs; when kubelet re-creates it, numapin gives it new CPUs instead of sharing them."""
    cfg = kubelet.sandbox_config("p", "uid-p")
    sid = await kubelet.run_pod_sandbox(cfg)
    app1 = await create(kubelet, sid, cfg, "app1")
    runtime.exit(app1, 0)
    app2 = await create(kubelet, sid, cfg, "app2")
    assert cpus(runtime, app2) == cpus(runtime, app1)
    again = await create(kubelet, sid, cfg, "app1", attempt=1)
    live = live_pinned(runtime, "uid-p")
    assert live["app1"].isdisjoint(live["app2"]) and len(live["app1"]) == 1
    assert S(state_file(proxy)["entries"]["uid-p"]["app1"]) == cpus(runtime, again)


async def test_kubelets_container_type_annotation_says_app_even_after_exit_0(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    cfg = kubelet.sandbox_config("p", "uid-p")
    sid = await kubelet.run_pod_sandbox(cfg)
    app1 = await create(kubelet, sid, cfg, "app1", kind="container")
    runtime.exit(app1, 0)
    app2 = await create(kubelet, sid, cfg, "app2", kind="container")
    assert cpus(runtime, app2).isdisjoint(cpus(runtime, app1))


async def test_a_create_the_runtime_refused_leaves_the_pod_model(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    cfg = kubelet.sandbox_config("p", "uid-p")
    sid = await kubelet.run_pod_sandbox(cfg)
    await create(kubelet, sid, cfg, "c0")
    runtime.fail_next["CreateContainer"] = (grpc.StatusCode.UNKNOWN, "image not found")
    with pytest.raises(grpc.aio.AioRpcError):
        await create(kubelet, sid, cfg, "c1", cpu=2000)
    assert set(state_file(proxy)["entries"]["uid-p"]) == {"c0"}
    await create(kubelet, sid, cfg, "c2")
    # c1 never existed: no CPUs are pinned for it behind kubelet's back
    assert set(state_file(proxy)["entries"]["uid-p"]) == {"c0", "c2"}
    assert proxy.allocator.free_cpus_per_numa() == {0: 1, 1: 4}


async def test_intent_pod_admitted_through_a_shared_init_container_narrows_the_pool_first(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, web, _ = await run_pod(kubelet, "web", 200, qos="burstable")
    pod = PodInfo(uid="uid-i", namespace="default", name="i", qos_class="Guaranteed", cpu_manager=None,
                  bypass=False, containers=(ContainerInfo("init", "init", 500, 500, 1 << 20, 1 << 20),
                                            ContainerInfo("app", "app", 2000, 2000, 1 << 20, 1 << 20)))
    cfg = kubelet.sandbox_config("i", "uid-i", annotations={INTENT_ANNOTATION: encode_intent(pod)})
    sid = await kubelet.run_pod_sandbox(cfg)
    init = await kubelet.create_container(sid, kubelet.container_config("init"), cfg)
    held = S(state_file(proxy)["entries"]["uid-i"]["app"])  # admitted with the pod
    assert cpus(runtime, web["app"]).isdisjoint(held)       # the running shared container was narrowed
    assert cpus(runtime, init).isdisjoint(held)             # and the init container starts on the pool
    order = [c.method for c in runtime.calls if c.method in ("UpdateContainerResources", "CreateContainer")]
    assert order[-2:] == ["UpdateContainerResources", "CreateContainer"]


async def test_after_a_restart_an_app_container_reuses_its_exited_init_containers_cpus(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs)
    p = await CriProxy(cfg).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    async with CRIClient(cfg.listen) as k:
        await run_pod(k, "other", 3000, 3000)  # 4 CPUs left
        sb = k.sandbox_config("job", "uid-job")
        sid = await k.run_pod_sandbox(sb)
        init = await create(k, sid, sb, "init", 4000)
        runtime.exit(init, 0)
    await p.stop()
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        async with CRIClient(cfg.listen) as k:
            app = await create(k, sid, sb, "app", 4000)  # no CPU is free: only the init's CPUs fit
        assert cpus(runtime, app) == cpus(runtime, init)
    finally:
        await p.stop()


async def test_after_a_restart_a_crashed_app_container_is_not_taken_for_an_init_container(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs)
    p = await CriProxy(cfg).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    async with CRIClient(cfg.listen) as k:
        sb = k.sandbox_config("p", "uid-p")
        sid = await k.run_pod_sandbox(sb)
        app1 = await create(k, sid, sb, "app1")
        await create(k, sid, sb, "app2")
    await p.stop()
    runtime.exit(app1, 0)  # exits while the proxy is down
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        async with CRIClient(cfg.listen) as k:
            app3 = await create(k, sid, sb, "app3")
            again = await create(k, sid, sb, "app1", attempt=1)
        assert cpus(runtime, app3).isdisjoint(cpus(runtime, app1))
        assert cpus(runtime, again) == cpus(runtime, app1)
    finally:
        await p.stop()


async def test_admissions_wait_for_the_start_up_reconcile_and_other_calls_do_not(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    def broken(raw: bytes) -> None:
        raise RuntimeError("runtime not ready")

    runtime.hooks["ListPodSandbox"] = broken  # the start-up reconcile keeps failing
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs)
    p = await CriProxy(cfg).start()
    try:
        async with CRIClient(cfg.listen) as k:
            assert (await k.version()).runtime_name == "memory"  # relayed at once
            sb = k.sandbox_config("db", "uid-db")
            sid = await k.run_pod_sandbox(sb)
            cc = k.container_config("app", cpu_milli=1000, limit_milli=1000)
            req = pb.CreateContainerRequest(pod_sandbox_id=sid, config=cc, sandbox_config=sb)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await k.call("CreateContainer", req, pb.CreateContainerResponse, timeout=1.5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "start-up reconcile" in err.value.details() and "default/db" in err.value.details()
            assert runtime.requests("CreateContainer") == []
            assert not p.reconciled.is_set()
            # a create waiting when the reconcile completes is admitted
            waiting = asyncio.ensure_future(k.call("CreateContainer", req, pb.CreateContainerResponse, timeout=30))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            del runtime.hooks["ListPodSandbox"]
            cid = (await waiting).container_id
            assert cpus(runtime, cid) == S("1")
    finally:
        await p.stop()


async def test_start_up_cleans_interrupted_state_writes_and_reconcile_leaves_the_proxys_own_pod_alone(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    """The proxy known by its pod uid only (POD_UID): reconcile passes its containers through too."""
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs, self_pod_uid="uid-self")
    cfg.state_file.parent.mkdir(parents=True)
    leftover = cfg.state_file.parent / f".{cfg.state_file.name}.0123456789ab.tmp"
    leftover.write_text('{"policyName":"num')
    async with CRIClient(runtime.socket_path) as direct:  # the proxy's own pod, running before it starts
        sb = direct.sandbox_config("numapin-x", "uid-self", namespace="kube-system", qos="besteffort")
        own = await create(direct, await direct.run_pod_sandbox(sb), sb, "proxy", 0)
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        assert not leftover.exists()
        async with CRIClient(cfg.listen) as k:
            await run_pod(k, "db", 2000, 2000)
        assert created_resources(runtime, own).cpuset_cpus == ""  # never narrowed nor pinned
        assert runtime.requests("UpdateContainerResources") == []
    finally:
        await p.stop()


def sandbox_named(name: str) -> Callable[[bytes], bool]:
    return lambda raw: pb.CreateContainerRequest.FromString(raw).sandbox_config.metadata.name == name


async def test_creates_of_other_pods_go_on_while_one_is_at_the_runtime(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    slow = asyncio.Event()
    runtime.holds.append(("CreateContainer", sandbox_named("slow"), slow))
    held = asyncio.ensure_future(run_pod(kubelet, "slow", 1000, 1000))
    while not runtime.requests("CreateContainer"):
        await asyncio.sleep(0.01)
    # the slow pod's create is at the runtime: others are decided and created meanwhile
    _, ids, _ = await run_pod(kubelet, "quick", 2000, 2000)
    _, web, _ = await run_pod(kubelet, "web", 100, qos="besteffort")
    assert cpus(runtime, ids["app"]) == S("2-3")
    assert cpus(runtime, web["app"]) == S("0,4-7")
    assert not held.done()
    slow.set()
    _, slow_ids, _ = await held
    assert cpus(runtime, slow_ids["app"]) == S("1")


async def test_an_exclusive_create_waits_until_shared_creates_under_way_are_narrowed(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    """Zero isolation window with creates concurrent: the shared container was decided with the whole pool and
    is at the runtime when the exclusive one is admitted; the exclusive create reaches the runtime only once the
    shared one exists and is narrowed."""
    slow = asyncio.Event()
    runtime.holds.append(("CreateContainer", sandbox_named("web"), slow))
    web = asyncio.ensure_future(run_pod(kubelet, "web", 100, qos="besteffort"))
    while not runtime.requests("CreateContainer"):
        await asyncio.sleep(0.01)
    db = asyncio.ensure_future(run_pod(kubelet, "db", 2000, 2000))
    await asyncio.sleep(0.3)
    assert not db.done() and len(runtime.requests("CreateContainer")) == 1  # db waits for web
    assert S(state_file(proxy)["entries"]["uid-db"]["app"]) == S("1-2")  # decided and on disk already
    slow.set()
    (_, web_ids, _), (_, db_ids, _) = await asyncio.gather(web, db)
    assert cpus(runtime, web_ids["app"]) == S("0,3-7")
    assert cpus(runtime, db_ids["app"]) == S("1-2")
    order = [(c.method, c.request) for c in runtime.calls if c.method in ("UpdateContainerResources",
                                                                         "CreateContainer")]
    kinds = [(m, pb.UpdateContainerResourcesRequest.FromString(r).container_id if m == "UpdateContainerResources"
              else pb.CreateContainerRequest.FromString(r).sandbox_config.metadata.name) for m, r in order]
    assert kinds == [("CreateContainer", "web"), ("UpdateContainerResources", web_ids["app"]),
                     ("CreateContainer", "db")]


async def test_a_failed_exclusive_create_gives_its_cpus_back_while_others_go_on(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    _, web, _ = await run_pod(kubelet, "web", 100, qos="besteffort")
    runtime.fail_next["CreateContainer"] = (grpc.StatusCode.UNKNOWN, "runc create failed")
    with pytest.raises(grpc.aio.AioRpcError):
        await run_pod(kubelet, "db", 7000, 7000)
    assert state_file(proxy).get("entries", {}) == {}
    assert cpus(runtime, web["app"]) == S("0-7")  # widened again
    _, ids, _ = await run_pod(kubelet, "all", 7000, 7000)  # nothing leaked: a pod asking every CPU fits
    assert cpus(runtime, ids["app"]) == S("1-7")


async def test_a_create_whose_caller_gave_up_gives_its_cpus_back(
        proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    slow = asyncio.Event()
    runtime.holds.append(("CreateContainer", sandbox_named("db"), slow))
    cfg = kubelet.sandbox_config("db", "uid-db")
    sid = await kubelet.run_pod_sandbox(cfg)
    req = pb.CreateContainerRequest(pod_sandbox_id=sid, sandbox_config=cfg,
                                    config=kubelet.container_config("app", cpu_milli=7000, limit_milli=7000))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.call("CreateContainer", req, pb.CreateContainerResponse, timeout=1.0)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(200):
        if "uid-db" not in state_file(proxy).get("entries", {}):
            break
        await asyncio.sleep(0.02)
    assert state_file(proxy).get("entries", {}) == {}
    slow.set()
    _, ids, _ = await run_pod(kubelet, "all", 7000, 7000)  # nothing leaked
    assert cpus(runtime, ids["app"]) == S("1-7")


@pytest.mark.parametrize("seed", range(1, 5))
async def test_seeded_concurrent_pods_with_crashes_and_failures_leak_nothing(
        seed: int, proxy: CriProxy, kubelet: CRIClient, runtime: MemoryRuntime) -> None:
    """Pods of every kind created at once (crashing app containers re-created, creates the runtime refuses):
    exclusive CPUs are never shared among running containers, and once every pod is gone the pool is every CPU
    but the reserved one again and a pod asking all of them is placed."""
    import random

    rng = random.Random(seed)

    async def pod_life(i: int) -> str:
        qos = rng.choice(["guaranteed", "guaranteed", "burstable", "besteffort"])
        cfg = kubelet.sandbox_config(f"r{i}", f"uid-r{i}", qos=qos)
        sid = await kubelet.run_pod_sandbox(cfg)
        for n in range(rng.randint(1, 3)):
            cpu = rng.choice([1000, 2000]) if qos == "guaranteed" else 200
            for attempt in range(rng.randint(1, 3)):
                if rng.random() < 0.2:
                    runtime.fail_next["CreateContainer"] = (grpc.StatusCode.UNKNOWN, "runc failed")
                try:
                    cid = await create(kubelet, sid, cfg, f"c{n}", cpu, attempt=attempt)
                except grpc.aio.AioRpcError as e:
                    assert e.code() in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.RESOURCE_EXHAUSTED), e.details()
                    continue
                await asyncio.sleep(rng.random() / 50)
                runtime.exit(cid, rng.choice([0, 1, 137]))  # crashes (or completes): kubelet re-creates it
        return sid

    sids = await asyncio.gather(*(pod_life(i) for i in range(10)))
    running = [c for c in runtime.containers.values() if c.state == pb.CONTAINER_RUNNING]
    entries = state_file(proxy).get("entries", {})
    exclusive = CPUSet()
    for c in running:
        own = entries.get(runtime.sandboxes[c.sandbox_id].metadata.uid, {}).get(c.config.metadata.name)
        if own is not None and S(own) == S(c.resources.cpuset_cpus):
            assert exclusive.isdisjoint(S(own)), f"{own} held by two running containers"
            exclusive |= S(own)
    for c in running:
        if S(c.resources.cpuset_cpus) != S(entries.get(runtime.sandboxes[c.sandbox_id].metadata.uid, {}).get(
                c.config.metadata.name, "")):
            assert S(c.resources.cpuset_cpus).isdisjoint(exclusive), "a shared container on an exclusive CPU"
    for sid in sids:
        await kubelet.stop_pod_sandbox(sid)
        await kubelet.remove_pod_sandbox(sid)
    st = state_file(proxy)
    assert st.get("entries", {}) == {} and S(st["defaultCpuSet"]) == S("0-7")
    # a fault injected for a create that the proxy refused (RESOURCE_EXHAUSTED) never reached the runtime: it is not
    # meant for the last pod
    runtime.fail_next.clear()
    _, ids, _ = await run_pod(kubelet, "all", 7000, 7000)
    assert cpus(runtime, ids["app"]) == S("1-7")
