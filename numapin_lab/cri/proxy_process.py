"""``numapin criproxy`` as a real child process in front of a lab containerd: start, SIGKILL, restart, and
read its ``/status`` and state file (for the churn harness and the tests)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..warm_start import PROXY_MODULES, discard, launch, spawn_warm

if TYPE_CHECKING:
    from .containerd import ContainerdLab

P = TypeVar("P", bound="ProxyProcess")

__all__ = ["ProxyProcess", "free_port", "serving", "stop_child"]

ROOT = Path(__file__).resolve().parents[2]
WARM_MODULES = (*PROXY_MODULES, "nodeagent.serve.http_server")  # this proxy serves /status


def stop_child(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if ``proc`` has not ended within ``timeout`` seconds; reaped either way."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProxyProcess:
    """``python -m numapin criproxy`` listening on ``<dir>/proxy.sock``, state in ``<dir>/state``, logs to
    ``<dir>/proxy.log``, ``/status`` on a local port. ``warm``: every start but the first is of a process that
    began importing when the previous one started (numapin_lab.warm_start; for emulated machines, where a start
    is mostly imports), so a restart after a kill comes back in the time the proxy itself needs."""

    def __init__(self, directory: Path, runtime_socket: str, *, reserved_cpus: str, sysfs: str = "/sys",
                 extra_args: Sequence[str] = (), root: Path = ROOT, warm: bool = False,
                 node_name: str = "lab") -> None:
        self.dir = directory
        self.node_name = node_name
        self.socket = str(directory / "proxy.sock")
        self.log = directory / "proxy.log"
        self.state_dir = directory / "state"
        self.runtime_socket = runtime_socket
        self.reserved_cpus = reserved_cpus
        self.sysfs = sysfs
        self.extra_args = tuple(extra_args)
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.warm = warm
        self._next: subprocess.Popen[bytes] | None = None  # warm: the next start's process, importing

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        """``numapin``'s arguments for this door."""
        return ["criproxy", "--listen", self.socket, "--runtime-endpoint", f"unix://{self.runtime_socket}",
                "--state-dir", str(self.state_dir), "--sysfs", self.sysfs, "--reserved-cpus", self.reserved_cpus,
                "--metrics-address", f"127.0.0.1:{self.port}", "--node-name", self.node_name, *self.extra_args]

    def spawn(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        args = self.command()
        launched = False
        if self.warm and self._next is not None:
            proc, self._next = self._next, None
            try:
                launch(proc, args)
                self.proc, launched = proc, True
            except OSError:  # it died while waiting: a cold start
                discard(proc)
        if not launched:
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen([sys.executable, "-m", "numapin", *args], cwd=self.root,
                                             env={**os.environ, "PYTHONPATH": str(self.root)}, stdout=log,
                                             stderr=log)

    def status(self, timeout: float = 5.0) -> dict[str, Any] | None:
        """The proxy's ``/status`` document, or None when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=timeout) as r:
                doc = json.loads(r.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("kind") == "NumapinProxyStatus" else None

    def wait_reconciled(self, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited {self.proc.returncode}:\n{self.log_tail()}")
            st = self.status(timeout=2.0)
            if st is not None and st.get("reconciled"):
                return st
            time.sleep(0.05)
        raise RuntimeError(f"proxy did not reconcile within {timeout:g} s:\n{self.log_tail()}")

    def start(self, timeout: float = 120.0) -> dict[str, Any]:
        self.spawn()
        status = self.wait_reconciled(timeout)
        if self.warm and self._next is None:  # the next restart's imports, from now on
            self._next = spawn_warm(self.log, modules=WARM_MODULES, root=self.root)
        return status

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self._next is not None:
            discard(self._next)
            self._next = None
        if self.proc is not None:
            stop_child(self.proc)
            self.proc = None

    def state(self) -> dict[str, Any]:
        return json.loads((self.state_dir / "cpu_manager_state").read_text())  # type: ignore[no-any-return]

    def leftovers(self) -> list[str]:
        """Files in the state directory a clean proxy would not leave (half-written checkpoints)."""
        if not self.state_dir.exists():
            return []
        return sorted(p.name for p in self.state_dir.iterdir() if p.name.endswith(".tmp"))

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@asynccontextmanager
async def serving(process: P, lab: ContainerdLab) -> AsyncIterator[P]:
    """``process`` (a proxy or an NRI plugin in its own scratch directory) started in front of ``lab``; afterwards
    stopped, the lab's pods removed (containerd left empty for the next test) and its directory deleted."""
    await asyncio.to_thread(process.start)
    try:
        yield process
    finally:
        process.stop()
        await lab.remove_all_pods()
        shutil.rmtree(process.dir, ignore_errors=True)
