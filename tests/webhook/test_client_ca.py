"""Optional client authentication of a real ``numapin webhook`` process: with ``--client-ca-file`` (or its earlier
name ``--client-ca``) /mutate and /validate answer only a TLS client presenting a certificate from that CA (the API
server's, from its admission kubeconfig); the probes stay open; without the flag anyone is answered."""

from __future__ import annotations

import json
import signal
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.webhook.test_cli import _serve_webhook, numapin
from webhook.https.certs import make_ca
from webhook.https.client_certs import make_client_cert

REVIEW = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
    "uid": "abc", "operation": "CREATE", "resource": {"group": "", "version": "v1", "resource": "pods"},
    "object": {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}}}).encode()


def _client(ca: Path, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False  # urllib cannot set SNI apart from the host; the chain is still verified
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


def _post(port: int, ctx: ssl.SSLContext, path: str = "/validate") -> int:
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=REVIEW,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            assert json.loads(r.read())["response"]["uid"] == "abc"
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _get(port: int, ctx: ssl.SSLContext, path: str) -> int:
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx, timeout=10) as r:
        return r.status


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, Path]:
    certs = tmp_path / "certs"
    assert numapin("certs", "--out-dir", str(certs)).returncode == 0
    out = {"ca": certs / "ca.crt", "certs": certs}
    apiserver_ca = make_ca("apiserver-admission-client-ca")
    out["client_ca"] = tmp_path / "client-ca.crt"
    out["client_ca"].write_bytes(apiserver_ca.cert_pem)
    for name, ca in (("apiserver", apiserver_ca), ("stranger", make_ca("someone-else"))):
        pair = make_client_cert(ca)
        (tmp_path / f"{name}.crt").write_bytes(pair.cert_pem)
        (tmp_path / f"{name}.key").write_bytes(pair.key_pem)
        out[name] = tmp_path / f"{name}.crt"
        out[f"{name}_key"] = tmp_path / f"{name}.key"
    return out


@pytest.mark.parametrize("flag", ["--client-ca-file", "--client-ca"])
def test_admission_paths_answer_only_the_api_servers_certificate(tmp_path: Path, pki: dict[str, Path],
                                                                 flag: str) -> None:
    proc, port = _serve_webhook(tmp_path, pki["certs"], flag, str(pki["client_ca"]))
    try:
        apiserver = _client(pki["ca"], (pki["apiserver"], pki["apiserver_key"]))
        anonymous = _client(pki["ca"])
        stranger = _client(pki["ca"], (pki["stranger"], pki["stranger_key"]))
        assert _post(port, apiserver, "/mutate") == 200 and _post(port, apiserver, "/validate") == 200
        assert _post(port, anonymous, "/mutate") == 401 and _post(port, anonymous, "/validate") == 401
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _post(port, stranger)  # a certificate the CA did not sign: the handshake is refused
        # the kubelet's probes and Prometheus present none
        assert _get(port, anonymous, "/healthz") == 200 and _get(port, anonymous, "/metrics") == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_without_the_flag_any_client_is_answered(tmp_path: Path, pki: dict[str, Path]) -> None:
    proc, port = _serve_webhook(tmp_path, pki["certs"])
    try:
        assert _post(port, _client(pki["ca"])) == 200
        assert _post(port, _client(pki["ca"], (pki["stranger"], pki["stranger_key"]))) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_a_client_ca_that_cannot_be_read_exits_2(tmp_path: Path, pki: dict[str, Path]) -> None:
    base = ("webhook", "--cert", str(pki["certs"] / "tls.crt"), "--key", str(pki["certs"] / "tls.key"),
            "--nrt-dir", str(tmp_path), "--port", "0")
    r = numapin(*base, "--client-ca-file", str(tmp_path / "missing.crt"))
    assert r.returncode == 2 and "--client-ca-file" in r.stderr and "not a file" in r.stderr
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate")
    r = numapin(*base, "--client-ca-file", str(garbage))
    assert r.returncode == 2 and "client CA" in r.stderr and "Traceback" not in r.stderr, r.stderr
