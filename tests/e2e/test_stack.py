"""End to end: webhook + proxy + a real containerd, driven like a cluster (numapin_lab.demo.stack, real processes).

The machine's real topology is used (2 CPUs here, one NUMA node): with CPU 0 reserved, one CPU can be pinned at a
time, so the pods of each mode take turns; topology manager policy single-numa-node."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.demo.admission import AdmissionClient
from numapin_lab.demo.stack import SERVER_NAME, LocalStack, StackOptions, cgroup_mounts
from tests.monitoring.rules import exported_names, metric_names, rules

from .conftest import Cluster, make_pod

pytestmark = pytest.mark.containerd

ROOT = Path(__file__).resolve().parents[2]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def numapin(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numapin", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


async def test_shared_share_and_exclusive_pods_take_turns_with_denied_bindings(
        cluster: Cluster, machine: Topology) -> None:
    everything = machine.all_cpus
    pinnable = everything - CPUSet([0])
    await cluster.schedule_and_run(make_pod("web1", cpu="250m"))                 # Burstable
    await cluster.schedule_and_run(make_pod("web2", cpu="0"))                    # a tiny request, shared too
    assert await cluster.cpus("web1") == everything and await cluster.cpus("web2") == everything

    # share: pinned, and its CPUs stay in the shared pool
    await cluster.schedule_and_run(make_pod("s1", cpu=str(len(pinnable)), limit=str(len(pinnable)), mode="share"))
    assert await cluster.cpus("s1") == pinnable
    assert await cluster.cpus("web1") == everything
    s2, v = await cluster.create(make_pod("s2", cpu="1", limit="1", mode="share"))
    assert v.allowed, v
    assert not await cluster.fits_now(s2)
    denied = await cluster.bind(s2)
    assert not denied.allowed and "single-numa-node" in denied.message and "would reject" in denied.message
    await cluster.delete("s1")
    assert await cluster.fits_once_published(s2)  # the node published the freed CPUs
    assert (await cluster.bind(s2)).allowed
    cluster.pods["s2"] = await cluster.runner.run(s2)
    assert len(await cluster.cpus("s2")) == 1 and await cluster.cpus("web2") == everything

    # exclusive: the shared pool narrows before it runs, widens when it goes
    e1, v = await cluster.create(make_pod("e1", cpu="1", limit="1", mode="exclusive"))
    assert not await cluster.fits_now(e1) and not (await cluster.bind(e1)).allowed
    await cluster.delete("s2")
    assert await cluster.fits_once_published(e1) and (await cluster.bind(e1)).allowed
    cluster.pods["e1"] = await cluster.runner.run(e1)
    e1_cpus = await cluster.cpus("e1")
    assert len(e1_cpus) == 1 and e1_cpus.issubset(pinnable)
    for web in ("web1", "web2"):
        assert await cluster.cpus(web) == everything - e1_cpus
    e2, _ = await cluster.create(make_pod("e2", cpu="1", limit="1"))  # Guaranteed, integer: exclusive by kubelet's rule
    if len(pinnable) == 1:
        assert not await cluster.fits_now(e2) and not (await cluster.bind(e2)).allowed
        await cluster.delete("e1")
        assert await cluster.cpus("web1") == everything
    assert await cluster.fits_once_published(e2) and (await cluster.bind(e2)).allowed
    cluster.pods["e2"] = await cluster.runner.run(e2)
    e2_cpus = await cluster.cpus("e2")
    assert len(e2_cpus) == 1 and not (await cluster.cpus("web1")) & e2_cpus

    status = await cluster.status()
    assert status.disagreements == [] and len(status.checked) == len(cluster.pods)
    assert {(a.pod, a.mode) for a in status.assignments} >= {("default/e2", "exclusive")}
    r = numapin("status", "--status-url", cluster.stack.status_url, "--runtime-endpoint",
                f"unix://{cluster.stack.lab.socket}", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["disagreements"] == [] and doc["sharedPool"] == str(everything - e2_cpus)
    assert {p["pod"] for p in doc["pinned"]} >= {"default/e2"}
    # docs/metrics.md: the proxy's metrics, on the same port as /status
    metrics = await asyncio.to_thread(_get, cluster.stack.status_url.rsplit("/", 1)[0] + "/metrics")
    def value(sample: str) -> float:
        m = re.search(re.escape(sample) + r" (\S+)", metrics)
        assert m, f"{sample} not in\n{metrics}"
        return float(m.group(1))

    assert value('numapin_criproxy_allocations_total{mode="share"}') >= 2  # (the proxy serves every test here)
    assert value('numapin_criproxy_allocations_total{mode="exclusive"}') >= 2
    assert value('numapin_criproxy_free_cpus{numa_node="0"}') == doc["freeCPUsPerNUMA"]["0"]
    assert 'numapin_criproxy_relay_seconds_count{code="OK",method="CreateContainer"}' in metrics


async def test_every_metric_the_alert_rules_use_is_exported_by_the_running_proxy_and_webhook(
        cluster: Cluster) -> None:
    """manifests/monitoring's rules against the /metrics pages of the running ``numapin criproxy`` and ``numapin
    webhook`` (a labelled metric not yet observed shows as its ``# TYPE`` line)."""
    proxy_page = await asyncio.to_thread(_get, cluster.stack.status_url.rsplit("/", 1)[0] + "/metrics")
    ctx = ssl.create_default_context(cafile=cluster.stack.ca_file)
    ctx.check_hostname = False  # the serving certificate names the Service; the stack listens on 127.0.0.1

    def webhook_page() -> str:
        with urllib.request.urlopen(cluster.stack.webhook_url + "/metrics", timeout=10, context=ctx) as r:
            return str(r.read().decode())

    exported = exported_names(proxy_page) | exported_names(await asyncio.to_thread(webhook_page))
    used = {n: r.get("alert") or r["record"] for r in rules() for n in metric_names(r["expr"])}
    assert len(used) >= 9
    missing = {n: rule for n, rule in used.items() if n not in exported}
    assert missing == {}, f"metrics the rules use that numapin does not export: {missing}"


async def test_a_pod_no_numa_node_can_hold_is_refused_by_validate_binding_and_proxy(
        cluster: Cluster, machine: Topology) -> None:
    n = max(len(machine.cpus_in_numa(z) - CPUSet([0])) for z in machine.cpu_numa_nodes) + 1
    big, v = await cluster.create(make_pod("big", cpu=str(n), limit=str(n), mode="exclusive"))
    assert not v.allowed
    assert "single-numa-node" in v.message and "largest NUMA node" in v.message and '"app"' in v.message
    b = await cluster.bind(big)  # a pod whose CREATE was denied does not exist: its binding is not judged
    assert b.allowed and any("not found" in w and "--unjudged=allow" in w for w in b.warnings)
    running = await cluster.runner.run_sandbox(big)
    cluster.pods["big"] = running
    with pytest.raises(grpc.aio.AioRpcError) as err:  # the node's backstop, had the pod got there
        await cluster.runner.run_containers(big, running)
    assert err.value.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert "default/big" in err.value.details() and "single-numa-node" in err.value.details()
    assert (await cluster.status()).assignments == []


async def test_proxy_killed_and_restarted_keeps_pins_and_repairs_drift(cluster: Cluster, machine: Topology) -> None:
    stack = cluster.stack
    everything = machine.all_cpus
    await cluster.schedule_and_run(make_pod("web", cpu="100m"))
    await cluster.schedule_and_run(make_pod("db", cpu="1", limit="1", mode="exclusive"))
    db_cpus = await cluster.cpus("db")
    assert await cluster.cpus("web") == everything - db_cpus
    assert stack.proxy is not None
    stack.proxy.stop(signal.SIGKILL)
    async with CRIClient(stack.lab.socket) as direct:  # while the proxy is dead, web drifts back to every CPU
        await direct.update_container_resources(cluster.pods["web"].containers["app"],
                                                pb.LinuxContainerResources(cpuset_cpus=str(everything)))
    assert await cluster.cpus("web") == everything
    r = numapin("status", "--state-dir", str(stack.state_dir), "--nrt-file", str(stack.nrt_file), "--reserved-cpus",
                "0", "--runtime-endpoint", f"unix://{stack.lab.socket}")
    assert r.returncode == 1, r.stdout + r.stderr  # numapin status sees the drift from the files alone
    assert "DISAGREES default/web app" in r.stdout and "default/db app: exclusive" in r.stdout
    await asyncio.to_thread(stack.start_proxy)
    assert await cluster.cpus("web") == everything - db_cpus  # repaired by reconcile
    assert await cluster.cpus("db") == db_cpus
    assert (await cluster.status()).disagreements == []
    other, _ = await cluster.create(make_pod("db2", cpu="1", limit="1", mode="exclusive"))
    if len(everything) == 2:  # the republished topology still counts db
        assert not await cluster.fits_now(other) and not (await cluster.bind(other)).allowed
    await cluster.delete("db")
    assert await cluster.cpus("web") == everything


async def test_containerd_restarted_under_the_proxy(cluster: Cluster, machine: Topology) -> None:
    stack = cluster.stack
    everything = machine.all_cpus
    await cluster.schedule_and_run(make_pod("web", cpu="100m"))
    await cluster.schedule_and_run(make_pod("db", cpu="1", limit="1", mode="exclusive"))
    db_cpus = await cluster.cpus("db")
    db2, _ = await cluster.create(make_pod("db2", cpu="1", limit="1", mode="exclusive"))
    if len(everything) == 2:
        assert not await cluster.fits_now(db2) and not (await cluster.bind(db2)).allowed
    await asyncio.to_thread(stack.lab.stop_containerd)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await cluster.kubelet.version()
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await asyncio.to_thread(stack.lab.start_containerd)
    for _ in range(100):  # the proxy reconnects by itself
        try:
            await cluster.kubelet.version()
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)
    assert await cluster.cpus("db") == db_cpus and await cluster.cpus("web") == everything - db_cpus
    await cluster.delete("db")
    assert await cluster.cpus("web") == everything
    assert await cluster.fits_once_published(db2) and (await cluster.bind(db2)).allowed
    cluster.pods["db2"] = await cluster.runner.run(db2)
    assert len(await cluster.cpus("db2")) == 1
    assert (await cluster.status()).disagreements == []


def _processes_mentioning(text: str) -> list[str]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                out.append(f"{p.name}: {cmd}")
    return out


def test_stopping_the_stack_leaves_nothing_behind() -> None:
    d = scratch_dir("npe2c-")
    stack = LocalStack(StackOptions(workdir=d / "w", node_name="cleanup-node"))
    try:
        stack.start()

        async def pods() -> None:
            async with AdmissionClient(stack.webhook_url, stack.ca_file, SERVER_NAME) as api, \
                    CRIClient(stack.proxy_socket) as kubelet:
                c = Cluster(stack, api, kubelet)
                await c.schedule_and_run(make_pod("web", cpu="100m"))
                await c.schedule_and_run(make_pod("db", cpu="1", limit="1"))

        asyncio.run(pods())
        assert stack.lab._shim_pids() and stack.cgroup_dirs()
    finally:
        left = stack.stop()
    shutil.rmtree(d, ignore_errors=True)
    assert left == []
    assert _processes_mentioning(str(d)) == []
    assert not any((m / stack.cgroup_root).exists() for m in cgroup_mounts())
    with open("/proc/mounts") as f:
        assert str(d) not in f.read()
