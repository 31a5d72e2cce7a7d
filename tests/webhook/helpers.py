"""Shared test helpers: PKI on disk, a running webhook over real TLS, AdmissionReview bodies as kube-apiserver
sends them."""

from __future__ import annotations

import json
import ssl
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from numapin_lab.demo import admission
from numapin_lab.demo.admission import binding_request as binding_request  # one builder for the demo and the tests
from webhook.https.certs import make_ca, make_serving_cert, service_dns_names

if TYPE_CHECKING:
    from webhook.app import WebhookApp

SERVICE, NAMESPACE = "numapin-webhook", "numapin"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"


@dataclass
class PKI:
    dir: Path
    ca_pem: bytes
    ca: Any

    @property
    def cert(self) -> Path:
        return self.dir / "tls.crt"

    @property
    def key(self) -> Path:
        return self.dir / "tls.key"

    def issue(self) -> int:
        """Write a fresh serving pair (same CA); returns its serial."""
        pair = make_serving_cert(self.ca, service_dns_names(SERVICE, NAMESPACE))
        tmp_c, tmp_k = self.dir / ".tls.crt.tmp", self.dir / ".tls.key.tmp"
        tmp_c.write_bytes(pair.cert_pem)
        tmp_k.write_bytes(pair.key_pem)
        tmp_k.replace(self.key)
        tmp_c.replace(self.cert)
        return pair.certificate.serial_number

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())


def make_pki(tmp: Path) -> PKI:
    ca = make_ca()
    pki = PKI(dir=tmp, ca_pem=ca.cert_pem, ca=ca)
    pki.issue()
    return pki


def review(request: dict[str, Any], api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": "AdmissionReview", "request": request}


def pod_request(pod: dict[str, Any], *, operation: str = "CREATE", old: dict[str, Any] | None = None,
                with_uid: bool = False, dry_run: bool = False) -> dict[str, Any]:
    """``request`` of a pods CREATE/UPDATE review as kube-apiserver builds it (the demo's builder); ``with_uid``
    gives the pod a uid first, as the API server has by the time a pods/binding is judged."""
    meta = pod.setdefault("metadata", {})
    if with_uid:
        meta.setdefault("uid", str(uuid.uuid4()))
    return admission.pod_request(pod, operation=operation, old=old, dry_run=dry_run)




def container(name: str, cpu: str | None = None, mem: str | None = "1Gi", *, limits_only: bool = False,
              cpu_limit: str | None = None) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if cpu is not None or mem is not None:
        lim = {k: v for k, v in (("cpu", cpu_limit or cpu), ("memory", mem)) if v is not None}
        res["limits"] = lim
        if not limits_only:
            res["requests"] = {k: v for k, v in (("cpu", cpu), ("memory", mem)) if v is not None}
    return {"name": name, "image": "registry.k8s.io/pause:3.9", "resources": res,
            "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"}


def make_pod(name: str, containers: list[dict[str, Any]], *, annotations: dict[str, str] | None = None,
             init: list[dict[str, Any]] | None = None, namespace: str = "default",
             node_selector: dict[str, str] | None = None, node_name: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"app": name}}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"containers": containers, "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
                            "schedulerName": "default-scheduler", "terminationGracePeriodSeconds": 30}
    if init:
        spec["initContainers"] = init
    if node_selector:
        spec["nodeSelector"] = node_selector
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": {}}


class Client:
    """A real HTTPS client for the webhook (keep-alive session)."""

    def __init__(self, port: int, pki: PKI, session: aiohttp.ClientSession) -> None:
        self.base = f"https://127.0.0.1:{port}"
        self.pki = pki
        self.ctx = pki.client_context()
        self.session = session

    async def post(self, path: str, body: Any, *, content_type: str = "application/json",
                   raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else json.dumps(body).encode()
        async with self.session.post(self.base + path, data=data, headers={"Content-Type": content_type},
                                     ssl=self.ctx, server_hostname=SERVER_NAME) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text)
            except ValueError:
                return r.status, text

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(self.base + path, ssl=self.ctx, server_hostname=SERVER_NAME) as r:
            return r.status, await r.text()

    async def admit(self, path: str, request: dict[str, Any], api_version: str = "admission.k8s.io/v1"
                    ) -> dict[str, Any]:
        status, body = await self.post(path, review(request, api_version))
        assert status == 200, (status, body)
        assert body["apiVersion"] == api_version and body["kind"] == "AdmissionReview"
        response = body["response"]
        assert response["uid"] == request["uid"]
        return response


def apply_patch(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the JSON patch of an AdmissionReview ``response`` applied (the jsonpatch library, through the
    demo's applier)."""
    result: dict[str, Any] = admission.apply_patch(obj, admission.AdmissionAnswer.of(response).patch)
    return result


def cluster_webhook(tmp_path: Path) -> WebhookApp:
    """A webhook (not serving; its sources still to sync) over ``nrt_fixtures.write_cluster``'s three nodes, its
    certificate and the documents written under ``tmp_path``: for the tests that call its decisions directly."""
    from tests.webhook.nrt_fixtures import write_cluster
    from webhook.app import WebhookApp, WebhookOptions

    (tmp_path / "tls").mkdir()
    (tmp_path / "nrt").mkdir()
    pki = make_pki(tmp_path / "tls")
    write_cluster(tmp_path / "nrt")
    return WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, nrt_dir=tmp_path / "nrt"))
