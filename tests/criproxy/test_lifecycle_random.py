"""Random kubelet-like lifecycles through the proxy (in-process runtime): after every step the state file,
the registry and the runtime agree, no CPU is held twice, nothing leaks, and cpusets match the state."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from criproxy.app import CriProxy
from criproxy.config import load_config
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime

ALL = CPUSet.parse("0-7")


def check(proxy: CriProxy, runtime: MemoryRuntime) -> None:
    doc = json.loads(proxy.config.state_file.read_text())
    entries = {uid: {n: CPUSet.parse(c) for n, c in pod.items()} for uid, pod in doc.get("entries", {}).items()}
    modes = doc.get("numapin", {}).get("modes", {})
    uid_of = {sid: cfg.metadata.uid for sid, cfg in runtime.sandboxes.items()}
    ready = {uid_of[s] for s, st in runtime.sandbox_state.items() if st == pb.SANDBOX_READY}
    present = {(uid_of[c.sandbox_id], c.config.metadata.name) for c in runtime.containers.values()}
    held = CPUSet()
    share = CPUSet()
    for uid, pod in entries.items():
        assert uid in ready, f"pod {uid} holds CPUs but its sandbox is gone or stopped"
        for name, cpus in pod.items():
            assert (uid, name) in present, f"{uid}/{name} holds {cpus} without a container"
            assert held.isdisjoint(cpus), f"{cpus} assigned twice"
            held |= cpus
            if modes.get(uid, {}).get(name) == "share":
                share |= cpus
    assert CPUSet.parse(doc["defaultCpuSet"]) == ALL - held
    pool = (ALL - held) | share
    for c in runtime.containers.values():
        if c.state != pb.CONTAINER_RUNNING:
            continue
        own = entries.get(uid_of[c.sandbox_id], {}).get(c.config.metadata.name)
        assert CPUSet.parse(c.resources.cpuset_cpus) == (own if own is not None else pool), (
            f"{c.config.metadata.name}: {c.resources.cpuset_cpus} != {own or pool}")


@pytest.mark.parametrize("seed", range(1, 9))
async def test_random_lifecycles_keep_the_invariants(seed: int, short_tmp: Path, runtime: MemoryRuntime,
                                                     two_numa_sysfs: Path) -> None:
    rng = random.Random(seed)
    cfg = load_config(None, {"listen": str(short_tmp / "p.sock"), "runtime_endpoint": runtime.socket_path,
                             "state_dir": str(short_tmp / "state"), "sysfs": str(two_numa_sysfs),
                             "reserved_cpus": "0", "metrics_address": "", "node_name": "n"})
    proxy = await CriProxy(cfg).start()
    pods: dict[str, tuple[str, pb.PodSandboxConfig, dict[str, str]]] = {}  # uid -> (sandbox, config, containers)
    configs: dict[str, pb.ContainerConfig] = {}  # what kubelet sent for each container
    n = 0
    try:
        k = CRIClient(cfg.listen)
        await asyncio.wait_for(proxy.reconciled.wait(), 30)
        for _ in range(60):
            op = rng.choice(["pod", "pod", "container", "restart", "stop", "remove", "kill-proxy"])
            if op == "pod" or not pods:
                n += 1
                kind = rng.choice(["guaranteed", "burstable", "besteffort", "share"])
                ann = {"qos.gocrane.io/cpu-manager": "share"} if kind == "share" else {}
                sb = k.sandbox_config(f"p{n}", f"u{n}", qos="burstable" if kind == "share" else kind,
                                      annotations=ann)
                pods[f"u{n}"] = (await k.run_pod_sandbox(sb), sb, {})
                op = "container"
            uid = rng.choice(sorted(pods))
            sid, sb, conts = pods[uid]
            if op == "container":
                cpu = rng.choice([1000, 2000, 3000]) if "besteffort" not in sb.linux.cgroup_parent else 0
                guaranteed = "burstable" not in sb.linux.cgroup_parent and "besteffort" not in sb.linux.cgroup_parent
                share = bool(sb.annotations)
                n += 1
                name = f"c{n}"
                cc = k.container_config(name, cpu_milli=cpu or None,
                                        limit_milli=cpu if (guaranteed or share) and cpu else None)
                try:
                    cid = await k.create_container(sid, cc, sb)
                    await k.start_container(cid)
                    conts[name] = cid
                    configs[cid] = cc
                except grpc.aio.AioRpcError as e:
                    assert e.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION)
            elif op == "restart" and conts:
                name = rng.choice(sorted(conts))
                old = conts[name]
                await k.stop_container(old)
                cid = await k.create_container(sid, configs[old], sb)  # same name: gets its CPUs back
                configs[cid] = configs[old]
                await k.start_container(cid)
                await k.remove_container(old)
                conts[name] = cid
            elif op == "stop":
                await k.stop_pod_sandbox(sid)
                await k.remove_pod_sandbox(sid)
                del pods[uid]
            elif op == "remove" and conts:
                name = rng.choice(sorted(conts))
                await k.stop_container(conts[name])
                await k.remove_container(conts.pop(name))
            elif op == "kill-proxy":
                await k.close()
                await proxy.stop(grace=0)
                proxy = await CriProxy(cfg).start()
                await asyncio.wait_for(proxy.reconciled.wait(), 30)
                k = CRIClient(cfg.listen)
            check(proxy, runtime)
        await k.close()
    finally:
        await proxy.stop()
