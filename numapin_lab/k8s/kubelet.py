"""A real kubelet v1.36.2 for tests, registered as a node with the lab's control plane: ``Kubelet(...).start()`` …
``stop()``.

Its configuration is what numapin's guide asks of a node (``cpuManagerPolicy: none``, the runtime endpoint given,
here a ``numapin criproxy`` socket or containerd's own) plus what this machine needs (``failCgroupV1: false`` on a
cgroup v1 host, the ``cgroupfs`` driver, no swap check, no iptables chains, image GC and eviction out of the way,
its API on loopback without authentication). It is kept away from the rest of the machine:

- its own root directory and pod-logs directory, inside ``directory``;
- its own mount namespace (``unshare --mount --propagation private``): the bind mount kubelet makes of its root
  directory to share it never reaches the host's mount table;
- its own cgroup root (``cgroup_root``, made by ``numapin_lab.k8s.cgroup_root``): its housekeeping, which kills the
  processes of pod cgroups it does not know, looks only there;
- the kernel settings it changes at start (``kernel_tunables``) are put back by ``stop()``, and the links it makes
  in ``/var/log/containers`` (a fixed path) are removed, with the directory when kubelet made it.

It is killed (SIGKILL) when the thread that started it dies (``Daemon``), as the control plane is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from numapin_lab.cri.proxy_process import free_port
from numapin_lab.k8s.control_plane import ControlPlane, ControlPlaneError, node_user
from numapin_lab.k8s.kernel_tunables import KernelTunables
from numapin_lab.k8s.process import Daemon, wait_ready

__all__ = ["CONTAINER_LOGS", "Kubelet", "KubeletError", "kubelet_config"]

CONTAINER_LOGS = Path("/var/log/containers")  # kubelet's links to its containers' logs: not configurable


class KubeletError(RuntimeError):
    """kubelet did not start or did not register its node (the message quotes its log)."""


def kubelet_config(*, runtime_endpoint: str, cgroup_root: str, pod_logs_dir: Path, port: int,
                   healthz_port: int) -> dict[str, object]:
    """The KubeletConfiguration of a lab node."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": runtime_endpoint,
        "imageServiceEndpoint": runtime_endpoint,
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "cpuManagerPolicy": "none",
        "memoryManagerPolicy": "None",
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "protectKernelDefaults": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "0%", "nodefs.inodesFree": "0%",
                         "imagefs.available": "0%"},
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "podLogsDir": str(pod_logs_dir),
        "resolvConf": "",
        "registerNode": True,
        "nodeStatusUpdateFrequency": "2s",
        "syncFrequency": "5s",
        "fileCheckFrequency": "5s",
        "serializeImagePulls": False,
        "shutdownGracePeriod": "0s",
    }


class Kubelet:
    """kubelet as node ``node_name`` of ``control_plane``, its files in ``directory`` (which must exist)."""

    def __init__(self, control_plane: ControlPlane, directory: Path, *, node_name: str, runtime_endpoint: str,
                 cgroup_root: str) -> None:
        self.cp = control_plane
        self.dir = directory
        self.node_name = node_name
        self.runtime_endpoint = runtime_endpoint
        self.cgroup_root = cgroup_root
        self.root_dir = directory / "root"
        self.pod_logs = directory / "pod-logs"
        self.config = directory / "kubelet-config.yaml"
        self.log = directory / "kubelet.log"
        self.start_seconds = 0.0  # how long start() took, until it served its health check and had its node
        self.healthz_port = 0
        self._daemon: Daemon | None = None
        self._tunables: KernelTunables | None = None
        self._made_container_logs = False

    def argv(self) -> list[str]:
        kubeconfig = self.cp.kubeconfig_for(*node_user(self.node_name))
        return ["unshare", "--mount", "--propagation", "private", "--",
                str(self.cp.binaries.kubelet), "--config", str(self.config), "--kubeconfig", str(kubeconfig),
                "--root-dir", str(self.root_dir), "--cert-dir", str(self.root_dir / "pki"),
                "--hostname-override", self.node_name, "--v", "2"]

    def start(self, timeout: float = 120.0) -> Kubelet:
        t0 = time.monotonic()
        self.root_dir.mkdir(exist_ok=True)
        self.pod_logs.mkdir(exist_ok=True)
        self.healthz_port = free_port()
        config = kubelet_config(runtime_endpoint=self.runtime_endpoint, cgroup_root=self.cgroup_root,
                                pod_logs_dir=self.pod_logs, port=free_port(), healthz_port=self.healthz_port)
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        if self._tunables is None:  # a restart keeps the values found before the first start
            self._tunables = KernelTunables.record()
            self._made_container_logs = not CONTAINER_LOGS.exists()
        self._daemon = Daemon("kubelet", self.argv(), self.log)
        self._daemon.start()
        try:
            wait_ready(self._daemon, self._healthy, timeout=timeout, what=f"kubelet healthy, node {self.node_name}",
                       error=KubeletError)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    @property
    def running(self) -> bool:
        return self._daemon is not None and self._daemon.exit_code() is None

    def tail(self, lines: int = 30) -> str:
        return self._daemon.tail(lines) if self._daemon is not None else "(never started)"

    def node(self) -> dict[str, object] | None:
        """The Node object as the API server has it, or None before kubelet registered it."""
        r = self.cp.kubectl("get", "node", self.node_name, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None  # type: ignore[no-any-return]

    def _healthy(self) -> bool:
        """Whether kubelet answers its health check (it serves it once its runtime answered: a kubelet that found
        no runtime exits instead) and its node is registered with its allocatable CPUs (its pod admission works).
        The node alone is not enough after a restart: it is still there from the previous start."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.healthz_port}/healthz", timeout=2) as r:
                if r.read().strip() != b"ok":
                    return False
        except (urllib.error.URLError, OSError):
            return False
        try:
            node = self.node()
        except (ControlPlaneError, subprocess.TimeoutExpired, ValueError):
            return False
        status = node.get("status", {}) if node else {}
        return isinstance(status, dict) and bool(status.get("allocatable", {}).get("cpu"))

    def kill(self) -> None:
        """Stop the kubelet process only (its pods keep running), as a crash or an upgrade would."""
        if self._daemon is not None:
            self._daemon.stop()
            self._daemon = None

    def stop(self) -> dict[str, tuple[str, str]]:
        """Stop kubelet, put back the kernel settings it changed and remove what it made outside ``directory``;
        returns the settings put back (name -> (recorded, found)). Its pods are the runtime's to stop."""
        self.kill()
        restored = self._tunables.restore() if self._tunables is not None else {}
        self._tunables = None
        self._sweep_container_logs()
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.root_dir)
        return restored

    def _sweep_container_logs(self) -> None:
        if not CONTAINER_LOGS.is_dir():
            return
        ours = str(self.pod_logs) + "/"
        for link in CONTAINER_LOGS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(ours):
                    link.unlink()
        if self._made_container_logs:
            with contextlib.suppress(OSError):
                CONTAINER_LOGS.rmdir()
