"""A whole lab node for a real kubelet: its own containerd (the lab's, not any other test's), numapin's node agent as a
process through one of its doors, and kubelet v1.36.2 registered with the control plane, in its own cgroup root. Door
``proxy``: ``numapin criproxy`` in front of containerd 1.6, its socket kubelet's runtime endpoint. Door ``nri``:
``numapin nri`` plugged into containerd 2.x's NRI socket, kubelet on containerd's own socket. ``LabNode(cp).start()``
… ``stop()``: everything in one scratch directory ``/tmp/npnode-*`` and one cgroup root ``/numapin-kubelet-*``, both
noted in the lab's ledger; ``stop()`` leaves no process, container, cgroup or kernel setting changed."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.containerd_versions import containerd_bin_dir
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.nri_process import NriProcess
from numapin_lab.cri.proxy_process import ProxyProcess
from numapin_lab.k8s.cgroup_root import make_cgroup_root, remove_cgroup_root
from numapin_lab.k8s.control_plane import ControlPlane
from numapin_lab.k8s.kubelet import Kubelet

__all__ = ["LabNode"]


class LabNode:
    """Node ``name`` of ``control_plane``: containerd, numapin's node agent through ``door`` (``--reserved-cpus
    reserved_cpus``, ``proxy_args`` more; ``proxy`` is that process, ``ProxyProcess`` or ``NriProcess``), kubelet."""

    def __init__(self, control_plane: ControlPlane, *, name: str = "numapin-node", reserved_cpus: str = "0",
                 proxy_args: Sequence[str] = (), door: Literal["proxy", "nri"] = "proxy") -> None:
        self.cp = control_plane
        self.name = name
        self.reserved_cpus = reserved_cpus
        self.proxy_args = tuple(proxy_args)
        self.door = door
        self.dir: Path | None = None
        self.cgroup_root = ""
        self.containerd: ContainerdLab | None = None
        self.proxy: ProxyProcess | None = None
        self.kubelet: Kubelet | None = None
        self.start_seconds: dict[str, float] = {}  # what each part's start took
        self.stop_seconds: dict[str, float] = {}  # and its stop

    def start(self) -> LabNode:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        t0 = time.monotonic()
        d = self.dir = scratch_dir("npnode-")
        self.cgroup_root = make_cgroup_root()
        nri = self.door == "nri"
        lab = self.containerd = ContainerdLab(d / "ctrd", containerd_bin_dir("2.x") if nri else None, nri=nri)
        lab.start()
        t1 = time.monotonic()
        if nri:
            self.proxy = NriProcess(d / "nri", lab.socket, lab.nri_socket, reserved_cpus=self.reserved_cpus,
                                    extra_args=self.proxy_args, node_name=self.name)
        else:
            self.proxy = ProxyProcess(d / "proxy", lab.socket, reserved_cpus=self.reserved_cpus,
                                      extra_args=self.proxy_args, node_name=self.name)
        self.proxy.start()
        t2 = time.monotonic()
        (d / "kubelet").mkdir()
        endpoint = lab.socket if nri else self.proxy.socket
        self.kubelet = Kubelet(self.cp, d / "kubelet", node_name=self.name, runtime_endpoint=f"unix://{endpoint}",
                               cgroup_root=self.cgroup_root)
        self.kubelet.start()
        t3 = time.monotonic()
        self.start_seconds = {"containerd": t1 - t0, self.door: t2 - t1, "kubelet": t3 - t2}

    def stop(self) -> dict[str, tuple[str, str]]:
        """kubelet first (nothing re-creates the pods then), then containerd with every container, the proxy, the
        cgroup root and the directory; returns the kernel settings put back."""
        restored: dict[str, tuple[str, str]] = {}
        t = time.monotonic()
        if self.kubelet is not None:
            restored = self.kubelet.stop()
            self.kubelet = None
        t = self._stopped("kubelet", t)
        if self.containerd is not None:
            self.containerd.stop()
            self.containerd = None
        t = self._stopped("containerd", t)
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        t = self._stopped(self.door, t)
        if self.cgroup_root:
            remove_cgroup_root(self.cgroup_root)
            self.cgroup_root = ""
        self._stopped("cgroups", t)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        return restored

    def _stopped(self, part: str, since: float) -> float:
        now = time.monotonic()
        self.stop_seconds[part] = now - since
        return now
