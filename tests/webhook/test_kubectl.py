"""Denials as a user reads them: the real kubectl (Debian's kubernetes-client) creates pods through a small API
server that calls the running webhook over TLS and passes its answer on the way kube-apiserver does.

The API server part reproduces what kube-apiserver does with a webhook's answer (k8s.io/apiserver
``webhook/errors.ToStatusErr``): a denial's status keeps its code (raised to 400 when lower), reason and details,
its status becomes ``Failure``, and its message is prefixed with ``admission webhook "<name>" denied the request: ``;
the answer's warnings become ``Warning: 299 - "..."`` headers. Everything kubectl prints comes from kubectl itself.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from allocator.intent import INTENT_ANNOTATION
from allocator.pod import CPU_MANAGER_ANNOTATION
from tests.debian_tools import debian_program
from tests.webhook.helpers import Client, apply_patch, container, make_pod, pod_request
from tests.webhook.nrt_fixtures import machine, nrt, write_docs
from webhook.app import WebhookApp

MUTATING, VALIDATING = "mutate.pods.numapin.io", "validate.pods.numapin.io"  # as in manifests/webhook


def to_status_error(webhook: str, status: dict[str, Any] | None) -> dict[str, Any]:
    """kube-apiserver's conversion of a webhook's denial into the Status the client receives."""
    result = copy.deepcopy(status) if status else {}
    if int(result.get("code") or 0) < 400:
        result["code"] = 400
    if result.get("status") in (None, "", "Success"):
        result["status"] = "Failure"
    denied_by = f"admission webhook {json.dumps(webhook)} denied the request"
    if result.get("message"):
        result["message"] = f"{denied_by}: {result['message']}"
    elif result.get("reason"):
        result["message"] = f"{denied_by}: {result['reason']}"
    else:
        result["message"] = f"{denied_by} without explanation"
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, **result}


class APIServer:
    """Discovery for core/v1 pods and pod creation through the webhook's /mutate and /validate."""

    def __init__(self, webhook: Client) -> None:
        self.webhook = webhook
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api", self._api)
        app.router.add_get("/apis", self._apis)
        app.router.add_get("/api/v1", self._v1)
        app.router.add_post("/api/v1/namespaces/{ns}/pods", self._create_pod)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _api(self, _: web.Request) -> web.Response:
        return web.json_response({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}]})

    async def _apis(self, _: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})

    async def _v1(self, _: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            {"name": "pods", "singularName": "", "namespaced": True, "kind": "Pod", "shortNames": ["po"],
             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]})

    async def _create_pod(self, request: web.Request) -> web.Response:
        pod = await request.json()
        pod.setdefault("metadata", {})["namespace"] = request.match_info["ns"]
        warnings: list[str] = []
        answer = await self.webhook.admit("/mutate", pod_request(copy.deepcopy(pod)))
        warnings += answer.get("warnings") or []
        if not answer["allowed"]:
            return self._denied(MUTATING, answer, warnings)
        pod = apply_patch(pod, answer)
        answer = await self.webhook.admit("/validate", pod_request(pod, with_uid=True))
        warnings += answer.get("warnings") or []
        if not answer["allowed"]:
            return self._denied(VALIDATING, answer, warnings)
        return web.json_response(pod, status=201, headers=self._warning_headers(warnings))

    def _denied(self, webhook: str, answer: dict[str, Any], warnings: list[str]) -> web.Response:
        status = to_status_error(webhook, answer.get("status"))
        return web.json_response(status, status=status["code"], headers=self._warning_headers(warnings))

    @staticmethod
    def _warning_headers(warnings: list[str]) -> Any:
        from multidict import CIMultiDict

        headers: CIMultiDict[str] = CIMultiDict()
        for w in warnings:
            headers.add("Warning", f'299 - {json.dumps(w)}')
        return headers


@dataclass
class Kubectl:
    program: Path
    kubeconfig: Path
    cache: Path
    workdir: Path

    async def create(self, pod: dict[str, Any]) -> tuple[int, str, str]:
        name = f"{pod['metadata']['name']}.yaml"
        (self.workdir / name).write_text(yaml.safe_dump(pod))
        proc = await asyncio.create_subprocess_exec(
            str(self.program), f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.cache}", "create",
            "--validate=false", "-f", name, cwd=self.workdir,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


