"""``numapin nri`` as a real child process plugged into a lab containerd's NRI socket: start, SIGKILL, restart,
``/status`` (with the NRI session's state) and the state file, as ``ProxyProcess`` for the proxy."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .proxy_process import ROOT, ProxyProcess

__all__ = ["NriProcess"]


class NriProcess(ProxyProcess):
    """``python -m numapin nri`` on ``nri_socket``, reading containerd's CRI socket ``runtime_socket``; state in
    ``<dir>/state``, logs in ``<dir>/proxy.log``, the control socket ``<dir>/control.sock``."""

    def __init__(self, directory: Path, runtime_socket: str, nri_socket: str, *, reserved_cpus: str,
                 sysfs: str = "/sys", extra_args: Sequence[str] = (), root: Path = ROOT,
                 node_name: str = "lab") -> None:
        super().__init__(directory, runtime_socket, reserved_cpus=reserved_cpus, sysfs=sysfs, extra_args=extra_args,
                         root=root, node_name=node_name)
        self.nri_socket = nri_socket
        self.control_socket = str(directory / "control.sock")

    def command(self) -> list[str]:
        return ["nri", "--nri-socket", self.nri_socket, "--runtime-endpoint", f"unix://{self.runtime_socket}",
                "--plugin-index", "90", "--state-dir", str(self.state_dir), "--sysfs", self.sysfs,
                "--reserved-cpus", self.reserved_cpus, "--metrics-address", f"127.0.0.1:{self.port}",
                "--node-name", self.node_name, "--control-socket", self.control_socket, *self.extra_args]

    def wait_synchronized(self, connections: int = 1, timeout: float = 60.0) -> dict[str, Any]:
        """Until the plugin has been synchronized by the runtime ``connections`` times in all and is connected
        and the agent reconciled; returns /status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"numapin nri exited {self.proc.returncode}:\n{self.log_tail()}")
            st = self.status(timeout=2.0)
            door = (st or {}).get("door") or {}
            if st is not None and st.get("reconciled") and door.get("synchronized") \
                    and door.get("connections", 0) >= connections:
                return st
            time.sleep(0.05)
        raise RuntimeError(f"numapin nri was not synchronized within {timeout:g} s:\n{self.log_tail()}")

    def start(self, timeout: float = 120.0) -> dict[str, Any]:
        self.spawn()
        return self.wait_synchronized(timeout=timeout)
