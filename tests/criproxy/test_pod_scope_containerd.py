"""Topology manager scope ``pod`` on real containerd + runc, read from the kernel: the pod is admitted once (at its
first container's create, as kubelet admits it); a later create (a restart with attempt+1) only looks its CPUs up.
A completed init container, removed by kubelet, is not allocated again when its sibling restarts (that refused the
restart on this 2-CPU machine), and while it all happens no running container's cpuset ever changes: the exclusive
app container stays on its CPU, the shared container beside stays off it.

Pods with pod-level resources (``spec.resources``) as kubelet 1.36 pins them, in the kernel: with the
``PodLevelResourceManagers`` gate off (kubelet's default) a Guaranteed one stays on the shared pool, while the same
containers without ``spec.resources`` are pinned; with ``--feature-gates PodLevelResourceManagers=true`` (topology
manager scope ``container``) its container Guaranteed on its own is pinned, one with a CPU limit alone is not."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from allocator.intent import INTENT_ANNOTATION, encode_intent
from allocator.pod import ContainerInfo, PodInfo
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab

from . import test_e2e_containerd as e2e
from .test_e2e_containerd import EXCL, SHARED, ProxyProcess, cpus_of, pid_of, start_pod

lab, machine_cpus = e2e.lab, e2e.machine_cpus  # the same containerd

pytestmark = pytest.mark.containerd

M = 1 << 20


@contextlib.asynccontextmanager
async def best_effort_proxy(lab: ContainerdLab, *extra: str) -> AsyncIterator[ProxyProcess]:
    """The proxy process under topology manager policy best-effort (and ``extra`` flags), containerd left empty."""
    d = Path(tempfile.mkdtemp(prefix="npx-ps-", dir="/tmp"))
    p = ProxyProcess(d, lab.socket, reserved_cpus=SHARED, extra_args=("--topology-manager-policy", "best-effort",
                                                                       *extra))
    await asyncio.to_thread(p.start)
    try:
        yield p
    finally:
        p.stop()
        async with CRIClient(lab.socket) as direct:  # leave containerd empty for the next test
            for sb in await direct.list_pod_sandbox():
                await direct.stop_pod_sandbox(sb.id)
                await direct.remove_pod_sandbox(sb.id)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def pod_scope_proxy(lab: ContainerdLab) -> AsyncIterator[ProxyProcess]:
    async with best_effort_proxy(lab, "--topology-manager-scope", "pod") as p:
        yield p


class Sampler:
    """Reads the kernel's cpusets of running containers (by pid) again and again; every distinct value seen."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.seen: dict[str, set[tuple[str, str]]] = {}
        self.samples = 0
        self._stop = asyncio.Event()

    def watch(self, label: str, pid: int) -> None:
        self.pids[label] = pid
        self.seen.setdefault(label, set())

    def drop(self, label: str) -> None:
        self.pids.pop(label, None)

    async def run(self) -> None:
        while not self._stop.is_set():
            for label, pid in list(self.pids.items()):
                try:
                    self.seen[label].add(cpus_of(pid))
                except (FileNotFoundError, ProcessLookupError):
                    continue  # the process ended between two reads
            self.samples += 1
            await asyncio.sleep(0.002)

    def stop(self) -> None:
        self._stop.set()


async def test_pod_scope_restart_after_the_init_container_went_moves_no_running_container(
        pod_scope_proxy: ProxyProcess, machine_cpus: str) -> None:
    proxy = pod_scope_proxy
    async with CRIClient(proxy.socket) as kubelet:
        _, web = await start_pod(kubelet, "web", 200, qos="burstable")
        web_pid = await pid_of(kubelet, web)
        sampler = Sampler()
        sampling = asyncio.create_task(sampler.run())
        try:
            pod = PodInfo(uid=f"uid-job-{time.monotonic_ns()}", namespace="default", name="job",
                          qos_class="Guaranteed", cpu_manager=None, bypass=False,
                          containers=(ContainerInfo("init", "init", 1000, 1000, M, M),
                                      ContainerInfo("main", "app", 1000, 1000, M, M)))
            cfg = kubelet.sandbox_config("job", pod.uid, annotations={INTENT_ANNOTATION: encode_intent(pod)})
            sid = await kubelet.run_pod_sandbox(cfg)
            init = await kubelet.create_container(
                sid, kubelet.container_config("init", cpu_milli=1000, limit_milli=1000, command=("true",)), cfg)
            # the pod is admitted with its first container: web is narrowed off CPU 1 before init runs there
            assert cpus_of(web_pid) == (SHARED, SHARED)
            sampler.watch("web", web_pid)
            await kubelet.start_container(init)  # runs on CPU 1 and exits 0
            for _ in range(600):
                if (await kubelet.container_status(init)).status.state == 2:  # CONTAINER_EXITED
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the init container did not exit")
            main = await kubelet.create_container(
                sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000), cfg)
            await kubelet.start_container(main)
            main_pid = await pid_of(kubelet, main)
            assert cpus_of(main_pid) == (EXCL, EXCL)  # the init container's CPU, reused
            sampler.watch("main attempt 0", main_pid)
            await kubelet.remove_container(init)  # kubelet's garbage collection of the completed init container
            # main crashes; kubelet creates it again (attempt+1): the pod is not admitted again
            sampler.drop("main attempt 0")  # (a process being killed leaves its cgroup: not a move)
            await kubelet.stop_container(main, timeout=0)
            again = await kubelet.create_container(
                sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000, attempt=1), cfg)
            await kubelet.start_container(again)
            again_pid = await pid_of(kubelet, again)
            sampler.watch("main attempt 1", again_pid)
            await kubelet.remove_container(main)
            for _ in range(3):  # a few convergence passes (1 s each) with everything running
                await asyncio.sleep(1.0)
        finally:
            sampler.stop()
            await sampling
        assert sampler.samples > 100
        # every running container had one cpuset all along, in the kernel: nobody was moved
        assert sampler.seen == {"web": {(SHARED, SHARED)}, "main attempt 0": {(EXCL, EXCL)},
                                "main attempt 1": {(EXCL, EXCL)}}
        state = proxy.state()
        assert set(state["entries"][pod.uid]) == {"main"}
        log = proxy.log.read_text()
        assert "UnexpectedAdmissionError" not in log and "converge (periodic): repaired" not in log


