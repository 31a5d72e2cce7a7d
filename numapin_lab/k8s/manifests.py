"""numapin's manifests (``manifests/``) applied to a lab control plane as an operator would apply them, with what a
lab cannot have replaced: the webhooks are called by URL on loopback (no Service networking here) with the lab's
caBundle; everything else (rules, matchConditions, failure policies, RBAC rules) is the manifests' own."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import yaml

from numapin_lab.k8s.control_plane import ControlPlane

__all__ = ["CRIPROXY_RBAC", "MANIFESTS", "NRI_RBAC", "SCHEDULER_EXTENDER", "WEBHOOK_CONFIGURATIONS", "WEBHOOK_RBAC",
           "apply", "docs", "scheduler_extender_by_url", "webhook_configurations_by_url"]

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
WEBHOOK_CONFIGURATIONS = MANIFESTS / "webhook/webhook-configurations.yaml"
WEBHOOK_RBAC = MANIFESTS / "webhook/rbac.yaml"
CRIPROXY_RBAC = MANIFESTS / "criproxy/installer-daemonset.yaml"
NRI_RBAC = MANIFESTS / "nri/daemonset.yaml"
SCHEDULER_EXTENDER = MANIFESTS / "scheduler/kube-scheduler-extender.yaml"
_CLUSTER_RBAC = ("ClusterRole", "ClusterRoleBinding")


def docs(path: Path, kinds: tuple[str, ...] = _CLUSTER_RBAC) -> list[dict[str, Any]]:
    """The documents of ``path`` of these kinds (default: the cluster-wide RBAC ones)."""
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and d.get("kind") in kinds]


def scheduler_extender_by_url(base_url: str, ca_file: Path) -> dict[str, Any]:
    """The ``extenders`` entry of manifests/scheduler/kube-scheduler-extender.yaml with its ``urlPrefix`` replaced
    by ``base_url`` and its CA by ``ca_file`` (the lab's certificate names 127.0.0.1, not the Service: no
    ``serverName``)."""
    (entry,) = docs(SCHEDULER_EXTENDER, ("KubeSchedulerConfiguration",))[0]["extenders"]
    entry = copy.deepcopy(entry) | {"urlPrefix": base_url}
    entry["tlsConfig"] = {k: v for k, v in entry["tlsConfig"].items() if k != "serverName"} | {"caFile": str(ca_file)}
    return dict(entry)


def webhook_configurations_by_url(base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """manifests/webhook/webhook-configurations.yaml with each webhook's ``clientConfig.service`` replaced by
    ``url = base_url + its path`` and the caBundle filled in."""
    out = []
    bundle = base64.b64encode(ca_pem).decode("ascii")
    for doc in docs(WEBHOOK_CONFIGURATIONS, ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")):
        doc = copy.deepcopy(doc)
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base_url.rstrip("/") + path, "caBundle": bundle}
        out.append(doc)
    return out


def apply(cp: ControlPlane, documents: list[dict[str, Any]]) -> None:
    """``kubectl apply`` the documents as the admin."""
    cp.kubectl("apply", "--validate=false", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                          "items": documents}))