@pytest.fixture(scope="module")
def kubectl_program() -> Path:
    """Debian's kubectl; ``NUMAPIN_TEST_KUBECTL`` names another one to check (e.g. a newer release)."""
    other = os.environ.get("NUMAPIN_TEST_KUBECTL")
    return Path(other) if other else debian_program("kubernetes-client", "usr/bin/kubectl")


@pytest.fixture
async def kubectl(server: WebhookApp, client: Client, nrt_dir: Path, tmp_path: Path,
                  kubectl_program: Path) -> AsyncIterator[Kubectl]:
    write_docs(nrt_dir / "w-0.yaml", [nrt("w-0", machine(2, 14), reserved="0,28")])
    for s in server.sources:
        await s.sync()
    api = APIServer(client)
    await api.start()
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "lab",
              "clusters": [{"name": "lab", "cluster": {"server": f"http://127.0.0.1:{api.port}"}}],
              "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "admin", "namespace": "default"}}],
              "users": [{"name": "admin", "user": {}}]}
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    work = tmp_path / "work"
    work.mkdir()
    try:
        yield Kubectl(kubectl_program, kubeconfig, tmp_path / "kube-cache", work)
    finally:
        await api.stop()


def _errors(stderr: str) -> list[str]:
    """kubectl's error lines (warnings, printed first, left out)."""
    return [line for line in stderr.splitlines() if line and not line.startswith("Warning: ")]


async def test_bad_mode_reads_as_an_invalid_pod_naming_the_field(kubectl: Kubectl) -> None:
    pod = make_pod("turbo-pod", [container("app", "2")], annotations={CPU_MANAGER_ANNOTATION: "turbo"})
    code, out, err = await kubectl.create(pod)
    assert code == 1 and out == ""
    assert _errors(err) == [
        f'The Pod "turbo-pod" is invalid: metadata.annotations[{CPU_MANAGER_ANNOTATION}]: Unsupported value: '
        '"turbo": supported values: "none", "exclusive", "share" (numapin)']


async def test_topology_refusal_reads_as_forbidden_by_the_webhook(kubectl: Kubectl) -> None:
    pod = make_pod("big", [container("app", "30")])
    code, out, err = await kubectl.create(pod)
    assert code == 1 and out == ""
    lines = _errors(err)
    assert len(lines) == 1, err
    head = (f'Error from server (Forbidden): error when creating "big.yaml": admission webhook "{VALIDATING}" '
            "denied the request: no known node can ever admit pod default/big (1 candidate node(s)): on node w-0, "
            "under topology manager policy single-numa-node (scope container), "
            'container "app" needs 30 CPUs of its own and the largest NUMA node (node-1) has 28 allocatable CPUs')
    assert lines[0].startswith(head), lines[0]


async def test_allowed_pod_with_a_warning(kubectl: Kubectl) -> None:
    pod = make_pod("lonely", [container("app", "500m")], annotations={CPU_MANAGER_ANNOTATION: "exclusive"})
    code, out, err = await kubectl.create(pod)
    assert (code, out.strip()) == (0, "pod/lonely created"), err
    warnings = [line for line in err.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 1 and "has no effect" in warnings[0], err


async def test_forged_intent_on_update_is_invalid(client: Client) -> None:
    """The intent annotation cannot change on UPDATE: an Invalid status naming the pod and the field (kubectl's
    rule for it, checked above with the CREATE case, prints `The Pod "p" is invalid: <field>: <message>`)."""
    old = make_pod("p", [container("c", "2")])
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {INTENT_ANNOTATION: "{}"}
    resp = await client.admit("/validate", pod_request(new, operation="UPDATE", old=old))
    status = resp["status"]
    assert (resp["allowed"], status["code"], status["reason"]) == (False, 422, "Invalid")
    assert status["details"]["kind"] == "Pod" and status["details"]["name"] == "p"
    assert [(c["field"], c["reason"]) for c in status["details"]["causes"]] == [
        (f"metadata.annotations[{INTENT_ANNOTATION}]", "FieldValueForbidden")]
