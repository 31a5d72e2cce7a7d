"""Two faults of ``numapin nri`` the NRI churn and benchmark found, reduced to kubelet's steps (both fixed; these
keep them fixed).

1. containerd keeps which pods and containers it told plugins of in memory only. After it restarts, a pod that
existed before is stopped and removed with no NRI event (StopPodSandbox, RemovePodSandbox, and RemoveContainer of an
exited container are skipped), so its CPUs stayed assigned for good. The plugin now reconciles with containerd's
lists periodically (``--reconcile-period``, 10 s by default for the NRI plugin; 1 s here), which releases them.

2. A growth after a shrink put the pool's stale records back: the pusher's records of a widening, kept for the next
answer, were answered as they were made, after the pool had narrowed again in the kernel, and containerd applied them
before answering kubelet. The door now answers each kept update with the container's cpuset as numapin last put it."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.nri_process import NriProcess
from tests.criproxy.test_e2e_containerd import SHARED, cpus_of, pid_of, start_pod
from tests.nri.plugin_process import plugin_process

pytestmark = pytest.mark.containerd



@pytest.fixture
async def plugin(nri_lab: ContainerdLab) -> AsyncIterator[NriProcess]:
    """numapin nri as a process, one per test, reconciling with containerd's lists every second (10 s by default)."""
    async with plugin_process(nri_lab, "--reconcile-period", "1") as p:
        yield p


@pytest.mark.parametrize("nri_lab", ["2.x"], indirect=True, ids=["containerd2.x"])
@pytest.mark.parametrize(("kill_plugin", "restart_containerd"), [
    pytest.param(True, True, id="plugin-killed-then-containerd-restart"),
    pytest.param(False, True, id="containerd-restart")])
async def test_a_pod_with_an_exited_container_across_a_containerd_restart_keeps_and_releases_its_cpus(
        cri: CRIClient, plugin: NriProcess, nri_lab: ContainerdLab, kill_plugin: bool,
        restart_containerd: bool) -> None:
    uid = f"leak-{os.getpid()}-{time.monotonic_ns()}"
    cfg = cri.sandbox_config("leak", uid)
    sid = await cri.run_pod_sandbox(cfg)
    init = await cri.create_container(sid, cri.container_config("init", cpu_milli=1000, limit_milli=1000,
                                                                command=("true",)), cfg)
    await cri.start_container(init)
    await _exited(cri, init)  # kubelet creates the app container once it has seen the init container exit
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
    # containerd, restarted, sends no NRI event for a pod it had before: the periodic reconcile releases it (the
    # state file is written just after /status shows the release: both are waited for)
    deadline = time.monotonic() + 15
    while ((plugin.status() or {}).get("assignments") or plugin.state().get("entries")) \
            and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    st = plugin.status() or {}
    assert st.get("assignments") == [], st.get("assignments")
    assert plugin.state().get("entries", {}) == {}


async def _exited(cri: CRIClient, cid: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (await cri.container_status(cid)).status.state != pb.CONTAINER_EXITED:
        assert time.monotonic() < deadline, f"container {cid} did not exit within {timeout:g} s"
        await asyncio.sleep(0.05)


def kubelet_resources(milli: int) -> pb.LinuxContainerResources:
    """kubelet's UpdateContainerResources for a Guaranteed container of ``milli`` CPUs (no cpuset)."""
    return pb.LinuxContainerResources(cpu_period=100000, cpu_quota=milli * 100, cpu_shares=milli * 1024 // 1000,
                                      memory_limit_in_bytes=64 << 20, oom_score_adj=-997)


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
