"""docs/tenancy.md, one test per row: whatever a tenant writes (annotations, intent, pod-level fields, CDI names,
resize requests), no container of its pod ends up on another pod's exclusive CPUs. Through the proxy, in process,
against the in-process CRI runtime: the victim, a Guaranteed pod, holds CPUs 1-2; after each forgery every
container's cpuset (as the runtime holds it: created, then updated) is checked against every exclusive assignment of
another container (invariant (a) of docs/architecture.md), and the victim's CPUs are unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
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
from tests.criproxy.test_pinning import proxy_config, run_pod

VICTIM = CPUSet.parse("1-2")


@pytest.fixture
async def node(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path
               ) -> AsyncIterator[tuple[CriProxy, CRIClient]]:
    p = await CriProxy(proxy_config(short_tmp, runtime, two_numa_sysfs, converge_period=0)).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    async with CRIClient(p.config.listen) as k:
        _, ids, _ = await run_pod(k, "victim", 2000, 2000)
        assert runtime.containers[ids["app"]].resources.cpuset_cpus == str(VICTIM)
        yield p, k
    await p.stop()


def assert_isolated(p: CriProxy, runtime: MemoryRuntime) -> None:
    """Invariant (a) across pods: an exclusive CPU is in no other pod's container's cpuset (an empty cpuset is every
    CPU). Within a pod, CPUs of a container taken for an init container pass to the next one (kubelet's rule; the
    start guard keeps the next one from starting while the first still runs, tests/criproxy/test_e2e_containerd.py)."""
    state = p.allocator.state
    exclusive = {(uid, name): cpus for uid, pod in state.assignments.items() for name, cpus in pod.items()
                 if state.mode(uid, name) == "exclusive"}
    assert exclusive.get(("uid-victim", "app")) == VICTIM
    everything = CPUSet.parse("0-7")
    for cid, c in runtime.containers.items():
        t = p.registry.containers.get(cid)
        assert t is not None, f"container {cid} not tracked by the proxy"
        cpus = CPUSet.parse(c.resources.cpuset_cpus) if c.resources.cpuset_cpus else everything
        for (uid, name), owned in exclusive.items():
            if uid != t.pod_uid:  # within a pod, an init container's CPUs pass to the next container (kubelet's rule)
                assert cpus.isdisjoint(owned), (f"{t.pod_ref}/{t.name} runs on {cpus}, among them {uid}/{name}'s "
                                                f"exclusive CPUs {owned}")


async def create(k: CRIClient, name: str, *, annotations: dict[str, str] | None = None, qos: str = "burstable",
                 cpu: int | None = 500, limit: int | None = None, containers: tuple[str, ...] = ("c",),
                 namespace: str = "tenant", labels: dict[str, str] | None = None,
                 config: pb.ContainerConfig | None = None) -> list[str]:
    """A tenant pod's containers, created and started; a create numapin refuses is no container (kubelet retries)."""
    sb = k.sandbox_config(name, f"uid-{name}", namespace=namespace, qos=qos, annotations=annotations, labels=labels)
    sid = await k.run_pod_sandbox(sb)
    out = []
    for c in containers:
        cc = config or k.container_config(c, cpu_milli=cpu, limit_milli=limit)
        try:
            cid = await k.create_container(sid, cc, sb)
        except grpc.aio.AioRpcError as e:
            assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                                grpc.StatusCode.RESOURCE_EXHAUSTED), e
            continue
        await k.start_container(cid)
        out.append(cid)
    return out


@pytest.mark.parametrize("mode", ["exclusive", "share", "none", " Exclusive ", "SHARE", "turbo", ""])
@pytest.mark.parametrize("qos", ["guaranteed", "burstable", "besteffort"])
async def test_row_mode_annotation(node: tuple[CriProxy, CRIClient], runtime: MemoryRuntime, mode: str,
                                   qos: str) -> None:
    p, k = node
    await create(k, "t", annotations={"qos.gocrane.io/cpu-manager": mode}, qos=qos, cpu=2000,
                 limit=2000 if qos != "besteffort" else None, containers=("a", "b"))
    # a later exclusive pod too: a tenant's share CPUs are never handed out twice
    await create(k, "t2", qos="guaranteed", cpu=1000, limit=1000)
    assert_isolated(p, runtime)


def _intent(qos: str, mode: str | None, *containers: ContainerInfo) -> str:
    return encode_intent(PodInfo("u", "tenant", "t", qos, mode, False, containers))  # type: ignore[arg-type]


@pytest.mark.parametrize("intent", [
    # a Burstable pod claiming to be Guaranteed with 4 CPUs of its own: it may steal free CPUs, never taken ones
    _intent("Guaranteed", "exclusive", ContainerInfo("c", "app", 4000, 4000, 1, 1)),
    # more CPUs than the node has
    _intent("Guaranteed", None, ContainerInfo("c", "app", 64000, 64000, 1, 1)),
    # its app container an init container, whose CPUs pass to the next container of the same pod only
    _intent("Guaranteed", None, ContainerInfo("c", "init", 2000, 2000, 1, 1), ContainerInfo("d", "app", 2000, 2000,
                                                                                            1, 1)),
    # a container list without this container, garbage, deep nesting, absurd numbers
    _intent("Guaranteed", None, ContainerInfo("other", "app", 1000, 1000, 1, 1)),
    "{not json", "[" * 2000, '{"v":1,"qosClass":"Guaranteed","cpuManager":null,"containers":[{"name":"c",'
    '"role":"app","cpu":[-5,1e308],"memory":[1,1]}]}',
])
async def test_row_intent_annotation(node: tuple[CriProxy, CRIClient], runtime: MemoryRuntime, intent: str) -> None:
    p, k = node
    await create(k, "t", annotations={INTENT_ANNOTATION: intent}, containers=("c", "d"))
    assert_isolated(p, runtime)


