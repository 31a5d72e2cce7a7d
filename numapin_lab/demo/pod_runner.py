"""Run a v1 Pod object on a CRI runtime the way kubelet (``cpuManagerPolicy: none``, cgroupfs or systemd driver)
drives it:
``RunPodSandbox`` with the pod's metadata, labels and annotations (the webhook's CPU intent included) and a cgroup
parent named after its QoS class, then per app container ``CreateContainer`` (CPU request as ``cpu_shares``, limit
as CFS quota, no cpuset) and ``StartContainer``; deletion as kubelet does it (stop, stop sandbox, remove; the pod's
cgroup removed).

Used by ``numapin demo`` and the end-to-end tests against the proxy's socket. Every container runs busybox
``sleep``; init containers are not run (the demo's pods have none).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.pod import PodInfo
from allocator.quantity import cpu_milli
from numapin_lab.cri.client import CRIClient

__all__ = ["PodRunner", "RunningPod", "cgroup_parent", "systemd_cgroup_parent"]

QOS_DIR = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}


def cgroup_parent(root: str, qos: str, uid: str) -> str:
    """kubelet's cgroupfs pod cgroup under ``root``: ``/<root>/kubepods[/burstable|/besteffort]/pod<uid>``."""
    parts = [p for p in (root.strip("/"), "kubepods", QOS_DIR[qos], f"pod{uid}") if p]
    return "/" + "/".join(parts)


def systemd_cgroup_parent(qos: str, uid: str) -> str:
    """kubelet's pod cgroup under the systemd driver: the slice ``kubepods[-burstable|-besteffort]-pod<uid>.slice``
    (the uid's dashes as underscores: a dash in a slice's name is a level of the hierarchy), whose parents
    ``kubepods.slice`` and ``kubepods-<qos>.slice`` systemd derives from the name."""
    parts = [p for p in ("kubepods", QOS_DIR[qos], f"pod{uid.replace('-', '_')}") if p]
    return "-".join(parts) + ".slice"


@dataclass
class RunningPod:
    namespace: str
    name: str
    uid: str
    sandbox_id: str
    containers: dict[str, str] = field(default_factory=dict)  # container name -> id
    cgroup_parent: str = ""  # the pod's cgroup (removed with the sandbox)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _milli(resources: Mapping[str, Any], kind: str) -> int | None:
    value = (resources.get(kind) or {}).get("cpu")
    return None if value is None else cpu_milli(value)


class PodRunner:
    """``PodRunner(client, cgroup_root)``; ``await run(pod)`` -> RunningPod; ``await delete(running)``."""

    def __init__(self, client: CRIClient, cgroup_root: str, *, command: tuple[str, ...] = ("sleep", "86400"),
                 systemd: bool = False) -> None:
        self.client = client
        self.cgroup_root = cgroup_root  # cgroupfs only (the systemd driver's slices hang under the root)
        self.systemd = systemd
        self.command = command

    def sandbox_config(self, pod: Mapping[str, Any]) -> Any:
        info = PodInfo.from_pod(pod)
        meta = pod.get("metadata") or {}
        return self.client.sandbox_config(
            info.name, info.uid, namespace=info.namespace or "default",
            annotations=meta.get("annotations") or {}, labels=meta.get("labels") or {},
            cgroup_parent=systemd_cgroup_parent(info.qos_class, info.uid) if self.systemd
            else cgroup_parent(self.cgroup_root, info.qos_class, info.uid))

    async def run_sandbox(self, pod: Mapping[str, Any]) -> RunningPod:
        info = PodInfo.from_pod(pod)
        config = self.sandbox_config(pod)
        sid = await self.client.run_pod_sandbox(config)
        return RunningPod(info.namespace or "default", info.name, info.uid, sid,
                          cgroup_parent=config.linux.cgroup_parent)

    async def run_containers(self, pod: Mapping[str, Any], running: RunningPod) -> None:
        """Create and start every app container; a refused create raises ``grpc.aio.AioRpcError`` (the sandbox
        stays: delete it with ``delete``)."""
        sandbox = self.sandbox_config(pod)
        for c in (pod.get("spec") or {}).get("containers") or []:
            res = c.get("resources") or {}
            cfg = self.client.container_config(c["name"], cpu_milli=_milli(res, "requests") or _milli(res, "limits"),
                                               limit_milli=_milli(res, "limits"), command=self.command)
            cid = await self.client.create_container(running.sandbox_id, cfg, sandbox)
            running.containers[c["name"]] = cid
            await self.client.start_container(cid)

    async def run(self, pod: Mapping[str, Any]) -> RunningPod:
        running = await self.run_sandbox(pod)
        await self.run_containers(pod, running)
        return running

    async def pid_of(self, container_id: str) -> int:
        st = await self.client.container_status(container_id, verbose=True)
        return int(json.loads(st.info["info"])["pid"])

    async def delete(self, running: RunningPod) -> None:
        """What kubelet does when the pod is deleted: stop containers and sandbox, remove them and the pod's
        cgroup."""
        for cid in running.containers.values():
            await self.client.stop_container(cid, timeout=0)
        await self.client.stop_pod_sandbox(running.sandbox_id)
        for cid in running.containers.values():
            await self.client.remove_container(cid)
        await self.client.remove_pod_sandbox(running.sandbox_id, cgroup_parent=running.cgroup_parent)
        running.containers.clear()
