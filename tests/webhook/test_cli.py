"""``numapin certs`` and ``numapin webhook`` as an operator runs them (real processes, real TLS)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import yaml
from cryptography import x509

ROOT = Path(__file__).resolve().parents[2]


def numapin(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numapin", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_certs_writes_a_usable_bundle(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    r = numapin("certs", "--namespace", "numapin", "--service", "numapin-webhook", "--out-dir", str(out),
                "--webhook-config", str(ROOT / "manifests/webhook/webhook-configurations.yaml"))
    assert r.returncode == 0, r.stderr
    assert (out / "tls.key").stat().st_mode & 0o777 == 0o600
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName)
    assert "numapin-webhook.numapin.svc" in names
    bundle = (out / "ca-bundle.txt").read_text().strip()
    assert base64.b64decode(bundle) == (out / "ca.crt").read_bytes()
    secret = yaml.safe_load((out / "secret.yaml").read_text())
    kubernetes_validate.validate(secret, "1.30.0", strict=True)
    assert secret["type"] == "kubernetes.io/tls" and secret["metadata"]["name"] == "numapin-webhook-tls"
    configs = list(yaml.safe_load_all((out / "webhook-configurations.yaml").read_text()))
    for cfg in configs:
        kubernetes_validate.validate(cfg, "1.30.0", strict=True)
        assert "cert-manager.io/inject-ca-from" not in cfg["metadata"].get("annotations", {})
        assert all(w["clientConfig"]["caBundle"] == bundle for w in cfg["webhooks"])
    # a server presenting it is trusted by a client that trusts the bundle, under the service name
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(out / "tls.crt", out / "tls.key")


def test_certs_prints_without_out_dir() -> None:
    r = numapin("certs")
    assert r.returncode == 0 and "kind: Secret" in r.stdout and "caBundle" in r.stdout


def test_certs_bad_input_exits_2() -> None:
    r = numapin("certs", "--service", "Bad_Name")
    assert r.returncode == 2 and "--service" in r.stderr and "Traceback" not in r.stderr
    r = numapin("certs", "--days", "0")
    assert r.returncode == 2 and "--days" in r.stderr


def test_webhook_bad_input_exits_2(tmp_path: Path) -> None:
    r = numapin("webhook", "--cert", "x", "--key", "y")
    assert r.returncode == 2 and "--nrt-dir" in r.stderr
    r = numapin("webhook", "--cert", str(tmp_path / "missing.crt"), "--key", str(tmp_path / "missing.key"),
                "--nrt-dir", str(tmp_path), "--port", "0")
    assert r.returncode == 2 and "cannot serve" in r.stderr and "Traceback" not in r.stderr
    r = numapin("webhook", "--cert", "x", "--key", "y", "--nrt-dir", str(tmp_path / "nope"))
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = numapin("webhook", "--cert", "x", "--key", "y", "--nrt-dir", str(tmp_path), "--feature-gates", "Bogus=true")
    assert r.returncode == 2 and "unrecognized feature gate 'Bogus'" in r.stderr and "Traceback" not in r.stderr


def test_webhook_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    assert numapin("certs", "--out-dir", str(certs)).returncode == 0
    nrt = tmp_path / "nrt"
    nrt.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "numapin", "webhook", "--cert", str(certs / "tls.crt"), "--key",
         str(certs / "tls.key"), "--host", "127.0.0.1", "--port", str(port), "--nrt-dir", str(nrt)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    ctx.check_hostname = False  # urllib cannot set SNI apart from the host; the chain is still verified
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=ctx, timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.1)
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "abc", "operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"},
            "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}}}).encode()
        req = urllib.request.Request(f"https://127.0.0.1:{port}/mutate", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            answer = json.loads(r.read())
        assert answer["response"]["uid"] == "abc" and answer["response"]["allowed"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
    assert rc == 0


def _serve_webhook(tmp_path: Path, certs: Path, *extra: str) -> tuple[subprocess.Popen[str], int]:
    nrt = tmp_path / "nrt"
    nrt.mkdir(exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "numapin", "webhook", "--cert", str(certs / "tls.crt"), "--key",
         str(certs / "tls.key"), "--host", "127.0.0.1", "--port", str(port), "--nrt-dir", str(nrt), *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    for _ in range(300):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, port
        except OSError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
    raise AssertionError("the webhook did not listen")


def _healthz_by_ip(port: int, ca: Path) -> int:
    """GET /healthz at https://127.0.0.1:<port> with full verification: chain and host name (an IP, so the
    certificate must carry it as an IP SAN)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=10) as r:
        return r.status


