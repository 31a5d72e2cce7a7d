"""numapin.io/bypass is a privilege of the namespaces the operator lists (--bypass-namespaces): elsewhere the proxy
ignores it; where it is honoured the pod still runs on the shared pool, off other pods' exclusive CPUs, unless the
operator lets that namespace run on every CPU (--bypass-all-cpus-namespaces). Through the proxy, in process, against
the in-process CRI runtime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from allocator.cpuset import CPUSet
from allocator.errors import ConfigError
from criproxy.app import CriProxy
from criproxy.config import load_config
from nodeagent.decisions.mode_request import ModeRequest
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy.test_pinning import created_resources, proxy_config, run_pod

BYPASS = {"numapin.io/bypass": "true"}


@asynccontextmanager
async def started(tmp: Path, runtime: MemoryRuntime, sysfs: Path, **over: Any) -> AsyncIterator[CriProxy]:
    p = await CriProxy(proxy_config(tmp, runtime, sysfs, **over)).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        yield p
    finally:
        await p.stop()


async def bypass_pod(k: CRIClient, name: str, namespace: str, cpu: int, limit: int | None = None, *,
                     qos: str = "guaranteed") -> tuple[str, str]:
    sb = k.sandbox_config(name, f"uid-{name}", namespace=namespace, qos=qos, annotations=BYPASS)
    sid = await k.run_pod_sandbox(sb)
    cid = await k.create_container(sid, k.container_config("c", cpu_milli=cpu, limit_milli=limit), sb)
    await k.start_container(cid)
    return sid, cid


def ignored(p: CriProxy, namespace: str) -> float:
    return p.metrics.registry.get_sample_value("numapin_criproxy_bypass_ignored_total",
                                               {"namespace": namespace}) or 0.0


def cpus_of(runtime: MemoryRuntime, cid: str) -> CPUSet:
    return CPUSet.parse(runtime.containers[cid].resources.cpuset_cpus)


async def test_a_bypass_outside_the_listed_namespaces_is_ignored_logged_and_counted(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with started(short_tmp, runtime, two_numa_sysfs) as p, CRIClient(p.config.listen) as k:
        # a tenant's burstable pod asking to bypass runs on the shared pool like any shared container ...
        _, tool = await bypass_pod(k, "tool", "tenant-a", 500, qos="burstable")
        assert cpus_of(runtime, tool) == CPUSet.parse("0-7")
        # ... and a Guaranteed one gets CPUs of its own by kubelet's rule, as if it had not asked
        _, pinned = await bypass_pod(k, "batch", "tenant-a", 2000, 2000)
        assert cpus_of(runtime, pinned) == CPUSet.parse("1-2")
        assert p.allocator.state.assignments == {"uid-batch": {"c": CPUSet.parse("1-2")}}
        # the shared one was narrowed off them: it never runs on another pod's exclusive CPUs
        assert cpus_of(runtime, tool) == CPUSet.parse("0,3-7")
        assert p.registry.containers[tool].mode == "shared"
        assert ignored(p, "tenant-a") == 2
        assert "--bypass-namespaces (numapin)" in caplog.text


async def test_a_honoured_bypass_runs_on_the_shared_pool_and_is_narrowed_off_exclusive_cpus(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    async with started(short_tmp, runtime, two_numa_sysfs, bypass_namespaces="ops,numapin") as p, \
            CRIClient(p.config.listen) as k:
        # a Guaranteed pod of a listed namespace gets no CPUs of its own, and is never rejected (64 CPUs on a
        # machine of 8): numapin does not admit it, but it runs on the shared pool
        _, agent = await bypass_pod(k, "agent", "ops", 2000, 2000)
        _, huge = await bypass_pod(k, "huge", "ops", 64000, 64000)
        assert cpus_of(runtime, agent) == cpus_of(runtime, huge) == CPUSet.parse("0-7")
        assert p.allocator.state.assignments == {}
        assert ignored(p, "ops") == 0
        _, db, _ = await run_pod(k, "db", 2000, 2000)
        assert created_resources(runtime, db["app"]).cpuset_cpus == "1-2"
        # narrowed like a shared container before db was created
        assert cpus_of(runtime, agent) == cpus_of(runtime, huge) == CPUSet.parse("0,3-7")
        assert {p.registry.containers[c].mode for c in (agent, huge)} == {"shared"}
        # a mode change is not for it: it has no mode
        answer = await p.modes.request(_mode_request("ops", "agent", "exclusive"))
        assert answer.outcome == "ignored" and "--bypass-namespaces" in answer.message


async def test_every_cpu_only_where_the_operator_opts_in_and_lists_the_namespace(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    async with started(short_tmp, runtime, two_numa_sysfs, bypass_namespaces="ops",
                       bypass_all_cpus_namespaces="ops,tenant-a") as p, CRIClient(p.config.listen) as k:
        _, db, _ = await run_pod(k, "db", 2000, 2000)
        _, agent = await bypass_pod(k, "agent", "ops", 500, qos="burstable")
        assert runtime.containers[agent].resources.cpuset_cpus == ""  # untouched: the operator's choice
        assert p.registry.containers[agent].mode == "bypass"
        # tenant-a is opted in to every CPU but not listed: its bypass is ignored
        _, tool = await bypass_pod(k, "tool", "tenant-a", 500, qos="burstable")
        assert cpus_of(runtime, tool) == CPUSet.parse("0,3-7")
        assert created_resources(runtime, db["app"]).cpuset_cpus == "1-2"


async def test_after_a_restart_a_honoured_bypass_is_brought_back_to_the_shared_pool(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    async with started(short_tmp, runtime, two_numa_sysfs) as p, CRIClient(p.config.listen) as k:
        await run_pod(k, "db", 2000, 2000)
        _, agent = await bypass_pod(k, "agent", "numapin", 1000, 1000)
        assert cpus_of(runtime, agent) == CPUSet.parse("0,3-7")
    # while the proxy is down, someone widens the bypassed container over db's CPUs
    runtime.containers[agent].resources.cpuset_cpus = "0-7"
    async with started(short_tmp, runtime, two_numa_sysfs) as p:
        assert cpus_of(runtime, agent) == CPUSet.parse("0,3-7")
        assert p.registry.containers[agent].mode == "shared"
        assert p.allocator.container_cpus("uid-db", "app") == CPUSet.parse("1-2")


def test_bad_namespace_names_are_refused_naming_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="bypass-namespaces: 'Tenant_A' is not a namespace name"):
        load_config(None, {"bypass_namespaces": "numapin,Tenant_A"})
    assert load_config(None, {"bypass_namespaces": ""}).bypass.namespaces == frozenset()
    cfg = tmp_path / "c.yaml"
    cfg.write_text("bypassNamespaces: [ops, numapin]\nbypassAllCpusNamespaces: ops\n")
    policy = load_config(str(cfg), {}).bypass
    assert (policy.namespaces, policy.all_cpus_namespaces) == ({"ops", "numapin"}, {"ops"})


def _mode_request(namespace: str, name: str, mode: str) -> ModeRequest:
    return ModeRequest(namespace=namespace, name=name, mode=mode, source="local")
