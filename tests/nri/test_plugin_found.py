"""Bugs of ``numapin nri`` found by the NRI churn and benchmark, reduced to kubelet's steps (expected to fail, strict,
until the fix lands in the door or the core; remove the marks then).

1. Found by the NRI churn (seed 20261152 of numapin_lab.cri.churn_nri, 30 operations, containerd 2.1), reduced to
kubelet's steps. After containerd restarts (the plugin's next Synchronize and the reconcile behind it), a pod
whose app container had exited before the restart is mishandled by ``numapin nri``:

- ``containerd-restart``: kubelet's attempt 1 of the exited app container is refused ("requested=1, available=0")
  although the CPU is the pod's own (attempt 0 and the init container held it; the proxy gives it back to attempt
  1 as kubelet's CPU manager does);
- ``plugin-killed-then-containerd-restart`` (attempt 0 was created while the plugin was down): attempt 1 is pinned,
  but when the pod is deleted (StopContainer, StopPodSandbox, RemoveContainer, RemovePodSandbox) its assignments
  are never released: /status and the state file keep them and the CPU is lost to every later pod.

Without the containerd restart (the plugin killed only) the same steps pass (checked once; not run in CI: the churn
covers it).

2. Found by benchmarks/nri.py: a growth after a shrink puts the pool's stale records back (the last test)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.nri_process import NriProcess
from tests.criproxy.test_e2e_containerd import SHARED, cpus_of, pid_of, start_pod
from tests.nri import test_plugin_containerd

pytestmark = pytest.mark.containerd

plugin = test_plugin_containerd.plugin  # numapin nri as a process, one per test


BUG = pytest.mark.xfail(strict=True, reason="numapin nri after a containerd restart: see the module's docstring")


@pytest.mark.parametrize("nri_lab", ["2.x"], indirect=True, ids=["containerd2.x"])
@pytest.mark.parametrize(("kill_plugin", "restart_containerd"), [
    pytest.param(True, True, id="plugin-killed-then-containerd-restart", marks=BUG),
    pytest.param(False, True, id="containerd-restart", marks=BUG)])
async def test_a_pod_with_an_exited_container_across_a_containerd_restart_keeps_and_releases_its_cpus(
        cri: CRIClient, plugin: NriProcess, nri_lab: ContainerdLab, kill_plugin: bool,
        restart_containerd: bool) -> None:
    uid = f"leak-{os.getpid()}-{time.monotonic_ns()}"
    cfg = cri.sandbox_config("leak", uid)
    sid = await cri.run_pod_sandbox(cfg)
    init = await cri.create_container(sid, cri.container_config("init", cpu_milli=1000, limit_milli=1000,
                                                                command=("true",)), cfg)
    await cri.start_container(init)
    if kill_plugin:
        plugin.kill()
    app0 = await cri.create_container(sid, cri.container_config("app", cpu_milli=1000, limit_milli=1000,
                                                                command=("sleep", "3600")), cfg)
    await cri.start_container(app0)
    if kill_plugin:
        await asyncio.to_thread(plugin.start)
    await cri.stop_container(app0, 0)   # it "crashed": kubelet creates attempt 1
    if restart_containerd:
        await asyncio.to_thread(nri_lab.stop_containerd)
        await asyncio.to_thread(nri_lab.start_containerd)
        await asyncio.to_thread(plugin.wait_synchronized, 2)
    async with CRIClient(nri_lab.socket) as k:
        app1 = await k.create_container(sid, k.container_config("app", cpu_milli=1000, limit_milli=1000,
                                                                command=("sleep", "3600"), attempt=1), cfg)
        await k.start_container(app1)
        pinned = (plugin.status() or {}).get("assignments", [])
        print("pinned after attempt 1:", pinned)
        for c in (init, app0, app1):
            await k.stop_container(c, 0)
        await k.stop_pod_sandbox(sid)
        for c in (init, app0, app1):
            await k.remove_container(c)
        await k.remove_pod_sandbox(sid)
    await asyncio.sleep(0.5)
    st = plugin.status() or {}
    assert st.get("assignments") == [], st.get("assignments")
    assert plugin.state().get("entries", {}) == {}


def kubelet_resources(milli: int) -> pb.LinuxContainerResources:
    """kubelet's UpdateContainerResources for a Guaranteed container of ``milli`` CPUs (no cpuset)."""
    return pb.LinuxContainerResources(cpu_period=100000, cpu_quota=milli * 100, cpu_shares=milli * 1024 // 1000,
                                      memory_limit_in_bytes=64 << 20, oom_score_adj=-997)


@pytest.mark.xfail(strict=True, reason="a stale record of the shared pool rides the next answer: see the test")
@pytest.mark.parametrize("nri_lab", ["2.x"], indirect=True, ids=["containerd2.x"])
async def test_a_growth_keeps_the_shared_containers_off_its_cpu_at_the_answer(cri: CRIClient,
                                                                            plugin: NriProcess) -> None:
    """Found by benchmarks/nri.py (resize part: shared containers on the resized container's new CPU at the answer,
    and the convergence repairing all of them a second later, resize after resize). A change of the pool writes the
    shared containers' cgroups directly and queues containerd's records of them (the pusher's RecordQueue, sent 1 s
    later); with NRI, "sent" means kept in the door's pending updates (``EventRecords``) until the next event's
    answer. The pusher's guard against a stale record landing after a newer kernel write (``RecordQueue.drop`` and
    ``quiesce`` in ``_write_kernel``) does not reach those pending updates: the next resize narrows the pool in the
    kernel, then answers with the previous widening's records, which containerd applies (runc update) before it
    answers kubelet. The CPU the resized container just took is back in every shared container's cpuset until the
    convergence pass (up to --converge-period); after a shrink, the shared containers stay narrowed as long."""
    webs = [await pid_of(cri, (await start_pod(cri, f"web{i}", 100, qos="burstable"))[1]) for i in range(2)]
    _, g = await start_pod(cri, "g", 500, 500)
    await cri.update_container_resources(g, kubelet_resources(1000))  # grow: the pool narrows
    await asyncio.sleep(2.5)   # the narrowing's records are queued, then kept for the next answer (1 s)
    await cri.update_container_resources(g, kubelet_resources(500))   # shrink: the pool widens
    await asyncio.sleep(2.5)   # the widening's records now wait for the next answer, and the convergence has run
    await cri.update_container_resources(g, kubelet_resources(1000))  # grow again
    # containerd applied the answer's updates for the other containers before answering (nri.md 5.3)
    assert [cpus_of(p) for p in webs] == [(SHARED, SHARED)] * len(webs)
