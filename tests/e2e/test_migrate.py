"""docs/migrate.md played against a real containerd: a node whose kubelet ran the static CPU manager policy (its
pods already pinned, its ``cpu_manager_state`` on disk) moves to numapin without a drain. The proxy and status
commands are the guide's own, with the node's paths pointed at a scratch directory."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.checkpoint import serialize_checkpoint
from allocator.cpuset import CPUSet
from allocator.state import CPUState
from allocator.topology import Topology
from numapin.proc_cpus import process_cpus
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.demo.pod_runner import PodRunner, RunningPod, cgroup_parent
from numapin_lab.demo.stack import ManagedProcess, cgroup_mounts

pytestmark = pytest.mark.containerd

ROOT = Path(__file__).resolve().parents[2]


def guide_command(prefix: str) -> list[str]:
    """The first command of docs/migrate.md that starts with ``prefix``."""
    for line in (ROOT / "docs/migrate.md").read_text().splitlines():
        if line.strip().startswith(prefix):
            return shlex.split(line.strip())
    raise AssertionError(f"docs/migrate.md has no `{prefix}` command")


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = scratch_dir("npmig-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def kubelet_static_pod(c: CRIClient, root: str, name: str, uid: str, cpus: str, qos: str) -> RunningPod:
    """A pod as kubelet's static policy ran it: straight on containerd, its cpuset set by kubelet."""
    cfg = c.sandbox_config(name, uid, cgroup_parent=cgroup_parent(root, qos, uid))
    sid = await c.run_pod_sandbox(cfg)
    cid = await c.create_container(sid, c.container_config("app", cpu_milli=1000 if qos == "Guaranteed" else 100,
                                                           limit_milli=1000 if qos == "Guaranteed" else None,
                                                           cpuset_cpus=cpus), cfg)
    await c.start_container(cid)
    return RunningPod("default", name, uid, sid, {"app": cid})


def test_moving_from_kubelet_static_policy_without_a_drain(scratch: Path) -> None:
    machine = Topology.from_sysfs("/sys")
    everything = machine.all_cpus
    pinned = CPUSet([everything.max()])
    root = f"numapin-{scratch.name}"
    lab = ContainerdLab(scratch / "ctrd")
    proxy_sock, state_dir, kubelet_dir = scratch / "proxy.sock", scratch / "state", scratch / "kubelet"
    kubelet_dir.mkdir()
    paths = {"/var/run/numapin/criproxy.sock": str(proxy_sock), "/var/lib/numapin": str(state_dir),
             "/var/lib/kubelet/cpu_manager_state": str(kubelet_dir / "cpu_manager_state")}

    def on_node(argv: list[str]) -> list[str]:
        out = [paths.get(a, a) for a in argv]
        return [f"unix://{lab.socket}" if a == "unix:///run/containerd/containerd.sock" else a for a in out]

    args = [*on_node(guide_command("numapin criproxy"))[1:], "--metrics-address", "127.0.0.1:0", "--node-name", "mig"]
    proxy = ManagedProcess("numapin criproxy", args, scratch / "proxy.log")
    try:
        lab.start()

        async def before() -> tuple[RunningPod, RunningPod]:
            async with CRIClient(lab.socket) as c:
                web = await kubelet_static_pod(c, root, "web", "uid-web", str(everything - pinned), "Burstable")
                db = await kubelet_static_pod(c, root, "db", "uid-db", str(pinned), "Guaranteed")
                return web, db

        web, db = asyncio.run(before())
        state = CPUState(default_cpuset=everything - pinned, assignments={"uid-db": {"app": pinned}})
        doc = json.loads(serialize_checkpoint(state, "static"))
        doc.pop("numapin")  # kubelet's own file has no numapin field
        (kubelet_dir / "cpu_manager_state").write_text(json.dumps(doc))

        async def pids() -> dict[str, int]:
            async with CRIClient(lab.socket) as c:
                r = PodRunner(c, root)
                return {p.name: await r.pid_of(p.containers["app"]) for p in (web, db)}

        before_pids = asyncio.run(pids())
        # step 2: the proxy imports kubelet's checkpoint and adopts the running containers
        proxy.start()
        proxy.wait_for(r"imported kubelet's CPU manager state from ")
        proxy.wait_for(r"reconcile: .*adopted 2")
        # step 3: numapin status, as the guide runs it: same pins, nothing disagrees
        status = subprocess.run([sys.executable, "-m", *on_node(guide_command("numapin status"))], cwd=ROOT,
                                capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": ""})
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"default/db app: exclusive, CPUs {pinned}" in status.stdout and "0 disagree" in status.stdout
        assert asyncio.run(pids()) == before_pids  # nothing restarted
        assert process_cpus(before_pids["db"]).cpus == pinned
        assert process_cpus(before_pids["web"]).cpus == everything - pinned

        # step 4: kubelet now talks to the proxy. The imported pin holds: a new exclusive pod does not get CPU
        async def after() -> None:
            async with CRIClient(str(proxy_sock)) as k:
                r = PodRunner(k, root)
                limits = {"cpu": "1", "memory": "32Mi"}
                new = {"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": "db2", "namespace": "default", "uid": "uid-db2"},
                       "spec": {"containers": [{"name": "app", "resources": {"limits": limits}}]}}
                if len(everything) == 2:
                    running = await r.run_sandbox(new)
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await r.run_containers(new, running)
                    assert err.value.code() in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                                grpc.StatusCode.FAILED_PRECONDITION)
                    await r.delete(running)
                await r.delete(db)  # the migrated pod ends: its CPU goes back to the shared pool
                assert process_cpus(before_pids["web"]).cpus == everything
                running = await r.run(new)
                assert process_cpus(await r.pid_of(running.containers["app"])).cpus == pinned
                assert process_cpus(before_pids["web"]).cpus == everything - pinned
                await r.delete(running)
                await r.delete(web)

        asyncio.run(after())
        # a restart never imports again, even with kubelet's file still there
        proxy.stop()
        proxy.start()
        proxy.wait_for(r"reconcile: ", after=len(proxy.text()) - 200)
        assert len(re.findall("imported kubelet's CPU manager state", proxy.text())) == 1
    finally:
        proxy.stop()
        lab.stop()
        for m in cgroup_mounts():
            d = m / root
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                sub.rmdir()
            if d.exists():
                d.rmdir()
    assert lab.leftovers() == []
    assert not any((m / root).exists() for m in cgroup_mounts())
