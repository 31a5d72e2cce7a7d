"""Inside the VM: one private containerd for the whole boot, ``numapin criproxy`` (a real process) restarted in
front of it for each configuration, pods run through the proxy as kubelet drives them (the webhook's /mutate
stamps their CPU intent), and the kernel's view of their processes: ``/proc/<pid>/status`` and the cpuset
cgroup files. ``GuestNode(containerd="2.x")`` runs a newer containerd from the host's cache
(numapin_lab.cri.containerd_versions) instead of the system's. The same node behind numapin's other door
(``GuestNode(nri="2.x")``): that containerd with NRI on, ``numapin nri`` plugged into it, kubelet's client on
containerd's own socket.

Everything lives under /run (a plain tmpfs in the guest: containerd's overlayfs snapshots cannot sit on the
guest's overlay root). Calls are synchronous (each opens its own CRI channel), so the checks are plain functions.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from allocator.cpuset import CPUSet
from allocator.quantity import cpu_milli
from nodeagent.node.cfs import QUOTA_PERIOD, milli_cpu_to_quota, milli_cpu_to_shares
from numapin.proc_cpus import cgroup_file, process_cpus
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import PAUSE_IMAGE, ContainerdLab, LabError
from numapin_lab.cri.containerd_versions import containerd_bin_dir
from numapin_lab.demo.pod_manifest import make_pod
from numapin_lab.demo.pod_runner import PodRunner, RunningPod
from numapin_lab.demo.stack import ManagedProcess
from tests.numa.guest.warm_proxy import NRI_MODULES, WarmProxy
from webhook.admission.mutate import mutate_pod

__all__ = ["OPLOG_ENV", "WORK", "GuestNode", "Kernel", "Memory", "NodeConfig", "Refusal", "kubelet_resize",
           "node_meminfo"]

WORK = Path("/run/numapin-vm")
CGROUP_ROOT = "numapin-vm"
SETTLE_SECONDS = 30.0  # how long the kernel may take to show a pushed cpuset (an UpdateContainerResources away)
OPLOG_ENV = "NUMAPIN_VM_OPLOG"  # a file the node appends "<seconds> <operation>" lines to (what the VM part costs)
CONNECT_TRIES = 3  # a connection attempt can time out under heavy emulation load; nothing was sent, so retry
# containerd's NRI timeouts (a plugin's answer 2 s, its registration 5 s) scaled as the churn's deadlines are in the
# VM: a Python plugin's answer under emulation takes seconds, and containerd drops a plugin that times out
NRI_TIME_SCALE = 4.0
T = TypeVar("T")


@dataclass(frozen=True)
class NodeConfig:
    """How ``numapin criproxy`` runs: topology manager policy and options, CPU manager options, reserved CPUs, and
    the Memory Manager (``reserved_memory`` in kubelet's ``--reserved-memory`` format: set, it turns the Memory
    Manager on, ``--memory-manager-policy Static``; the default eviction threshold, 100Mi, is what it must add up
    to)."""
    policy: str = "single-numa-node"
    reserved: str = "0"
    topology_options: str = ""
    cpu_options: str = ""
    reserved_memory: str = ""
    extra: tuple[str, ...] = ()  # more arguments of ``numapin criproxy``

    def args(self) -> list[str]:
        out = ["--topology-manager-policy", self.policy, "--reserved-cpus", self.reserved]
        if self.topology_options:
            out += ["--topology-manager-policy-options", self.topology_options]
        if self.cpu_options:
            out += ["--cpu-manager-policy-options", self.cpu_options]
        if self.reserved_memory:
            out += ["--memory-manager-policy", "Static", "--reserved-memory", self.reserved_memory]
        return [*out, *self.extra]


@dataclass(frozen=True)
class Kernel:
    """What the kernel says a container's main process may use."""
    pid: int
    cpus: CPUSet             # /proc/<pid>/status Cpus_allowed_list
    mems: CPUSet             # /proc/<pid>/status Mems_allowed_list
    cgroup_cpus: CPUSet | None
    cgroup_mems: CPUSet | None

    def __str__(self) -> str:
        return (f"pid {self.pid}: Cpus_allowed_list {self.cpus}, Mems_allowed_list {self.mems}, cpuset cgroup "
                f"cpus {self.cgroup_cpus} mems {self.cgroup_mems}")


