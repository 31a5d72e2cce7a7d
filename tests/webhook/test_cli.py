"""``numapin certs`` and ``numapin webhook`` as an operator runs them (real processes, real TLS)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
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
