"""``numapin webhook`` as a child process for a lab control plane: certificates made by ``numapin certs`` for
127.0.0.1 (the API server calls it by URL), serving on a free loopback port, reading NodeResourceTopologies, Nodes
and pending Pods from the API server with its own identity. ``WebhookProcess(cp, directory, user=...).start()`` …
``stop()``; killed when the thread that started it dies."""

from __future__ import annotations

import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from numapin_lab.cri.proxy_process import free_port
from numapin_lab.k8s.control_plane import ControlPlane
from numapin_lab.k8s.process import Daemon, wait_ready

__all__ = ["WebhookError", "WebhookProcess"]


class WebhookError(RuntimeError):
    """The webhook did not start (the message quotes its log)."""


class WebhookProcess:
    def __init__(self, control_plane: ControlPlane, directory: Path, *, user: str) -> None:
        self.cp = control_plane
        self.dir = directory
        self.user = user
        self.certs = directory / "certs"
        self.port = 0
        self._daemon: Daemon | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_pem(self) -> bytes:
        return (self.certs / "ca.crt").read_bytes()

    def start(self, timeout: float = 60.0) -> WebhookProcess:
        r = subprocess.run([sys.executable, "-m", "numapin", "certs", "--ip-address", "127.0.0.1", "--days", "2",
                            "--out-dir", str(self.certs)], capture_output=True, text=True, timeout=120, check=False)
        if r.returncode != 0:
            raise WebhookError(f"numapin certs failed ({r.returncode}): {r.stderr.strip()}")
        self.port = free_port()
        kubeconfig = self.cp.kubeconfig_for(self.user)
        self._daemon = Daemon("numapin-webhook", [
            sys.executable, "-m", "numapin", "webhook", "--cert", str(self.certs / "tls.crt"),
            "--key", str(self.certs / "tls.key"), "--host", "127.0.0.1", "--port", str(self.port),
            "--kubeconfig", str(kubeconfig)], self.dir / "webhook.log")
        self._daemon.start()
        ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=ctx, timeout=2) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, OSError):
                return False

        wait_ready(self._daemon, ready, timeout=timeout, what="numapin webhook ready", error=WebhookError)
        return self

    def tail(self, lines: int = 30) -> str:
        return self._daemon.tail(lines) if self._daemon is not None else "(never started)"

    def stop(self) -> None:
        if self._daemon is not None:
            self._daemon.stop()
            self._daemon = None
