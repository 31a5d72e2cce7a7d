"""``numapin status`` against the proxy (in process, its real /status endpoint) in front of the in-process CRI
runtime on a 2-NUMA-node sysfs tree, and from the proxy's files alone; bad input."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from allocator.intent import INTENT_ANNOTATION, encode_intent
from allocator.pod import ContainerInfo, PodInfo
from criproxy.app import CriProxy
from criproxy.config import load_config
from numapin.cli import main
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy.conftest import make_sysfs


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = scratch_dir("npst-")  # short: unix socket paths
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def runtime(tmp: Path) -> AsyncIterator[MemoryRuntime]:
    rt = await MemoryRuntime(str(tmp / "rt.sock")).start()
    yield rt
    await rt.stop()


@pytest.fixture
async def proxy(tmp: Path, runtime: MemoryRuntime) -> AsyncIterator[CriProxy]:
    sysfs = make_sysfs(tmp / "sys", {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, {0: [10, 20], 1: [20, 10]})
    cfg = load_config(None, {"listen": str(tmp / "proxy.sock"), "runtime_endpoint": runtime.socket_path,
                             "state_dir": str(tmp / "state"), "sysfs": str(sysfs), "reserved_cpus": "0",
                             "metrics_address": "127.0.0.1:0", "node_name": "node-a",
                             "topology_manager_policy": "single-numa-node"})
    p = await CriProxy(cfg).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    yield p
    await p.stop()


async def run_pod(k: CRIClient, name: str, cpu_milli: int, mode: str | None = None) -> str:
    guaranteed = cpu_milli >= 1000
    info = PodInfo(uid=f"uid-{name}", namespace="default", name=name,
                   qos_class="Guaranteed" if guaranteed else "Burstable", cpu_manager=mode, bypass=False,
                   containers=(ContainerInfo("app", "app", cpu_milli, cpu_milli if guaranteed else None, None, None),))
    ann = {INTENT_ANNOTATION: encode_intent(info)} | ({"qos.gocrane.io/cpu-manager": mode} if mode else {})
    cfg = k.sandbox_config(name, info.uid, annotations=ann, qos="guaranteed" if guaranteed else "burstable")
    sid = await k.run_pod_sandbox(cfg)
    cid = await k.create_container(sid, k.container_config("app", cpu_milli=cpu_milli,
                                                           limit_milli=cpu_milli if guaranteed else None), cfg)
    await k.start_container(cid)
    return cid


async def status(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = await asyncio.to_thread(main, ["status", *args])
    return code, capsys.readouterr().out


async def test_live_status_marks_pins_and_finds_drift(proxy: CriProxy, runtime: MemoryRuntime, tmp: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    async with CRIClient(str(tmp / "proxy.sock")) as k:
        web = await run_pod(k, "web", 250)
        await run_pod(k, "db", 2000, "exclusive")
        await run_pod(k, "cache", 1000, "share")
    url = f"http://127.0.0.1:{proxy.metrics_port}/status"
    code, out = await status("--status-url", url, "--runtime-endpoint", runtime.socket_path, capsys=capsys)
    assert code == 0, out
    assert "topology manager: policy single-numa-node, scope container; reserved CPUs 0" in out
    assert "* = reserved" in out and "default/db app (exclusive)" in out and "default/cache app (share)" in out
    assert "[0*] [1B] [2B] [3A]" in out and "[4.] [5.] [6.] [7.]" in out and "shared pool: CPUs 0,3-7" in out
    assert "running containers checked against their real cpuset: 3, 0 disagree" in out
    code, out = await status("--status-url", url, "--runtime-endpoint", runtime.socket_path, "--format", "json",
                             capsys=capsys)
    doc = json.loads(out)
    pinned = {p["pod"]: p for p in doc["pinned"]}
    assert pinned["default/db"]["mode"] == "exclusive" and len(pinned["default/db"]["cpus"].split("-")) == 2
    assert pinned["default/cache"]["mode"] == "share"
    assert doc["reservedCPUs"] == "0" and sum(doc["freeCPUsPerNUMA"].values()) == 7 - 3
    # a container whose cpuset changed behind the proxy's back
    async with CRIClient(runtime.socket_path) as direct:
        await direct.update_container_resources(web, pb.LinuxContainerResources(cpuset_cpus="0-7"))
    code, out = await status("--status-url", url, "--runtime-endpoint", runtime.socket_path, "--format", "json",
                             capsys=capsys)
    assert code == 1
    assert [(d["pod"], d["actual"]) for d in json.loads(out)["disagreements"]] == [("default/web", "0-7")]
    # the same from the proxy's files (the proxy may be down): state checkpoint + published NodeResourceTopology
    code, out = await status("--state-dir", str(tmp / "state"), "--sysfs", str(tmp / "sys"), "--reserved-cpus", "0",
                             "--runtime-endpoint", runtime.socket_path, capsys=capsys)
    assert code == 1
    assert "DISAGREES default/web app (shared)" in out and "default/db app: exclusive" in out
    assert "topology manager: policy single-numa-node" in out


async def test_files_only_and_runtime_down(proxy: CriProxy, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async with CRIClient(str(tmp / "proxy.sock")) as k:
        await run_pod(k, "db", 1000)
    code, out = await status("--state-dir", str(tmp / "state"), "--sysfs", str(tmp / "sys"), "--no-runtime",
                             capsys=capsys)
    assert code == 0 and "pinned containers:\n  uid-db app: exclusive" in out
    # the reserved CPUs, the node and the policy come from the published NodeResourceTopology
    assert "node node-a (from state files" in out and "policy single-numa-node, scope container; reserved CPUs 0" in out
    await proxy.stop()  # the node's proxy is down from here: it would publish its NRT again over the edits below
    [published] = (tmp / "state" / "nrt").glob("*.json")
    published.write_text(published.read_text()[:40])  # cut short by a crash of its writer
    code, out = await status("--state-dir", str(tmp / "state"), "--sysfs", str(tmp / "sys"), "--no-runtime",
                             capsys=capsys)
    assert code == 0 and f"note: {published}: cannot read the NodeResourceTopology" in out
    assert "reserved CPUs unknown" in out
    published.write_text(json.dumps({"kind": "NodeResourceTopology", "apiVersion": "topology.node.k8s.io/v1alpha2",
                                     "metadata": {"name": "node-a"}, "zones": [{"name": "node-0", "type": "Node",
                                                                                "resources": "lots"}]}))
    code, out = await status("--state-dir", str(tmp / "state"), "--sysfs", str(tmp / "sys"), "--no-runtime",
                             capsys=capsys)
    assert code == 0 and "zones[0].resources: must be a list" in out
    code, out = await status("--state-dir", str(tmp / "state"), "--sysfs", str(tmp / "sys"),
                             "--runtime-endpoint", f"unix://{tmp}/nothing.sock", capsys=capsys)
    assert code == 3 and "not reachable" in out
    code = await asyncio.to_thread(main, ["status", "--state-dir", str(tmp / "state"), "--sysfs", str(tmp / "sys"),
                                          "--runtime-endpoint", "tcp://somewhere:1"])
    assert code == 2 and "--runtime-endpoint" in capsys.readouterr().err


def test_bad_input_exits_2(tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--reserved-cpus", "x-y", "--no-runtime"]) == 2
    assert "--reserved-cpus" in capsys.readouterr().err
    assert main(["status", "--state-dir", str(tmp), "--no-runtime"]) == 2
    assert "no state file" in capsys.readouterr().err
    (tmp / "cpu_manager_state").write_text("{not json")
    assert main(["status", "--state-dir", str(tmp), "--no-runtime"]) == 2
    assert "cpu_manager_state" in capsys.readouterr().err
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["status", "--status-url", f"http://127.0.0.1:{port}/status", "--no-runtime"]) == 2
    assert "cannot reach" in capsys.readouterr().err


async def test_a_tenants_bypass_annotation_hides_nothing_from_a_live_status(
        proxy: CriProxy, runtime: MemoryRuntime, tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 25: the proxy ignores numapin.io/bypass outside its --bypass-namespaces, so `numapin status` checks such
    a pod like any other (it learns from the proxy which containers it really leaves alone)."""
    async with CRIClient(str(tmp / "proxy.sock")) as k:
        await run_pod(k, "db", 2000, "exclusive")
        cfg = k.sandbox_config("tool", "uid-tool", qos="burstable", annotations={"numapin.io/bypass": "true"})
        sid = await k.run_pod_sandbox(cfg)
        tool = await k.create_container(sid, k.container_config("app", cpu_milli=200), cfg)
        await k.start_container(tool)
    async with CRIClient(runtime.socket_path) as direct:  # onto db's CPUs behind the proxy's back
        await direct.update_container_resources(tool, pb.LinuxContainerResources(cpuset_cpus="0-7"))
    url = f"http://127.0.0.1:{proxy.metrics_port}/status"
    code, out = await status("--status-url", url, "--runtime-endpoint", runtime.socket_path, "--format", "json",
                             capsys=capsys)
    assert code == 1
    assert [(d["pod"], d["actual"]) for d in json.loads(out)["disagreements"]] == [("default/tool", "0-7")]
