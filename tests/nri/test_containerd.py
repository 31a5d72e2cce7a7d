"""The plugin against REAL containerd 1.7.24 and 2.1.9 (Debian's, NRI on in the lab's own socket), judged from the
kernel: registration and Synchronize (a pod that already exists is in it), a CreateContainer adjustment, an update
of another container in a CreateContainer response, kubelet's UpdateContainerResources (no cpuset, a quota) answered
with the target's cpuset, a refusal failing the CRI call with the plugin's message, StopContainer and
RemoveContainer arriving, an unsolicited UpdateContainers, and a containerd restart answered by a new registration
and a fresh Synchronize. One containerd per version for the session; this machine has CPUs 0-1."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
import pytest

from nriplugin import Backoff, Code, Event, NriPlugin, PluginConfig, PluginError
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.kernel_truth import KernelTruth
from protos import nri_pb2
from tests.nri.recorder import Recorder

pytestmark = pytest.mark.containerd

def _cpus(cpus: str, mems: str = "") -> nri_pb2.LinuxResources:
    return nri_pb2.LinuxResources(cpu=nri_pb2.LinuxCPU(cpus=cpus, mems=mems))


def _update(cid: str, cpus: str) -> nri_pb2.ContainerUpdate:
    return nri_pb2.ContainerUpdate(container_id=cid, linux=nri_pb2.LinuxContainerUpdate(resources=_cpus(cpus)))


async def _kernel(truth: KernelTruth, cid: str) -> tuple[str, str]:
    """(cpus, mems) the kernel gives container ``cid`` (its cgroup and every process agree, or the test fails)."""
    running = {c.id: c for c in await truth.running() or []}
    assert cid in running, f"container {cid} is not running"
    exact = running[cid].exactly()
    assert exact is not None, running[cid].describe()
    return str(exact[0]), str(exact[1])


def _cfs_quota(pid: int) -> int:
    """The CFS quota of ``pid``'s cgroup (v1 ``cpu`` controller, v2 ``cpu.max``)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if "cpu" in ctrls.split(","):
            return int(Path(f"/sys/fs/cgroup/{ctrls}{path}/cpu.cfs_quota_us").read_text())
        if ctrls == "":
            quota = Path(f"/sys/fs/cgroup{path}/cpu.max").read_text().split()[0]
            return -1 if quota == "max" else int(quota)
    raise AssertionError(f"no cpu cgroup for pid {pid}")


async def test_pinning_through_nri_judged_from_the_kernel(nri_lab: ContainerdLab, cri: CRIClient) -> None:
    rec = Recorder()
    rec.events = frozenset(Event)  # type: ignore[misc]
    sb_config = cri.sandbox_config("nri-pod", "nri-uid-1")
    pod = await cri.run_pod_sandbox(sb_config)  # before the plugin: it must come in Synchronize
    plugin = NriPlugin(PluginConfig(nri_lab.nri_socket, name="numapin-test", index="50",
                                    backoff=Backoff(initial=0.05, cap=0.5)), rec)
    task = asyncio.create_task(plugin.run())
    truth = KernelTruth(nri_lab.socket)
    try:
        await asyncio.wait_for(plugin.wait_synchronized(), 30)
        sync = await rec.wait_for("Synchronize")
        assert pod in [p.id for p in sync.pods]
        runtime = rec.connected[0]
        assert runtime.name == "containerd" and runtime.version.startswith(nri_lab.version.split("~")[0][:3])
        assert runtime.request_timeout == 2.0

        # CreateContainer: the adjustment is the container's cpuset from its first instruction
        first: dict[str, Any] = {}

        async def create(ctx: Any, request: Any) -> Any:
            name = request.container.name
            if name == "refused":
                raise PluginError(Code.RESOURCE_EXHAUSTED, "numapin test: no CPUs left for refused")
            adjust = nri_pb2.ContainerAdjustment(linux=nri_pb2.LinuxContainerAdjustment(
                resources=_cpus("1" if name == "second" else "0", "0")))
            if name == "first":  # an answer over Go's 4096-byte read buffer: sent as header, then whole payload
                adjust.annotations["numapin.test/padding"] = "x" * 100_000
            others = [_update(first["id"], "0")] if name == "second" else []
            return nri_pb2.CreateContainerResponse(adjust=adjust, update=others)

        rec.answers["CreateContainer"] = create
        a = await cri.create_container(pod, cri.container_config("first", cpu_milli=1000), sb_config)
        first["id"] = a
        await cri.start_container(a)
        assert await _kernel(truth, a) == ("0", "0")
        status = await cri.container_status(a, verbose=True)
        assert "numapin.test/padding" in status.info.get("info", "")  # the big answer arrived whole
        created = await rec.wait_for("CreateContainer", lambda r: r.container.name == "first")
        assert created.pod.id == pod and created.container.linux.resources.cpu.cpus == ""

        # an update of ANOTHER container in a CreateContainer response is applied before the new one runs
        b = await cri.create_container(pod, cri.container_config("second", cpu_milli=1000), sb_config)
        await cri.start_container(b)
        assert await _kernel(truth, a) == ("0", "0")
        assert await _kernel(truth, b) == ("1", "0")

        # kubelet's UpdateContainerResources (no cpuset, a quota), answered with the target's own cpuset
        async def update(ctx: Any, request: Any) -> Any:
            return nri_pb2.UpdateContainerResponse(update=[_update(request.container.id, "1")])

        rec.answers["UpdateContainer"] = update
        await cri.update_container_resources(a, pb.LinuxContainerResources(cpu_period=100000, cpu_quota=150000,
                                                                           cpu_shares=1024))
        asked = await rec.wait_for("UpdateContainer")
        assert asked.linux_resources.cpu.cpus == "" and asked.linux_resources.cpu.quota.value == 150000
        assert asked.container.linux.resources.cpu.cpus == "0"  # the spec as the earlier update left it
        assert await _kernel(truth, a) == ("1", "0")
        truths = {c.id: c for c in await truth.running() or []}
        assert _cfs_quota(truths[a].pid) == 150000  # kubelet's quota applied with our cpuset

        # a refusal fails the CRI call with the plugin's message
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await cri.create_container(pod, cri.container_config("refused"), sb_config)
        assert "numapin test: no CPUs left for refused" in (refused.value.details() or "")

        # StopContainer and RemoveContainer arrive
        await cri.stop_container(b)
        await rec.wait_for("StopContainer", lambda r: r.container.id == b)
        await cri.remove_container(b)
        await rec.wait_for(Event.REMOVE_CONTAINER.name, lambda r: r.container.id == b)

        # an unsolicited update, while no event is in flight (containerd#13733)
        assert await plugin.update_containers([_update(a, "0")]) == []
        assert await _kernel(truth, a) == ("0", "0")

        # containerd restarted: the socket goes and comes back; a brand-new registration and a fresh Synchronize
        await asyncio.to_thread(nri_lab.stop_containerd)
        await asyncio.to_thread(nri_lab.start_containerd)
        await asyncio.wait_for(plugin.wait_synchronized(2), 60)
        syncs = [r for n, r in rec.calls if n == "Synchronize"]
        again = {c.id: c for c in syncs[-1].containers}
        assert len(syncs) == 2 and pod in [p.id for p in syncs[-1].pods]
        assert again[a].linux.resources.cpu.cpus == "0" and b not in again
        assert len(rec.connected) == 2 and len(rec.disconnected) == 1
        assert await _kernel(truth, a) == ("0", "0")
    finally:
        await truth.close()
        await plugin.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
    assert task.exception() is None