@dataclass(frozen=True)
class Refusal:
    code: str      # gRPC status code name
    message: str


def node_meminfo(n: int, key: str) -> int:
    """A ``/sys/devices/system/node/nodeN/meminfo`` value in kB."""
    for line in Path(f"/sys/devices/system/node/node{n}/meminfo").read_text().splitlines():
        parts = line.split()
        if parts[2] == key + ":":
            return int(parts[3])
    raise LookupError(f"node{n}/meminfo has no {key}")


def kubelet_resize(cpu: str, memory_mib: int = 32) -> pb.LinuxContainerResources:
    """What kubelet (``cpuManagerPolicy: none``) sends in ``UpdateContainerResources`` for a Guaranteed container
    resized to ``cpu``: the whole block, CFS shares, quota and period from the new CPU, the pod's memory limit, no
    cpuset."""
    milli = cpu_milli(cpu)
    memory = memory_mib * 1024 * 1024
    return pb.LinuxContainerResources(cpu_period=QUOTA_PERIOD, cpu_quota=milli_cpu_to_quota(milli),
                                      cpu_shares=milli_cpu_to_shares(milli), memory_limit_in_bytes=memory,
                                      memory_swap_limit_in_bytes=memory, oom_score_adj=-997)


@dataclass(frozen=True)
class Memory:
    """A container's memory as its pod asks it (requests equal limits: the pod stays Guaranteed when its CPUs are)
    and as kubelet passes it in CRI: ``memory_limit_in_bytes`` and ``hugepage_limits`` (the 2MB size, 0 when not
    asked; the 1GB size when asked)."""
    memory_mib: int
    hugepages_2m_mib: int = 0
    hugepages_1g_gib: int = 0

    def resources(self) -> dict[str, str]:
        out = {"memory": f"{self.memory_mib}Mi"}
        if self.hugepages_2m_mib:
            out["hugepages-2Mi"] = f"{self.hugepages_2m_mib}Mi"
        if self.hugepages_1g_gib:
            out["hugepages-1Gi"] = f"{self.hugepages_1g_gib}Gi"
        return out

    def apply(self, resources: pb.LinuxContainerResources) -> None:
        resources.memory_limit_in_bytes = self.memory_mib << 20
        resources.hugepage_limits.append(pb.HugepageLimit(page_size="2MB", limit=self.hugepages_2m_mib << 20))
        if self.hugepages_1g_gib:
            resources.hugepage_limits.append(pb.HugepageLimit(page_size="1GB", limit=self.hugepages_1g_gib << 30))


def pod_spec(name: str, cpu: str, *, limit: str | None = None, mode: str | None = None,
             memory: Memory | None = None) -> dict[str, Any]:
    """The pod as the API server stores it after numapin's /mutate (the CPU intent annotation stamped)."""
    pod = make_pod(name, cpu=cpu, limit=limit, mode=mode)
    if memory is not None:
        res = pod["spec"]["containers"][0]["resources"]
        res["requests"].update(memory.resources())
        if "limits" in res:
            res["limits"].update(memory.resources())
    pod["metadata"]["uid"] = f"uid-{name}-{time.monotonic_ns()}"
    mutated, _warnings = mutate_pod(pod)
    return mutated