async def test_row_pod_level_fields(node: tuple[CriProxy, CRIClient], runtime: MemoryRuntime) -> None:
    """The pod's identity is kubelet's (CRI metadata); labels and annotations that look like it change nothing: not
    the bypass namespace, not the proxy's own pod, not the QoS class (the cgroup parent's)."""
    p, k = node
    fake = {"io.kubernetes.pod.namespace": "numapin", "io.kubernetes.pod.uid": "uid-victim",
            "io.kubernetes.pod.name": "victim"}
    await create(k, "t", annotations={"numapin.io/bypass": "true", **fake}, labels=fake, qos="guaranteed",
                 cpu=2000, limit=2000)
    await create(k, "victim", namespace="tenant", annotations={"numapin.io/bypass": "true"})  # the victim's name
    assert p.allocator.container_cpus("uid-t", "c") is not None  # by its QoS class: CPUs of its own, free ones
    assert_isolated(p, runtime)


async def test_row_cdi_device_names(node: tuple[CriProxy, CRIClient], runtime: MemoryRuntime) -> None:
    """CDI devices (ContainerConfig.CDI_devices, field 17, and containerd's ``cdi.k8s.io/`` annotations) are
    passed through as sent; the cpuset is numapin's whatever they name."""
    p, k = node
    cc = k.container_config("c", cpu_milli=500)
    name = b"vendor.com/gpu=all"
    device = b"\x0a" + bytes([len(name)]) + name                  # CDIDevice.name = 1
    cc = pb.ContainerConfig.FromString(cc.SerializeToString() + b"\x8a\x01" + bytes([len(device)]) + device)
    cc.annotations["cdi.k8s.io/tenant"] = "vendor.com/cpu=victim"
    [cid] = await create(k, "t", annotations={"cdi.k8s.io/x": "vendor.com/gpu=0"}, config=cc)
    sent = pb.CreateContainerRequest.FromString(runtime.requests("CreateContainer")[-1])
    assert name in sent.config.SerializeToString()  # passed through untouched
    assert CPUSet.parse(runtime.containers[cid].resources.cpuset_cpus) == CPUSet.parse("0,3-7")
    assert_isolated(p, runtime)


@pytest.mark.parametrize("bypass", [False, True])
async def test_row_resize_and_cpuset_requests(node: tuple[CriProxy, CRIClient], runtime: MemoryRuntime,
                                              bypass: bool) -> None:
    """A cpuset in a create or an update (an in-place resize, or a runtime class that sets one) is numapin's to
    decide: the victim's CPUs asked for by a shared, a pinned or a bypassed container are replaced by its own."""
    p, k = node
    ann = {"numapin.io/bypass": "true"} if bypass else None
    shared = await create(k, "s", annotations=ann, config=k.container_config("c", cpu_milli=500, cpuset_cpus="1-2"))
    pinned = await create(k, "x", annotations=ann, qos="guaranteed",
                          config=k.container_config("c", cpu_milli=1000, limit_milli=1000, cpuset_cpus="1-2"))
    assert_isolated(p, runtime)
    # the same size with a forged cpuset: answered, the cpuset replaced by numapin's
    for cid, quota, shares in [(c, 50000, 512) for c in shared] + [(c, 100000, 1024) for c in pinned]:
        await k.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(
            container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus="0-7", cpu_quota=quota, cpu_period=100000,
                                                               cpu_shares=shares)), pb.UpdateContainerResourcesResponse)
    assert_isolated(p, runtime)
    # a resize to every CPU with a forged cpuset: the shared container stays shared; the pinned one's resize is
    # judged by the topology manager (refused here: the victim holds CPUs), never granted the victim's CPUs
    for cid in shared + pinned:
        try:
            await k.call("UpdateContainerResources", pb.UpdateContainerResourcesRequest(
                container_id=cid, linux=pb.LinuxContainerResources(cpuset_cpus="0-7", cpu_quota=800000,
                                                                   cpu_period=100000, cpu_shares=8192)),
                pb.UpdateContainerResourcesResponse)
        except grpc.aio.AioRpcError as e:
            assert cid in pinned and not bypass, (cid, e.details())
            assert e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION), e
        assert_isolated(p, runtime)


async def test_row_bypass_annotation(node: tuple[CriProxy, CRIClient], runtime: MemoryRuntime) -> None:
    p, k = node
    for qos in ("guaranteed", "burstable", "besteffort"):
        await create(k, f"t-{qos}", annotations={"numapin.io/bypass": "true"}, qos=qos, cpu=2000, limit=2000)
        await create(k, f"ops-{qos}", namespace="numapin", annotations={"numapin.io/bypass": "true"}, qos=qos,
                     cpu=2000, limit=2000)
    assert_isolated(p, runtime)
