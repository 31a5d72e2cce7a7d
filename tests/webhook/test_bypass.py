"""/validate: numapin.io/bypass is a privilege of --bypass-namespaces (and --bypass-service-accounts), over real
TLS."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

from allocator.bypass import BypassPolicy
from tests.webhook.helpers import Client, container, make_pod, pod_request
from webhook.app import WebhookApp

ROOT = Path(__file__).resolve().parents[2]
BYPASS = "numapin.io/bypass"


def bypass_pod(namespace: str, value: str = "true", account: str | None = None) -> dict:
    pod = make_pod("agent", [container("c", "2")], annotations={BYPASS: value}, namespace=namespace)
    if account is not None:
        pod["spec"]["serviceAccountName"] = account
    return pod


async def test_bypass_outside_the_listed_namespaces_is_denied_on_create_naming_the_rule_and_the_flag(
        client: Client) -> None:
    for value in ("true", " TRUE "):
        resp = await client.admit("/validate", pod_request(bypass_pod("tenant-a", value), with_uid=True))
        assert resp["allowed"] is False
        status = resp["status"]
        assert (status["code"], status["reason"]) == (422, "Invalid")
        [cause] = status["details"]["causes"]
        assert cause["field"] == f"metadata.annotations[{BYPASS}]" and cause["reason"] == "FieldValueForbidden"
        assert "is a privilege" in cause["message"] and "--bypass-namespaces (numapin)" in cause["message"]
        assert "not namespace tenant-a" in cause["message"]
    # its own namespace (the default list) may; "false" asks nothing
    assert (await client.admit("/validate", pod_request(bypass_pod("numapin"), with_uid=True)))["allowed"] is True
    assert (await client.admit("/validate", pod_request(bypass_pod("tenant-a", "false"),
                                                        with_uid=True)))["allowed"] is True


async def test_bypass_set_by_an_update_is_denied_one_set_before_is_not_in_the_way(client: Client) -> None:
    old = make_pod("agent", [container("c", "2")], namespace="tenant-a")
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {BYPASS: "true"}
    resp = await client.admit("/validate", pod_request(new, operation="UPDATE", old=old))
    assert resp["allowed"] is False and "--bypass-namespaces" in resp["status"]["message"]
    # a pod that carries it (created before the rule) can still be updated (finalizers, labels), with a warning
    relabelled = copy.deepcopy(new)
    relabelled["metadata"]["labels"]["x"] = "y"
    resp = await client.admit("/validate", pod_request(relabelled, operation="UPDATE", old=new))
    assert resp["allowed"] is True and any("the node ignores it" in w for w in resp["warnings"])
    resp = await client.admit("/validate", pod_request(copy.deepcopy(old), operation="UPDATE", old=new))
    assert resp["allowed"] is True


async def test_the_request_namespace_counts_not_the_pods_metadata(client: Client) -> None:
    """kube-apiserver's request namespace is the pod's; an object claiming another is judged by the request's."""
    req = pod_request(bypass_pod("numapin"), with_uid=True)
    req["namespace"] = "tenant-a"
    assert (await client.admit("/validate", req))["allowed"] is False


async def test_service_accounts_narrow_the_listed_namespaces(server: WebhookApp, client: Client) -> None:
    server.pod_validator.bypass = BypassPolicy(namespaces=frozenset({"ops"}),
                                               service_accounts=frozenset({("ops", "node-agent")}))
    ok = await client.admit("/validate", pod_request(bypass_pod("ops", account="node-agent"), with_uid=True))
    assert ok["allowed"] is True
    resp = await client.admit("/validate", pod_request(bypass_pod("ops", account="builder"), with_uid=True))
    assert resp["allowed"] is False
    message = resp["status"]["message"]
    assert "--bypass-service-accounts (ops:node-agent)" in message and "not builder" in message
    resp = await client.admit("/validate", pod_request(bypass_pod("ops"), with_uid=True))  # the default account
    assert resp["allowed"] is False and "not default" in resp["status"]["message"]


def test_bad_bypass_flags_exit_2(tmp_path: Path) -> None:
    for flag, value in (("--bypass-namespaces", "Tenant_A"), ("--bypass-service-accounts", "ops")):
        r = subprocess.run([sys.executable, "-m", "numapin", "webhook", "--cert", "x", "--key", "y", "--nrt-dir",
                            str(tmp_path), flag, value], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and flag in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_webhooks_own_namespace_is_the_default(monkeypatch) -> None:
    from webhook.cli import own_namespace

    monkeypatch.setenv("POD_NAMESPACE", "platform")
    assert own_namespace() == "platform"
