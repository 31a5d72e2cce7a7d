"""etcd + kube-apiserver v1.36.2 on loopback, for tests: ``ControlPlane.start()`` … ``stop()``.

Everything lives in one private directory (``/tmp/npk8s-*``, noted in the lab's ledger so that a killed test run
leaves nothing: the session's end check kills the processes naming it and removes it): etcd's data, the
certificates (a CA made with numapin's ``webhook.https.certs`` helpers; the API server serves a certificate for
127.0.0.1 and ``localhost``), the service-account signing key, the logs and the kubeconfig files.

Authentication is by client certificates signed by the control plane's CA (``--client-ca-file``), so a test can
make a kubeconfig for any user and groups at any time (``kubeconfig_for``): the admin (group ``system:masters``),
a kubelet (``system:node:<name>`` in ``system:nodes``), a component with its own RBAC. Authorization is
``Node,RBAC``. There is no controller manager: no service-account tokens, no garbage collection, no namespace
finalisation; admission plugins are the API server's defaults minus ``ServiceAccount`` (which would refuse every
pod for lack of a ``default`` ServiceAccount, made by the controller manager).
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.k8s.binaries import K8sBinaries, find_k8s_binaries
from numapin_lab.k8s.kubeconfig import write_kubeconfig
from numapin_lab.k8s.pki import client_cert, control_plane_ca, loopback_serving_cert
from numapin_lab.k8s.process import Daemon

__all__ = ["ADMIN", "ControlPlane", "ControlPlaneError", "node_user"]

ADMIN = ("numapin-lab-admin", ("system:masters",))


def node_user(node: str) -> tuple[str, tuple[str, ...]]:
    """The user and groups of ``node``'s kubelet, as the Node authorizer knows them."""
    return f"system:node:{node}", ("system:nodes",)


class ControlPlaneError(RuntimeError):
    """The control plane did not start (the message quotes the logs)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class ControlPlane:
    def __init__(self, binaries: K8sBinaries | None = None, *, extra_apiserver_args: Sequence[str] = ()) -> None:
        self.binaries = binaries or find_k8s_binaries()
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.workdir: Path | None = None
        self.url = ""
        self.start_seconds = 0.0  # how long start() took, until /readyz answered
        self._daemons: list[Daemon] = []
        self._ca_pem = b""
        self._ca = control_plane_ca()

    # -- files ------------------------------------------------------------------------------------------------
    def _dir(self) -> Path:
        if self.workdir is None:
            raise ControlPlaneError("the control plane is not started")
        return self.workdir

    @property
    def ca_file(self) -> Path:
        """The CA that signs the API server's serving certificate (and the clients' ones)."""
        return self._dir() / "pki/ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """The admin's kubeconfig."""
        return self._dir() / "kubeconfig-admin.yaml"

    def kubeconfig_for(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig authenticating as ``user`` in ``groups`` (a new client certificate)."""
        safe = "".join(c if c.isalnum() or c in "-." else "_" for c in user)
        path = self._dir() / f"kubeconfig-{safe}.yaml"
        return write_kubeconfig(path, server=self.url, ca_pem=self._ca_pem, user=user,
                                credentials=client_cert(self._ca, user, groups))

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, user_kubeconfig: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run kubectl v1.36.2 as the admin (or with ``user_kubeconfig``). Note: this build's OpenAPI v2 document
        is not usable by kubectl's client-side validation: pass ``--validate=false`` to apply/create."""
        cmd = [str(self.binaries.kubectl), "--kubeconfig", str(user_kubeconfig or self.kubeconfig), *args]
        r = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    # -- start and stop ---------------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> ControlPlane:
        t0 = time.monotonic()
        d = self.workdir = scratch_dir("npk8s-")
        pki = d / "pki"
        pki.mkdir()
        (d / "etcd").mkdir(mode=0o700)
        self._ca_pem = self._ca.cert_pem
        serving = loopback_serving_cert(self._ca)
        sa = control_plane_ca()  # its key signs service-account tokens
        for name, data in (("ca.crt", self._ca.cert_pem), ("apiserver.crt", serving.cert_pem),
                           ("apiserver.key", serving.key_pem), ("sa.key", sa.key_pem),
                           ("sa.crt", sa.cert_pem)):
            (pki / name).write_bytes(data)
            (pki / name).chmod(0o600)
        etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self.url = f"https://127.0.0.1:{api_port}"
        self._spawn("etcd", [
            str(self.binaries.etcd), "--name", "lab", "--data-dir", str(d / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"lab=http://127.0.0.1:{peer_port}", "--logger", "zap", "--log-level", "warn"])
        self._spawn("kube-apiserver", [
            str(self.binaries.kube_apiserver), "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(api_port),
            "--cert-dir", str(pki), "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"), "--client-ca-file", str(pki / "ca.crt"),
            "--authorization-mode", "Node,RBAC", "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(pki / "sa.crt"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--disable-admission-plugins", "ServiceAccount", "--allow-privileged=true", "--profiling=false",
            "--service-cluster-ip-range", "10.96.0.0/24", "--endpoint-reconciler-type", "none",
            *self.extra_apiserver_args])
        self.kubeconfig_for(*ADMIN).rename(self.kubeconfig)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        daemon = Daemon(name, argv, self._dir() / f"{name}.log")
        daemon.start()
        self._daemons.append(daemon)

    def _wait_ready(self, timeout: float) -> None:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        admin = client_cert(self._ca, *ADMIN)
        cert, key = self._dir() / "pki/ready.crt", self._dir() / "pki/ready.key"
        cert.write_bytes(admin.cert_pem)
        key.write_bytes(admin.key_pem)
        ctx.load_cert_chain(cert, key)
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            for daemon in self._daemons:
                if daemon.exit_code() is not None:
                    raise ControlPlaneError(f"{daemon.name} exited ({daemon.exit_code()}):\n{daemon.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=ctx, timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            if time.monotonic() > deadline:
                logs = "\n".join(f"--- {d.name}:\n{d.tail()}" for d in self._daemons)
                raise ControlPlaneError(f"kube-apiserver not ready within {timeout:.0f} s ({last}):\n{logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Stop the API server, then etcd, and remove the directory."""
        for daemon in reversed(self._daemons):
            daemon.stop()
        self._daemons.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