def test_certs_ip_sans_let_a_client_connect_by_address(tmp_path: Path) -> None:
    """`--ip-address` and an IP literal given to `--dns-name` become IP SANs; a TLS client that connects by address
    and checks the host name accepts the webhook's certificate, and refuses one without the address."""
    by_flag, by_dns, without = tmp_path / "by-flag", tmp_path / "by-dns", tmp_path / "without"
    r = numapin("certs", "--out-dir", str(by_flag), "--ip-address", "127.0.0.1", "--ip-address", "fd00::10")
    assert r.returncode == 0, r.stderr
    assert "IP:127.0.0.1, IP:fd00::10" in r.stdout
    assert numapin("certs", "--out-dir", str(by_dns), "--dns-name", "127.0.0.1").returncode == 0
    assert numapin("certs", "--out-dir", str(without), "--dns-name", "webhook.example").returncode == 0
    for d in (by_flag, by_dns):
        cert = x509.load_pem_x509_certificate((d / "tls.crt").read_bytes())
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "127.0.0.1" not in sans.get_values_for_type(x509.DNSName)
        assert "127.0.0.1" in [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    for d, trusted in ((by_flag, True), (by_dns, True), (without, False)):
        proc, port = _serve_webhook(tmp_path, d)
        try:
            if trusted:
                assert _healthz_by_ip(port, d / "ca.crt") == 200
            else:
                try:
                    _healthz_by_ip(port, d / "ca.crt")
                except urllib.error.URLError as e:
                    assert isinstance(e.reason, ssl.SSLCertVerificationError), e
                    assert "IP address mismatch" in str(e.reason), e
                else:
                    raise AssertionError("a certificate without the address was accepted")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0


def test_certs_bad_ip_address_exits_2() -> None:
    r = numapin("certs", "--ip-address", "10.0.0.300")
    assert r.returncode == 2 and "--ip-address" in r.stderr and "Traceback" not in r.stderr


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _listening(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on ``port`` (from /proc/net/tcp and its descriptors)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
            inodes.add(f"socket:[{fields[9]}]")
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            if os.readlink(fd) in inodes:
                return True
    return False


def workers_listening(supervisor: subprocess.Popen[str], port: int, count: int) -> list[int]:
    """The pids of the supervisor's ``count`` workers, once all of them listen on ``port`` (bounded: 60 s)."""
    workers = [int(p) for p in subprocess.run(["ps", "--ppid", str(supervisor.pid), "-o", "pid="],
                                              capture_output=True, text=True).stdout.split()]
    assert len(workers) == count
    for _ in range(600):
        if all(_listening(w, port) for w in workers):
            break
        time.sleep(0.1)
    assert all(_listening(w, port) for w in workers)
    return workers


_WORKER_START = """
import ctypes, os
from webhook.https.workers import SUPERVISOR_ENV, end_with_supervisor
why = end_with_supervisor()
sig = ctypes.c_int(-1)
ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
print(f"{why}|{sig.value}|{SUPERVISOR_ENV in os.environ}")
"""


def _worker_start(supervisor: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMAPIN_WEBHOOK_SUPERVISOR"}
    if supervisor is not None:
        env["NUMAPIN_WEBHOOK_SUPERVISOR"] = supervisor
    out = subprocess.run([sys.executable, "-c", _WORKER_START], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**env, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split("|")


def test_a_worker_ends_with_its_supervisor_and_refuses_to_start_without_it() -> None:
    """The first thing a worker does: SIGTERM when its parent dies, then the parent checked to be the supervisor
    (one that died before that request would leave the worker running for ever); the variable is not passed on."""
    assert _worker_start(str(os.getpid())) == ["None", str(int(signal.SIGTERM)), "False"]
    why, _, passed_on = _worker_start("1")  # a parent that is not pid 1: as if the supervisor were gone
    assert why == "the supervisor (pid 1) ended before this worker started" and passed_on == "False"
    assert _worker_start("12a")[0] == "$NUMAPIN_WEBHOOK_SUPERVISOR='12a' is not a process id"
    assert _worker_start(None) == ["None", "0", "False"]  # a webhook on its own: nothing asked of the kernel


def test_webhook_workers_share_the_port_and_stop_together(tmp_path: Path) -> None:
    """--workers 2: two webhook processes listen on one port (the kernel spreads connections over them: the
    benchmark shows the throughput); SIGTERM stops both (status 0); a worker killed with -9 makes the supervisor stop
    the other and exit non-zero (the container restarts); a supervisor killed with -9 takes its workers along."""
    certs = tmp_path / "certs"
    assert numapin("certs", "--out-dir", str(certs), "--ip-address", "127.0.0.1").returncode == 0
    assert numapin("webhook", "--cert", str(certs / "tls.crt"), "--key", str(certs / "tls.key"), "--nrt-dir",
                   str(tmp_path), "--port", "0", "--workers", "2").returncode == 2
    for ending in ("sigterm", "worker killed", "supervisor killed"):
        proc, port = _serve_webhook(tmp_path, certs, "--workers", "2")
        workers: list[int] = []
        try:
            workers = workers_listening(proc, port, 2)
            assert _healthz_by_ip(port, certs / "ca.crt") == 200
            if ending == "sigterm":
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(30) == 0
            elif ending == "worker killed":
                os.kill(workers[0], signal.SIGKILL)
                assert proc.wait(30) != 0
            else:
                proc.kill()
                proc.wait(10)
            for _ in range(300):  # the workers end (bounded: 30 s)
                if not any(_alive(w) for w in workers):
                    break
                time.sleep(0.1)
            assert not any(_alive(w) for w in workers)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            for w in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w, signal.SIGKILL)