class GuestNode:
    """``GuestNode().start()``; ``configure(NodeConfig(...))`` (re)starts the proxy on a fresh state; ``run``,
    ``refuse``, ``delete`` pods; ``resize``, ``refuse_resize`` them in place as kubelet does; ``kernel``/``settled``
    read the kernel; ``stop()``. One event loop and one CRI channel to the proxy (as kubelet's) and one to containerd
    for the whole boot."""

    def __init__(self, work: Path = WORK, *, systemd: bool = False, containerd: str | None = None,
                 nri: str | None = None) -> None:
        self.work = work
        self.systemd = systemd  # the systemd cgroup driver (runc's SystemdCgroup, kubelet's slices as pod parents)
        # the door: None, ``numapin criproxy`` in front of the containerd; a version ("2.x"): that containerd with NRI
        # on and ``numapin nri`` as its plugin, kubelet's client on containerd's socket
        self.nri = nri
        # which containerd: None, the system's; a key of numapin_lab.cri.containerd_versions.CONTAINERDS ("2.x"),
        # that one from the host's cache (LabError when it is not there: the guest never downloads)
        self.containerd = nri if nri is not None else containerd
        bin_dir = containerd_bin_dir(self.containerd, fetch=False) if self.containerd is not None else None
        self.lab = ContainerdLab(work / "ctrd", bin_dir, systemd_cgroup=systemd, nri=nri is not None,
                                 nri_time_scale=NRI_TIME_SCALE)
        self.cgroup_root = CGROUP_ROOT if nri is None else f"{CGROUP_ROOT}-nri"
        self.proxy_socket = str(work / "criproxy.sock")
        self.control_socket = str(work / "control.sock")  # the proxy's default: next to its socket
        self.state_dir = work / "state"
        self.proxy: ManagedProcess | None = None
        self._warm: WarmProxy | None = None  # the next proxy, importing (prepare_proxy)
        self.config: NodeConfig | None = None
        self.pods: dict[str, RunningPod] = {}
        self.pids: dict[tuple[str, str], int] = {}
        self._runner = asyncio.Runner()
        self._kubelet: CRIClient | None = None
        self._direct: CRIClient | None = None
        self._oplog = os.environ.get(OPLOG_ENV)

    def _do(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the node's loop (again when the connection attempt itself failed), timed."""
        t0 = time.monotonic()
        for attempt in range(CONNECT_TRIES):
            try:
                out = self._runner.run(make())  # type: ignore[arg-type]
                break
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.UNAVAILABLE or "failed to connect" not in (e.details() or "") \
                        or attempt == CONNECT_TRIES - 1:
                    raise
        if self._oplog:
            with open(self._oplog, "a") as f:
                f.write(f"{time.monotonic() - t0:.2f} {what}\n")
        return out

    @property
    def kubelet(self) -> CRIClient:
        """kubelet's channel to the proxy, or to containerd behind NRI (made on the node's loop: call from its
        coroutines)."""
        if self._kubelet is None:
            self._kubelet = CRIClient(self.lab.socket if self.nri else self.proxy_socket, timeout=120)
        return self._kubelet

    @property
    def door(self) -> str:
        """What the operation log calls numapin's process."""
        return "nri plugin" if self.nri else "proxy"

    @property
    def direct(self) -> CRIClient:
        """A channel straight to containerd (made on the node's loop: call from its coroutines)."""
        if self._direct is None:
            self._direct = CRIClient(self.lab.socket, timeout=120)
        return self._direct

    def start(self) -> GuestNode:
        self.work.mkdir(parents=True, exist_ok=True)
        self.prepare_proxy()  # its imports while containerd starts
        t0 = time.monotonic()
        self.lab.start()
        if self.lab.major >= 2:
            self._do("pause image in CRI", self._pause_image)
        if self._oplog:
            with open(self._oplog, "a") as f:
                f.write(f"{time.monotonic() - t0:.2f} containerd {self.lab.version} start\n")
        return self

    async def _pause_image(self) -> None:
        """containerd 2.x's CRI learns of the images the lab imported through events, a moment after the import
        (tests/nri/conftest.py): the first pod must not run before it knows the pause image."""
        deadline = time.monotonic() + 60
        while PAUSE_IMAGE not in {t for i in await self.direct.list_images() for t in i.repo_tags}:
            if time.monotonic() > deadline:
                raise LabError(f"containerd {self.lab.version}'s CRI did not list {PAUSE_IMAGE} within 60 s of "
                               f"its import")
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        try:
            self.delete_all()
        finally:
            self._stop_proxy()
            self._drop_warm()
            if self._direct is not None:
                self._runner.run(self._direct.close())
            self._runner.close()
            self.lab.stop()

    # -- the proxy ----------------------------------------------------------------------------------------------
    def configure(self, config: NodeConfig) -> None:
        """Run the proxy with ``config`` on an empty node: pods deleted, state wiped, proxy restarted (kept as it
        is when it already runs with ``config``: then the pods are deleted through it, as kubelet would)."""
        if config == self.config and self.proxy is not None and self.proxy.alive():
            self.delete_all()
            return
        self._stop_proxy()
        self.delete_all()  # straight in containerd: no proxy to widen the shared pool for pods about to go too
        t0 = time.monotonic()
        shutil.rmtree(self.state_dir, ignore_errors=True)
        self.state_dir.mkdir(parents=True)
        common = ["--runtime-endpoint", f"unix://{self.lab.socket}", "--state-dir", str(self.state_dir),
                  "--nrt-file", str(self.work / "nrt.json"), "--sysfs", "/sys", "--node-name", "numa-vm",
                  "--metrics-address", "", *config.args()]
        door = ["nri", "--nri-socket", self.lab.nri_socket, "--plugin-index", "90", "--control-socket",
                self.control_socket] if self.nri else ["criproxy", "--listen", self.proxy_socket]
        args = [*door, *common]
        warm = self._warm is not None and self._warm.alive()
        self.prepare_proxy()
        assert self._warm is not None
        self.proxy, self._warm = self._warm, None
        self._warm_launch(args)
        self.proxy.wait_for(self._ready, timeout=120)
        self.config = config
        if self._oplog:
            with open(self._oplog, "a") as f:
                f.write(f"{time.monotonic() - t0:.2f} {self.door} start{' (warm)' if warm else ''} "
                        f"{' '.join(config.args())}\n")

    @property
    def _ready(self) -> str:
        """The log line of numapin's process once it serves: the proxy reconciled with containerd, the plugin
        synchronized by it (its reconcile done)."""
        return r"synchronized with " if self.nri else r"reconcile: "

    def _warm_launch(self, args: Sequence[str]) -> None:
        assert isinstance(self.proxy, WarmProxy)
        try:
            self.proxy.launch(args)
        except OSError:  # it died while waiting: another one, cold
            self.proxy.stop()
            self.proxy = self._new_warm()
            self.proxy.start()
            self.proxy.launch(args)

    def prepare_proxy(self) -> None:
        """Start the next proxy's process now (it imports, then waits for ``configure``'s command line): a proxy
        start under emulation is mostly Python's imports, which then overlap the node's other work."""
        if self._warm is None or not self._warm.alive():
            self._drop_warm()
            self._warm = self._new_warm()
            self._warm.start()

    def _drop_warm(self) -> None:
        if self._warm is not None:
            self._warm.stop()
            self._warm = None

    def _new_warm(self) -> WarmProxy:
        if self.nri:
            return WarmProxy(self.work / f"nri-{time.monotonic_ns()}.log", modules=NRI_MODULES)
        return WarmProxy(self.work / f"criproxy-{time.monotonic_ns()}.log")

    def release(self) -> None:
        """Leave containerd to another proxy (the churn runs its own): pods deleted, this node's proxy stopped."""
        self._drop_warm()
        self.delete_all()
        self._stop_proxy()
        self.delete_all()

    def _stop_proxy(self) -> None:
        if self._kubelet is not None:
            self._runner.run(self._kubelet.close())
            self._kubelet = None
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        self.config = None

    def kill_proxy(self) -> None:
        """kill -9 of the proxy, then the same command line again on the state it left (not wiped), up to its
        reconciliation with containerd."""
        assert self.proxy is not None and self.config is not None, "no proxy to kill"
        args, config = list(self.proxy.args), self.config
        if self._kubelet is not None:
            self._runner.run(self._kubelet.close())
            self._kubelet = None
        self.proxy.stop(signal.SIGKILL)
        t0 = time.monotonic()
        self.prepare_proxy()
        assert self._warm is not None
        self.proxy, self._warm = self._warm, None
        self._warm_launch(args)
        self.proxy.wait_for(self._ready, timeout=120)
        self.config = config
        if self._oplog:
            with open(self._oplog, "a") as f:
                f.write(f"{time.monotonic() - t0:.2f} {self.door} restart after kill -9\n")

    def set_mode(self, name: str, mode: str) -> dict[str, Any]:
        """``numapin mode default/NAME MODE`` through the proxy's control socket; its answer."""
        from nodeagent.serve.control import call_control

        return self._do(f"mode {name} {mode}", lambda: call_control(
            self.control_socket, {"op": "set-mode", "pod": f"default/{name}", "mode": mode}, timeout=120))

    def proxy_log(self) -> str:
        return self.proxy.tail(40) if self.proxy is not None else ""

    # -- pods ---------------------------------------------------------------------------------------------------
    def run(self, name: str, cpu: str, *, limit: str | None = None, mode: str | None = None,
            devices: Sequence[str] = (), command: Sequence[str] = ("sleep", "86400"), memory: Memory | None = None,
            mounts: Sequence[tuple[str, str]] = ()) -> RunningPod:
        """Run a one-container pod (container ``app``) through the proxy; AssertionError if it is refused.
        ``memory``: what it asks (else 32Mi in the pod, nothing in CRI); ``mounts``: (host path, container path)."""
        pod = pod_spec(name, cpu, limit=limit, mode=mode, memory=memory)
        got = self._do(f"run pod {name} cpu={cpu}", lambda: self._run(pod, devices, command, memory, mounts))
        if isinstance(got, Refusal):
            raise AssertionError(f"pod {name} (cpu {cpu}) refused: {got.code}: {got.message}\n{self.proxy_log()}")
        return got

    def refuse(self, name: str, cpu: str, *, limit: str | None = None, mode: str | None = None,
               devices: Sequence[str] = (), memory: Memory | None = None) -> Refusal:
        """Run a pod that the proxy must refuse; returns the refusal (AssertionError if it ran)."""
        pod = pod_spec(name, cpu, limit=limit, mode=mode, memory=memory)
        got = self._do(f"refused pod {name} cpu={cpu}",
                       lambda: self._run(pod, devices, ("sleep", "86400"), memory))
        if not isinstance(got, Refusal):
            cpus = self.kernel(name).cpus
            raise AssertionError(f"pod {name} (cpu {cpu}) was admitted (runs on CPUs {cpus}); a refusal was expected")
        return got

    async def _run(self, pod: dict[str, Any], devices: Sequence[str], command: Sequence[str],
                   memory: Memory | None = None, mounts: Sequence[tuple[str, str]] = ()) -> RunningPod | Refusal:
        kubelet = self.kubelet
        runner = PodRunner(kubelet, self.cgroup_root, systemd=self.systemd)
        running = await runner.run_sandbox(pod)
        sandbox = runner.sandbox_config(pod)
        for c in pod["spec"]["containers"]:
            res = c.get("resources") or {}
            req = (res.get("requests") or {}).get("cpu")
            lim = (res.get("limits") or {}).get("cpu")
            cfg = kubelet.container_config(
                c["name"], cpu_milli=cpu_milli(req) if req else None,
                limit_milli=cpu_milli(lim) if lim else None, command=tuple(command),
                devices=[pb.Device(container_path=d, host_path=d, permissions="rw") for d in devices])
            if memory is not None:
                memory.apply(cfg.linux.resources)
            cfg.mounts.extend(pb.Mount(host_path=h, container_path=c) for h, c in mounts)
            try:
                cid = await kubelet.create_container(running.sandbox_id, cfg, sandbox)
            except grpc.aio.AioRpcError as e:
                await kubelet.stop_pod_sandbox(running.sandbox_id)
                await kubelet.remove_pod_sandbox(running.sandbox_id)
                return Refusal(e.code().name, e.details() or "")
            running.containers[c["name"]] = cid
            await kubelet.start_container(cid)
            st = await self.direct.container_status(cid, verbose=True)
            self.pids[(running.name, c["name"])] = int(json.loads(st.info["info"])["pid"])
        self.pods[running.name] = running
        return running

    def delete(self, *names: str) -> None:
        """Delete pods as kubelet does (stop, stop sandbox, remove), through the proxy, concurrently."""
        gone = [self.pods.pop(n) for n in names]
        for n in names:
            for key in [k for k in self.pids if k[0] == n]:
                del self.pids[key]

        async def go() -> None:
            runner = PodRunner(self.kubelet, self.cgroup_root, systemd=self.systemd)
            await asyncio.gather(*(runner.delete(r) for r in gone))
        self._do(f"delete {len(gone)} pod(s)", go)

    def delete_all(self) -> None:
        """Every pod deleted: ours through the proxy, whatever else is left directly in containerd (with the pod
        cgroups of ours, as kubelet removes them)."""
        if self.pods and self.proxy is not None and self.proxy.alive():
            self.delete(*self.pods)
        parents = {r.sandbox_id: r.cgroup_parent for r in self.pods.values()}
        self.pods.clear()
        self.pids.clear()

        async def remove(sandbox_id: str) -> None:
            await self.direct.stop_pod_sandbox(sandbox_id)
            await self.direct.remove_pod_sandbox(sandbox_id, cgroup_parent=parents.get(sandbox_id))

        async def sweep() -> None:
            await asyncio.gather(*(remove(sb.id) for sb in await self.direct.list_pod_sandbox()))
        self._do("sweep", sweep)

    def resize(self, name: str, cpu: str, container: str = "app") -> None:
        """Resize a running Guaranteed container in place to ``cpu`` as kubelet does (``kubelet_resize``), through
        the proxy; AssertionError if the call fails."""
        got = self._do(f"resize {name} to cpu={cpu}", lambda: self._resize(name, container, cpu))
        if got is not None:
            raise AssertionError(f"resize of {name} to {cpu} CPU failed: {got.code}: {got.message}\n"
                                 f"{self.proxy_log()}")

    def refuse_resize(self, name: str, cpu: str, container: str = "app", memory_mib: int = 32) -> Refusal:
        """A resize the proxy must refuse; returns the refusal (AssertionError if it was answered OK).
        ``memory_mib``: the pod's memory limit, which kubelet sends along."""
        got = self._do(f"refused resize {name} to cpu={cpu}", lambda: self._resize(name, container, cpu, memory_mib))
        if got is None:
            raise AssertionError(f"resize of {name} to {cpu} CPU was answered OK (the kernel shows "
                                 f"{self.kernel(name, container)}); a refusal was expected")
        return got

    async def _resize(self, name: str, container: str, cpu: str, memory_mib: int = 32) -> Refusal | None:
        try:
            await self.kubelet.update_container_resources(self.pods[name].containers[container],
                                                          kubelet_resize(cpu, memory_mib))
        except grpc.aio.AioRpcError as e:
            return Refusal(e.code().name, e.details() or "")
        return None

    # -- the kernel ---------------------------------------------------------------------------------------------
    def kernel(self, name: str, container: str = "app") -> Kernel:
        pid = self.pids[(name, container)]
        p = process_cpus(pid)
        mems = cgroup_file(pid, "cpuset", "cpuset.mems")
        return Kernel(pid, p.cpus, p.mems, p.cgroup_cpus, CPUSet.parse(mems) if mems else None)

    def cfs_quota(self, name: str, container: str = "app") -> str | None:
        """The container's CFS quota as its cgroup holds it (v1 ``cpu.cfs_quota_us``, v2 the first field of
        ``cpu.max``): "-1" / "max" when unlimited."""
        pid = self.pids[(name, container)]
        v1 = cgroup_file(pid, "cpu", "cpu.cfs_quota_us")
        if v1 is not None:
            return v1
        v2 = cgroup_file(pid, "cpu", "cpu.max")
        return v2.split()[0] if v2 else None

    def settled(self, name: str, cpus: CPUSet, mems: CPUSet, container: str = "app") -> Kernel:
        """The kernel's view once it shows ``cpus``/``mems`` for the container, or after SETTLE_SECONDS (the
        caller asserts on what it returns): a pushed cpuset reaches the kernel a runc call later."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            k = self.kernel(name, container)
            if (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) == (cpus, mems, cpus, mems) or \
                    time.monotonic() > deadline:
                return k
            time.sleep(0.2)