def pod_level_intent(uid: str, pod_level: bool, memory: bool = True) -> dict[str, str]:
    """The intent /mutate stamps on a Guaranteed pod with one 1-CPU container (with 64Mi of memory, or none), with
    or without ``spec.resources``."""
    res = {"cpu": "1", "memory": "64Mi"}
    own = res if memory else {"cpu": "1"}
    spec: dict = {"containers": [{"name": "main", "resources": {"requests": own, "limits": own}}]}
    if pod_level:
        spec["resources"] = {"requests": res, "limits": res}
    info = PodInfo.from_pod({"metadata": {"name": "p", "namespace": "default", "uid": uid}, "spec": spec})
    assert info.qos_class == "Guaranteed" and info.pod_level_resources is pod_level
    return {INTENT_ANNOTATION: encode_intent(info)}


async def start_intent_pod(kubelet: CRIClient, name: str, pod_level: bool, memory: bool = True) -> tuple[str, int]:
    uid = f"uid-{name}-{time.monotonic_ns()}"
    cfg = kubelet.sandbox_config(name, uid, annotations=pod_level_intent(uid, pod_level, memory))
    sid = await kubelet.run_pod_sandbox(cfg)
    cid = await kubelet.create_container(sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000),
                                         cfg)
    await kubelet.start_container(cid)
    return uid, await pid_of(kubelet, cid)


async def test_pod_level_resources_leave_a_guaranteed_pod_shared_as_kubelet_1_36_does(
        pod_scope_proxy: ProxyProcess, machine_cpus: str) -> None:
    async with CRIClient(pod_scope_proxy.socket) as kubelet:
        _, level_pid = await start_intent_pod(kubelet, "level", True)
        assert cpus_of(level_pid) == (machine_cpus, machine_cpus)  # kubelet: no CPUs of its own, the shared pool
        plain, plain_pid = await start_intent_pod(kubelet, "plain", False)
        assert cpus_of(plain_pid) == (EXCL, EXCL)  # the same container without spec.resources: pinned
        assert cpus_of(level_pid) == (SHARED, SHARED)  # and the pod-level one narrowed off its CPU, as shared
        assert set(pod_scope_proxy.state()["entries"]) == {plain}


@pytest.fixture
async def gated_proxy(lab: ContainerdLab) -> AsyncIterator[ProxyProcess]:
    """The proxy with kubelet 1.36's alpha gate, topology manager scope container."""
    async with best_effort_proxy(lab, "--feature-gates", "PodLevelResourceManagers=true") as p:
        yield p


async def test_pod_level_resource_managers_pin_a_container_guaranteed_on_its_own(
        gated_proxy: ProxyProcess, machine_cpus: str) -> None:
    async with CRIClient(gated_proxy.socket) as kubelet:
        _, cpu_only_pid = await start_intent_pod(kubelet, "cpu-only", True, memory=False)
        assert cpus_of(cpu_only_pid) == (machine_cpus, machine_cpus)  # no memory of its own: not eligible, shared
        level, level_pid = await start_intent_pod(kubelet, "level", True)
        assert cpus_of(level_pid) == (EXCL, EXCL)  # Guaranteed on its own: pinned, as kubelet 1.36 with the gate
        assert cpus_of(cpu_only_pid) == (SHARED, SHARED)
        assert set(gated_proxy.state()["entries"]) == {level}
    assert "feature gates PodLevelResourceManagers=true" in gated_proxy.log.read_text()
