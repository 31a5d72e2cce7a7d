"""Changing a running pod's CPU mode, end to end: a kubelet-like client -> `numapin criproxy` (a real process) -> a
real containerd + runc, the change asked with `numapin mode` (the local control socket) or by annotating the pod on
the in-test API server the proxy watches. Every cpuset is read from the kernel (``/proc/<pid>/status`` and the
cgroup), with a shared container running beside. On this 2-CPU machine CPU 0 is reserved: a pinned container gets
CPU 1 (EXCL); the shared pool is 0-1, or 0 (SHARED) while CPU 1 is exclusive."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab
from tests.webhook.fake_kube import PODS_PATH, FakeKubeAPI

from . import test_e2e_containerd as e2e
from .test_e2e_containerd import EXCL, ROOT, SHARED, ProxyProcess, cfs_quota, cpus_of, pid_of, start_pod

lab, proxy, kubelet, machine_cpus = e2e.lab, e2e.proxy, e2e.kubelet, e2e.machine_cpus  # the same fixtures

# on containerd 1.7 and 2.x too (containerd_matrix): the mode kept across proxy and containerd restarts (containerd's
# records); the transitions themselves are the proxy's and the kernel's, the same on every version
pytestmark = [pytest.mark.containerd]

MODE = "qos.gocrane.io/cpu-manager"


def numapin_mode(p: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numapin", "mode", *args, "--socket", str(p.dir / "control.sock")],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


async def test_every_transition_with_a_shared_container_beside(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    ALL = machine_cpus
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    _, db = await start_pod(kubelet, "db", 1000, 1000, annotations={MODE: "none"})  # Guaranteed, kept shared
    web_pid, db_pid = await pid_of(kubelet, web), await pid_of(kubelet, db)
    assert cpus_of(db_pid) == (ALL, ALL) and cpus_of(web_pid) == (ALL, ALL)
    assert cfs_quota(db_pid) == "100000"
    steps = [  # (mode asked, db's cpus, web's cpus, db's CFS quota)
        ("exclusive", EXCL, SHARED, "-1"),   # none -> exclusive: web narrowed, db alone on CPU 1
        ("share", EXCL, ALL, "-1"),          # exclusive -> share: CPU 1 back in the pool
        ("exclusive", EXCL, SHARED, "-1"),   # share -> exclusive
        ("none", ALL, ALL, "100000"),        # exclusive -> none: released, quota back
        ("share", EXCL, ALL, "-1"),          # none -> share
        ("none", ALL, ALL, "100000"),        # share -> none
        ("kubelet", EXCL, SHARED, "-1"),     # annotation removed: kubelet's rule pins a Guaranteed pod
        ("share", EXCL, ALL, "-1"),
        ("kubelet", EXCL, SHARED, "-1"),
        ("none", ALL, ALL, "100000"),
    ]
    for mode, db_cpus, web_cpus, quota in steps:
        out = await asyncio.to_thread(numapin_mode, proxy, "default/db", mode)
        assert out.returncode == 0, (mode, out.stdout, out.stderr)
        # read at once when the command returns: the change is applied before the proxy answers
        assert (cpus_of(db_pid), cpus_of(web_pid), cfs_quota(db_pid)) == ((db_cpus, db_cpus), (web_cpus, web_cpus),
                                                                          quota), (mode, out.stdout)
    out = await asyncio.to_thread(numapin_mode, proxy, "default/db", "none")
    assert out.returncode == 0 and "already runs in mode none" in out.stdout
    log = proxy.log.read_text()
    assert "mode change (local) pod=default/db -> exclusive: changed" in log


async def test_a_transition_the_node_cannot_satisfy_is_refused_and_changes_nothing(
        kubelet: CRIClient, proxy: ProxyProcess, machine_cpus: str) -> None:
    port = proxy.port  # its /metrics and /status
    _, big = await start_pod(kubelet, "big", 1000, 1000)                           # holds CPU 1
    _, db = await start_pod(kubelet, "db", 1000, 1000, annotations={MODE: "none"})
    db_pid = await pid_of(kubelet, db)
    state = proxy.state()
    out = await asyncio.to_thread(numapin_mode, proxy, "default/db", "exclusive")
    assert out.returncode == 1 and "UnexpectedAdmissionError" in out.stdout and "keeps running as it was" in out.stdout
    assert cpus_of(db_pid) == (SHARED, SHARED) and cpus_of(await pid_of(kubelet, big)) == (EXCL, EXCL)
    assert proxy.state() == state
    metrics = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
    assert 'numapin_criproxy_mode_refusals_total{reason="UnexpectedAdmissionError"} 1.0' in metrics
    out = await asyncio.to_thread(numapin_mode, proxy, "default/db", "share")  # share needs CPUs of its own too
    assert out.returncode == 1
    out = await asyncio.to_thread(numapin_mode, proxy, "default/big", "none")
    assert out.returncode == 0
    out = await asyncio.to_thread(numapin_mode, proxy, "default/db", "exclusive")
    assert out.returncode == 0 and cpus_of(db_pid) == (EXCL, EXCL)
    assert cpus_of(await pid_of(kubelet, big)) == (SHARED, SHARED)
    metrics = await asyncio.to_thread(get, f"http://127.0.0.1:{port}/metrics")
    assert 'numapin_criproxy_mode_changes_total{from="none",to="exclusive"} 1.0' in metrics
    assert 'numapin_criproxy_mode_changes_total{from="kubelet",to="none"} 1.0' in metrics
    # numapin status shows the pods' modes; the NodeResourceTopology is republished
    status = json.loads(await asyncio.to_thread(get, f"http://127.0.0.1:{port}/status"))
    modes = {p["pod"]: p for p in status["podModes"]}
    assert modes["default/db"]["mode"] == "exclusive" and modes["default/db"]["changed"] is True
    shown = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "numapin", "status", "--status-url",
                                                     f"http://127.0.0.1:{port}/status", "--no-runtime"],
                                    capture_output=True, text=True, cwd=ROOT)
    assert "pod default/db: CPU mode changed while running, now exclusive" in shown.stdout, shown.stdout + shown.stderr
    nrt = json.loads((proxy.state_dir / "nrt" / "lab.json").read_text())
    zone = next(z for z in nrt["zones"] if z["name"] == "node-0")
    assert [r["available"] for r in zone["resources"] if r["name"] == "cpu"] == ["0"]


@pytest.mark.containerd_matrix
async def test_the_new_mode_survives_proxy_and_containerd_restarts(
        kubelet: CRIClient, proxy: ProxyProcess, lab: ContainerdLab, machine_cpus: str) -> None:
    ALL = machine_cpus
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    cfg = kubelet.sandbox_config("db", f"uid-db-{time.monotonic_ns()}", annotations={MODE: "none"})
    sid = await kubelet.run_pod_sandbox(cfg)
    db = await kubelet.create_container(sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000), cfg)
    await kubelet.start_container(db)
    web_pid, db_pid = await pid_of(kubelet, web), await pid_of(kubelet, db)
    assert (await asyncio.to_thread(numapin_mode, proxy, "default/db", "exclusive")).returncode == 0
    assert proxy.state()["numapin"]["podModes"] == {cfg.metadata.uid: "exclusive"}
    # kill -9 of the proxy: the restarted proxy keeps the mode, and reconcile/converge hold it in the kernel
    proxy.kill()
    await asyncio.to_thread(proxy.start)
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    # the container restarts (kubelet creates a new one from the sandbox, which still says "none"): exclusive
    await kubelet.stop_container(db, timeout=0)
    await kubelet.remove_container(db)
    assert cpus_of(web_pid) == (ALL, ALL)  # its CPU came back meanwhile
    db = await kubelet.create_container(
        sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000, attempt=1), cfg)
    await kubelet.start_container(db)
    db_pid = await pid_of(kubelet, db)
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    # containerd restarts: the containers keep their cpusets, and the next change works
    await asyncio.to_thread(lab.stop_containerd)
    await asyncio.to_thread(lab.start_containerd)
    for _ in range(300):
        try:
            await kubelet.version()
            break
        except Exception:
            await asyncio.sleep(0.1)
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    assert (await asyncio.to_thread(numapin_mode, proxy, "default/db", "share")).returncode == 0
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (ALL, ALL)
    proxy.kill()
    await asyncio.to_thread(proxy.start)
    assert proxy.state()["numapin"]["podModes"] == {cfg.metadata.uid: "share"}
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (ALL, ALL)


# -- the API server's watch -----------------------------------------------------------------------------------


@pytest.fixture
async def kube() -> AsyncIterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    await api.start()
    yield api
    await api.close()


def api_pod(name: str, uid: str, mode: str | None) -> dict:
    meta: dict = {"name": name, "namespace": "default", "uid": uid}
    if mode is not None:
        meta["annotations"] = {MODE: mode}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": "lab", "containers": [{"name": "main", "resources": {
                "limits": {"cpu": "1", "memory": "64Mi"}, "requests": {"cpu": "1", "memory": "64Mi"}}}]},
            "status": {"qosClass": "Guaranteed"}}


async def until(pred, what: str, tries: int = 300) -> None:
    for _ in range(tries):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def test_kubectl_annotate_through_the_api_watch(
        kubelet: CRIClient, proxy: ProxyProcess, kube: FakeKubeAPI, machine_cpus: str, tmp_path: Path) -> None:
    ALL = machine_cpus
    proxy.stop()
    proxy.extra_args = ("--watch-pods", "--kubeconfig", str(kube.write_kubeconfig(tmp_path / "kubeconfig")))
    await asyncio.to_thread(proxy.start)
    _, web = await start_pod(kubelet, "web", 200, qos="burstable")
    uid = f"uid-api-db-{time.monotonic_ns()}"
    cfg = kubelet.sandbox_config("db", uid, annotations={MODE: "exclusive"})
    sid = await kubelet.run_pod_sandbox(cfg)
    db = await kubelet.create_container(sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000), cfg)
    await kubelet.start_container(db)
    web_pid, db_pid = await pid_of(kubelet, web), await pid_of(kubelet, db)
    assert cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED)
    await kube.put(PODS_PATH, api_pod("db", uid, "exclusive"))
    await until(lambda: kube.watch_requests(PODS_PATH), "the proxy watches the node's pods")
    assert kube.list_requests(PODS_PATH)[0].query["fieldSelector"] == "spec.nodeName=lab"
    # kubectl annotate pod db qos.gocrane.io/cpu-manager=share --overwrite
    await kube.put(PODS_PATH, api_pod("db", uid, "share"))
    await until(lambda: cpus_of(web_pid) == (ALL, ALL), "web widened")
    assert cpus_of(db_pid) == (EXCL, EXCL)
    await kube.put(PODS_PATH, api_pod("db", uid, "none"))
    await until(lambda: cpus_of(db_pid) == (ALL, ALL), "db on the shared pool")
    # changed while the proxy is down: applied when it starts again
    proxy.kill()
    await kube.put(PODS_PATH, api_pod("db", uid, "exclusive"))
    await asyncio.to_thread(proxy.start)
    await until(lambda: cpus_of(db_pid) == (EXCL, EXCL) and cpus_of(web_pid) == (SHARED, SHARED),
                "the latest mode applied after the restart")
    assert proxy.state()["numapin"]["podModes"] == {uid: "exclusive"}
    # the annotation removed: kubelet's rule (Guaranteed, 1 CPU: exclusive); then back to none
    await kube.put(PODS_PATH, api_pod("db", uid, None))
    await until(lambda: proxy.state()["numapin"].get("podModes") == {uid: "kubelet"}, "kubelet's rule")
    assert cpus_of(db_pid) == (EXCL, EXCL)
    log = proxy.log.read_text()
    assert "mode change (api) pod=default/db -> share: changed" in log
