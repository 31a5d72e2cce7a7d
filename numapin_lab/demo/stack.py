"""numapin's whole stack on one machine, as real processes: a private containerd (the lab of numapin_lab.cri),
``numapin criproxy`` in front of it, and ``numapin webhook`` over HTTPS with certificates made by ``numapin certs``.
The proxy publishes the node's NodeResourceTopology into a directory the webhook reads.

Used by ``numapin demo`` and the end-to-end tests. Everything lives under one work directory (short, for unix
socket paths); the pods' cgroups under ``/<cgroup_root>`` in every cgroup hierarchy. ``stop()`` leaves nothing
behind: no process, socket, mount, cgroup directory or file; ``leftovers()`` says what did stay.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numapin_lab.cri.cgroups import cgroup_mounts, remove_cgroup
from numapin_lab.cri.containerd import ContainerdLab

__all__ = ["LocalStack", "ManagedProcess", "StackError", "StackOptions", "cgroup_mounts"]

SERVICE, NAMESPACE = "numapin-webhook", "numapin"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"
_SRC_ROOT = Path(__file__).resolve().parents[2]


class StackError(RuntimeError):
    """A part of the stack did not start (the message quotes its log)."""


def numapin_command(*args: str) -> list[str]:
    """``numapin ARGS`` run by this Python (works from a source tree and from an installed package)."""
    return [sys.executable, "-m", "numapin", *args]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ManagedProcess:
    """A numapin subcommand as a child process in its own session (a Ctrl-C in the terminal reaches only the
    parent, which stops the children in order), its output in a log file."""

    def __init__(self, name: str, args: Sequence[str], log: Path) -> None:
        self.name = name
        self.args = list(args)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(numapin_command(*self.args), stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, env=_env(), start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 25) -> str:
        return "\n".join(self.text().splitlines()[-lines:])

    def wait_for(self, pattern: str, *, after: int = 0, timeout: float = 60.0) -> re.Match[str]:
        """Wait until the log (from offset ``after``) matches ``pattern``; StackError if the process dies."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.text(), after)
            if m:
                return m
            if not self.alive():
                code = self.proc.returncode if self.proc is not None else None
                raise StackError(f"{self.name} exited ({code}):\n{self.tail()}")
            if time.monotonic() > deadline:
                raise StackError(f"{self.name}: no {pattern!r} in its log within {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code


@dataclass(frozen=True)
class StackOptions:
    workdir: Path                       # created; deleted by stop()
    node_name: str = "numapin-demo-node"
    sysfs: str = "/sys"
    reserved_cpus: str = "0"
    topology_manager_policy: str = "single-numa-node"
    topology_manager_scope: str = "container"
    cgroup_root: str = ""               # default: numapin-<workdir name>
    log_level: str = "INFO"


class LocalStack:
    """``LocalStack(options).start()`` … ``.stop()``."""

    def __init__(self, options: StackOptions, *, say: Callable[[str], None] = lambda s: None) -> None:
        self.options = options
        self.say = say
        w = options.workdir
        self.workdir = w
        self.lab = ContainerdLab(w / "ctrd")
        self.state_dir = w / "state"
        self.nrt_dir = w / "nrt"
        self.nrt_file = self.nrt_dir / f"{options.node_name}.json"
        self.pods_dir = w / "pods"  # the pods "the API server" stored: the webhook reads bindings' pods from here
        self.certs_dir = w / "certs"
        self.logs = w / "logs"
        self.proxy_socket = str(w / "criproxy.sock")
        self.cgroup_root = options.cgroup_root or (w.name if w.name.startswith("numapin") else f"numapin-{w.name}")
        self.proxy: ManagedProcess | None = None
        self.webhook: ManagedProcess | None = None
        self.status_url = ""
        self.webhook_url = ""
        self._started = False

    # -- start ------------------------------------------------------------------------------------------------
    def start(self) -> LocalStack:
        w = self.workdir
        if w.exists() and any(w.iterdir()):
            raise StackError(f"{w} is not empty")
        for d in (w, self.state_dir, self.nrt_dir, self.pods_dir, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        (w / ".numapin-stack").touch()
        self._started = True
        self.say(f"starting a private containerd on {self.lab.socket}")
        self.lab.start()
        self.say(f"making the webhook's CA and serving certificate: numapin certs --out-dir {self.certs_dir}")
        certs = subprocess.run(numapin_command("certs", "--service", SERVICE, "--namespace", NAMESPACE,
                                               "--out-dir", str(self.certs_dir)),
                               capture_output=True, text=True, env=_env(), timeout=60)
        if certs.returncode != 0:
            raise StackError(f"numapin certs failed ({certs.returncode}): {certs.stderr.strip()}")
        self.start_proxy()
        self.start_webhook()
        return self

    def proxy_args(self) -> list[str]:
        o = self.options
        return ["criproxy", "--listen", self.proxy_socket, "--runtime-endpoint", f"unix://{self.lab.socket}",
                "--state-dir", str(self.state_dir), "--nrt-file", str(self.nrt_file), "--sysfs", o.sysfs,
                "--reserved-cpus", o.reserved_cpus, "--topology-manager-policy", o.topology_manager_policy,
                "--topology-manager-scope", o.topology_manager_scope, "--node-name", o.node_name,
                "--metrics-address", "127.0.0.1:0", "--log-level", o.log_level]

    def start_proxy(self) -> None:
        """Start (or restart) ``numapin criproxy``; returns once it has reconciled with containerd."""
        self.proxy = ManagedProcess("numapin criproxy", self.proxy_args(), self.logs / "criproxy.log")
        after = len(self.proxy.text())
        self.say("starting: numapin " + " ".join(self.proxy.args))
        self.proxy.start()
        m = self.proxy.wait_for(r"status on (http://\S+/status)", after=after)
        self.status_url = m.group(1)
        self.proxy.wait_for(r"reconcile: ", after=after)
        deadline = time.monotonic() + 30
        while not self.nrt_file.exists():  # published right after start
            if time.monotonic() > deadline:
                raise StackError(f"numapin criproxy did not write {self.nrt_file}:\n{self.proxy.tail()}")
            time.sleep(0.05)

    def webhook_args(self) -> list[str]:
        return ["webhook", "--cert", str(self.certs_dir / "tls.crt"), "--key", str(self.certs_dir / "tls.key"),
                "--host", "127.0.0.1", "--port", "0", "--nrt-dir", str(self.nrt_dir), "--nrt-poll-seconds", "0.2",
                "--pods-dir", str(self.pods_dir),
                "--log-level", self.options.log_level.lower()]

    def start_webhook(self) -> None:
        self.webhook = ManagedProcess("numapin webhook", self.webhook_args(), self.logs / "webhook.log")
        after = len(self.webhook.text())
        self.say("starting: numapin " + " ".join(self.webhook.args))
        self.webhook.start()
        m = self.webhook.wait_for(r"listening on (https://\S+)", after=after)
        self.webhook_url = m.group(1)

    def store_pod(self, pod: Mapping[str, Any]) -> None:
        """Keep a created pod where the webhook reads the pods bindings refer to (``--pods-dir``), as the API server
        stores it: the webhook never learns a pod from the admission requests themselves."""
        name = pod["metadata"]["name"]
        stored = self.pods_dir / f"{pod['metadata'].get('namespace') or 'default'}-{name}.json"
        tmp = stored.with_suffix(".tmp")
        tmp.write_text(json.dumps(pod))
        tmp.replace(stored)

    @property
    def ca_file(self) -> str:
        return str(self.certs_dir / "ca.crt")

    def restart_proxy(self, sig: int = signal.SIGTERM) -> None:
        """Stop the proxy (SIGTERM, or SIGKILL) and start it again on the same state."""
        if self.proxy is not None:
            self.proxy.stop(sig)
        self.start_proxy()

    def restart_containerd(self) -> None:
        """Stop containerd (containers keep running in their shims) and start it again."""
        self.lab.stop_containerd()
        self.lab.start_containerd()

    # -- stop -------------------------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop everything, remove every trace; returns ``leftovers()`` (empty when all went)."""
        if not self._started:
            return []
        for p in (self.webhook, self.proxy):
            if p is not None:
                self.say(f"stopping {p.name} (pid {p.pid})")
                p.stop()
        self.say("stopping containerd and its containers")
        self.lab.stop()
        self.remove_cgroups()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.proxy_socket)
        if (self.workdir / ".numapin-stack").exists():
            shutil.rmtree(self.workdir, ignore_errors=True)
        self._started = False
        return self.leftovers()

    def cgroup_dirs(self) -> list[Path]:
        return [m / self.cgroup_root for m in cgroup_mounts() if (m / self.cgroup_root).is_dir()]

    def remove_cgroups(self, settle: float = 5.0) -> None:
        """rmdir the pods' cgroup directories bottom-up in every hierarchy (processes may take a moment to go)."""
        remove_cgroup(self.cgroup_root, settle=settle)

    def leftovers(self) -> list[str]:
        out = list(self.lab.leftovers())
        for p in (self.proxy, self.webhook):
            if p is not None and p.alive():
                out.append(f"{p.name} pid {p.pid}")
        out += [f"cgroup {d}" for d in self.cgroup_dirs()]
        out += [f"path {p}" for p in (self.proxy_socket, str(self.workdir)) if os.path.exists(p)]
        return out

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
