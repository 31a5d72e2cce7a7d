"""The whole stack for the end-to-end tests: a private containerd, ``numapin criproxy`` and ``numapin webhook`` as
real processes (numapin_lab.demo.stack), driven like a cluster: pods through the webhook over HTTPS, then through the
proxy as kubelet drives them. These tests FAIL (never skip) when containerd, runc or busybox-static is missing."""

from __future__ import annotations

import asyncio
import copy
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from numapin.cri_view import list_runtime_containers
from numapin.node_status import NodeStatus, check_runtime, fetch_proxy_status, from_proxy_status
from numapin.proc_cpus import process_cpus
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.demo.admission import AdmissionAnswer, AdmissionClient
from numapin_lab.demo.play import make_pod, webhook_sees_published
from numapin_lab.demo.pod_runner import PodRunner, RunningPod
from numapin_lab.demo.stack import SERVER_NAME, LocalStack, StackOptions

__all__ = ["Cluster", "make_pod"]

NODE = "e2e-node"


@pytest.fixture(scope="module")
def machine() -> Topology:
    topo = Topology.from_sysfs("/sys")
    assert topo.num_cpus >= 2, "the end-to-end tests need at least 2 CPUs"
    return topo


@pytest.fixture(scope="module")
def stack(machine: Topology) -> Iterator[LocalStack]:
    d = scratch_dir("npe2e-")
    s = LocalStack(StackOptions(workdir=d / "w", node_name=NODE, reserved_cpus="0"))
    try:
        s.start()
        yield s
    finally:
        left = s.stop()
        shutil.rmtree(d, ignore_errors=True)
    assert left == [], left


class Cluster:
    """What the API server, the scheduler and kubelet do with a pod, against the running stack."""

    def __init__(self, stack: LocalStack, api: AdmissionClient, kubelet: CRIClient) -> None:
        self.stack = stack
        self.api = api
        self.kubelet = kubelet
        self.runner = PodRunner(kubelet, stack.cgroup_root)
        self.pods: dict[str, RunningPod] = {}

    async def create(self, pod: dict[str, Any]) -> tuple[dict[str, Any], AdmissionAnswer]:
        """pods CREATE: /mutate, patch applied, uid given, /validate."""
        mutated, m = await self.api.mutate(pod)
        assert m.allowed, m
        mutated = copy.deepcopy(mutated)
        mutated["metadata"]["uid"] = str(uuid.uuid4())
        v = await self.api.validate(mutated)
        if v.allowed:  # the API server stores it: where the webhook reads the pods of bindings
            self.stack.store_pod(mutated)
        return mutated, v

    async def fits_now(self, pod: dict[str, Any]) -> bool:
        """Whether the pod fits the node by the topology the proxy last published, once the webhook (which polls the
        published file) agrees: bindings are then judged on that topology, as the scheduler's next attempt is."""
        fits = await webhook_sees_published(self.api, pod, self.stack.nrt_file)
        assert fits is not None, "the webhook did not read the proxy's published topology within 15 s"
        return fits

    async def fits_once_published(self, pod: dict[str, Any], timeout: float = 30.0) -> bool:
        """Whether the pod fits once the proxy has published what a removal freed: the proxy writes its topology in
        the background after the removal's answer, so the first look may still see the pod that was removed."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not await self.fits_now(pod):
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.1)
        return True

    async def bind(self, pod: dict[str, Any]) -> AdmissionAnswer:
        """The scheduler's binding to the node."""
        meta = pod["metadata"]
        return await self.api.bind(meta["namespace"], meta["name"], NODE, pod_uid=meta["uid"])

    async def schedule_and_run(self, pod: dict[str, Any]) -> RunningPod:
        mutated, v = await self.create(pod)
        assert v.allowed, v.message
        assert await self.fits_now(mutated)
        b = await self.bind(mutated)
        assert b.allowed, b.message
        running = await self.runner.run(mutated)
        self.pods[running.name] = running
        return running

    async def delete(self, name: str) -> None:
        await self.runner.delete(self.pods.pop(name))

    async def cpus(self, name: str, container: str = "app") -> CPUSet:
        """The real Cpus_allowed_list of a pod's container process (its pid asked of containerd directly)."""
        async with CRIClient(self.stack.lab.socket) as direct:
            pid = await PodRunner(direct, "").pid_of(self.pods[name].containers[container])
        return process_cpus(pid).cpus

    async def status(self) -> NodeStatus:
        """numapin status's model: the proxy's /status, containers checked against containerd."""
        s = from_proxy_status(await asyncio.to_thread(fetch_proxy_status, self.stack.status_url), "test")
        check_runtime(s, await list_runtime_containers(f"unix://{self.stack.lab.socket}"))
        return s


@pytest.fixture
async def cluster(stack: LocalStack) -> AsyncIterator[Cluster]:
    # A fresh webhook per test: it remembers the pinned pods whose bindings it allowed until it judges a binding on
    # a different published free-CPU state, and a test ends on the state it started from.
    assert stack.webhook is not None
    stack.webhook.stop()
    stack.start_webhook()
    async with AdmissionClient(stack.webhook_url, stack.ca_file, SERVER_NAME) as api, \
            CRIClient(stack.proxy_socket) as kubelet:
        for _ in range(100):
            if (await api.get("/readyz"))[0] == 200:
                break
            await asyncio.sleep(0.1)
        c = Cluster(stack, api, kubelet)
        try:
            yield c
        finally:
            for name in list(c.pods):
                await c.delete(name)
    async with CRIClient(stack.proxy_socket) as k:  # whatever a failed test left: through the proxy, as kubelet
        for sb in await k.list_pod_sandbox():
            await k.stop_pod_sandbox(sb.id)
            await k.remove_pod_sandbox(sb.id)
