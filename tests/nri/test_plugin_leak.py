"""A bug the NRI churn found (seed 20261152 of numapin_lab.cri.churn_nri, 30 operations, containerd 2.1), reduced to
kubelet's steps. After containerd restarts (the plugin's next Synchronize and the reconcile behind it), a pod
whose app container had exited before the restart is mishandled by ``numapin nri``:

- ``containerd-restart``: kubelet's attempt 1 of the exited app container is refused ("requested=1, available=0")
  although the CPU is the pod's own (attempt 0 and the init container held it; the proxy gives it back to attempt
  1 as kubelet's CPU manager does);
- ``plugin-killed-then-containerd-restart`` (attempt 0 was created while the plugin was down): attempt 1 is pinned,
  but when the pod is deleted (StopContainer, StopPodSandbox, RemoveContainer, RemovePodSandbox) its assignments
  are never released: /status and the state file keep them and the CPU is lost to every later pod.

Without the containerd restart (``plugin-killed``) the same steps pass. The door and the core are the lead's: these
cases are expected to fail (strict) until the fix lands; remove the marks then."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.nri_process import NriProcess
from tests.nri import test_plugin_containerd

pytestmark = pytest.mark.containerd

plugin = test_plugin_containerd.plugin  # numapin nri as a process, one per test


BUG = pytest.mark.xfail(strict=True, reason="numapin nri after a containerd restart: see the module's docstring")


@pytest.mark.parametrize("nri_lab", ["2.x"], indirect=True, ids=["containerd2.x"])
@pytest.mark.parametrize(("kill_plugin", "restart_containerd"), [
    pytest.param(True, False, id="plugin-killed"),
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
