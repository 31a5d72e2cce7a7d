"""Changes of running pods' CPU modes through the proxy (in-process runtime): the order of the cpuset updates (the
shared containers narrowed before a pod's containers take exclusive CPUs), and seeded random lifecycles mixed with
mode changes (some concurrent with creates), after which the state file, the registry and the runtime agree."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from criproxy.app import CriProxy
from criproxy.config import load_config
from nodeagent.decisions.mode_request import ModeRequest
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime

from .test_lifecycle_random import check

MODE = "qos.gocrane.io/cpu-manager"


@pytest.fixture
async def proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> AsyncIterator[CriProxy]:
    cfg = load_config(None, {"listen": str(short_tmp / "p.sock"), "runtime_endpoint": runtime.socket_path,
                             "state_dir": str(short_tmp / "state"), "sysfs": str(two_numa_sysfs),
                             "reserved_cpus": "0", "metrics_address": "", "node_name": "n"})
    p = await CriProxy(cfg).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    yield p
    try:
        await asyncio.wait_for(p.stop(), 30)
    except TimeoutError:
        for t in asyncio.all_tasks():
            t.print_stack()
        raise


def updates(runtime: MemoryRuntime, start: int) -> list[tuple[str, CPUSet]]:
    out = []
    for raw in runtime.requests("UpdateContainerResources")[start:]:
        req = pb.UpdateContainerResourcesRequest.FromString(raw)
        out.append((req.container_id, CPUSet.parse(req.linux.cpuset_cpus)))
    return out


async def run_pod(k: CRIClient, name: str, cpu: int, *, qos: str = "guaranteed",
                  annotations: dict[str, str] | None = None) -> str:
    sb = k.sandbox_config(name, f"uid-{name}", qos=qos, annotations=annotations)
    sid = await k.run_pod_sandbox(sb)
    cid = await k.create_container(sid, k.container_config("main", cpu_milli=cpu,
                                                           limit_milli=cpu if qos == "guaranteed" else None), sb)
    await k.start_container(cid)
    return cid


async def test_shared_containers_are_narrowed_before_the_pod_takes_exclusive_cpus(
        proxy: CriProxy, runtime: MemoryRuntime) -> None:
    async with CRIClient(proxy.config.listen) as k:
        shared = [await run_pod(k, f"web{i}", 200, qos="burstable") for i in range(5)]
        db = await run_pod(k, "db", 2000, annotations={MODE: "none"})
        mark = len(runtime.requests("UpdateContainerResources"))
        answer = await proxy.modes.request(ModeRequest("default", "db", "exclusive", "local"))
        assert answer.outcome == "changed", answer
        seq = updates(runtime, mark)
        own = proxy.allocator.container_cpus("uid-db", "main")
        assert own is not None and len(own) == 2
        first_db = next(i for i, (cid, _) in enumerate(seq) if cid == db)
        narrowed = {cid: i for i, (cid, cpus) in enumerate(seq) if cid in shared}
        assert set(narrowed) == set(shared), seq
        assert all(i < first_db for i in narrowed.values()), seq  # every shared container narrowed first
        assert all(cpus.isdisjoint(own) for cid, cpus in seq if cid in shared)
        assert seq[first_db][1] == own
        check(proxy, runtime)
        # exclusive -> share: db keeps its CPUs, the shared containers get them back (widened after)
        mark = len(runtime.requests("UpdateContainerResources"))
        answer = await proxy.modes.request(ModeRequest("default", "db", "share", "local"))
        assert answer.outcome == "changed"
        seq = updates(runtime, mark)
        assert {cid for cid, cpus in seq if own <= cpus} == set(shared)
        check(proxy, runtime)
        # a pod of another node, and a bad value
        assert (await proxy.modes.request(ModeRequest("default", "nope", "share", "local"))).outcome == "ignored"
        assert (await proxy.modes.request(ModeRequest("default", "db", "turbo", "local"))).outcome == "error"


async def test_a_refused_api_change_is_tried_again(proxy: CriProxy, runtime: MemoryRuntime) -> None:
    async with CRIClient(proxy.config.listen) as k:
        big = await run_pod(k, "big", 7000)  # every allocatable CPU (0 is reserved)
        await run_pod(k, "db", 2000, annotations={MODE: "none"})
        answer = await proxy.modes.request(ModeRequest("default", "db", "exclusive", "api", uid="uid-db"))
        assert answer.outcome == "refused" and answer.reason == "UnexpectedAdmissionError"
        assert proxy.modes.pending["uid-db"].mode == "exclusive"
        await k.stop_container(big)
        await k.remove_container(big)  # CPUs freed: the change is tried again at once (not in retry_seconds)
        for _ in range(100):
            if "uid-db" not in proxy.modes.pending:
                break
            await asyncio.sleep(0.05)
        assert "uid-db" not in proxy.modes.pending
        assert len(proxy.allocator.container_cpus("uid-db", "main") or ()) == 2
        check(proxy, runtime)


@pytest.mark.parametrize("seed", range(1, 7))
async def test_random_lifecycles_with_mode_changes(seed: int, proxy: CriProxy, runtime: MemoryRuntime) -> None:
    rng = random.Random(seed)
    pods: dict[str, tuple[str, pb.PodSandboxConfig, dict[str, str]]] = {}
    n = 0
    async with CRIClient(proxy.config.listen) as k:

        async def new_pod() -> None:
            nonlocal n
            n += 1
            kind = rng.choice(["guaranteed", "burstable", "none", "share", "exclusive"])
            ann = {MODE: kind} if kind in ("none", "share", "exclusive") else {}
            qos = "burstable" if kind == "burstable" else "guaranteed"
            sb = k.sandbox_config(f"p{n}", f"u{n}", qos=qos, annotations=ann)
            sid = await k.run_pod_sandbox(sb)
            conts: dict[str, str] = {}
            pods[f"u{n}"] = (sid, sb, conts)
            for j in range(rng.randint(1, 2)):
                cpu = rng.choice([1000, 2000])
                try:
                    cid = await k.create_container(sid, k.container_config(
                        f"c{j}", cpu_milli=cpu, limit_milli=cpu if qos == "guaranteed" else None), sb)
                    await k.start_container(cid)
                    conts[f"c{j}"] = cid
                except grpc.aio.AioRpcError as e:
                    assert e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION)

        async def change(uid: str) -> None:
            _, sb, _ = pods[uid]
            mode = rng.choice(["none", "exclusive", "share", "kubelet"])
            answer = await proxy.modes.request(ModeRequest("default", sb.metadata.name, mode, "local"))
            assert answer.outcome in ("changed", "unchanged", "refused"), answer

        for _ in range(40):
            op = rng.choice(["pod", "change", "change", "change+pod", "remove", "stop", "restart"])
            if op == "pod" or not pods:
                await new_pod()
                continue
            uid = rng.choice(sorted(pods))
            sid, sb, conts = pods[uid]
            if op == "change":
                await change(uid)
            elif op == "change+pod":  # a change and a create race (both go through the allocation lock)
                await asyncio.gather(change(uid), new_pod())
            elif op == "remove" and conts:
                name = rng.choice(sorted(conts))
                await k.stop_container(conts[name])
                await k.remove_container(conts.pop(name))
            elif op == "restart" and conts:  # kubelet creates the container again: it gets the pod's new mode
                name = rng.choice(sorted(conts))
                await k.stop_container(conts[name])
                await k.remove_container(conts.pop(name))
                try:
                    cid = await k.create_container(sid, k.container_config(
                        name, cpu_milli=1000, limit_milli=1000 if "burstable" not in sb.linux.cgroup_parent
                        else None), sb)
                    await k.start_container(cid)
                    conts[name] = cid
                except grpc.aio.AioRpcError as e:
                    assert e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION)
            elif op == "stop":
                await k.stop_pod_sandbox(sid)
                await k.remove_pod_sandbox(sid)
                del pods[uid]
            check(proxy, runtime)
            modes = proxy.allocator.state.pod_modes
            assert set(modes) <= set(pods), "a gone pod's mode is forgotten"
