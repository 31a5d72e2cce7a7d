"""Every manifest under manifests/ (the webhook's and the node proxy's) validated offline.

- Kinds Kubernetes ships (Deployment, Service, RBAC, webhook configurations, CRDs, DaemonSets...): against the
  Kubernetes JSON schemas bundled with kubernetes-validate, strict (unknown fields fail), for the oldest and the
  newest Kubernetes version supported here.
- Kinds defined by a CRD found under manifests/ (NodeResourceTopology): against that CRD's openAPIV3Schema.
- cert-manager kinds (their CRDs are not shipped here): structural checks of the fields numapin relies on
  (issuer references, secret names, DNS names, CA injection), since no schema is available offline.
- KubeletConfiguration (no schema in kubernetes-validate either): structural check of the fields numapin needs.
- KubeSchedulerConfiguration (the extender snippet; no schema either): structural check of numapin's extender entry
  (the real kube-scheduler reads it in tests/k8s/test_kubelet_admission.py).
- PrometheusRule (the Prometheus Operator's CRD is not shipped here): structural check; its rules are checked by
  promtool in tests/monitoring, as is the plain rules file ``*.rules.yaml`` (not a Kubernetes object).
Any other kind without a schema fails the test. Cross-references (Service, Secret, Certificate, ServiceAccount
names used by other objects) are checked too.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from allocator.cpuset import CPUSet
from allocator.nrt import build_nrt
from tests.webhook.nrt_fixtures import machine

ROOT = Path(__file__).resolve().parents[2] / "manifests"
K8S_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())


def _files() -> list[Path]:
    """The Kubernetes objects (kustomization.yaml, not one, is checked by test_kustomize.py; Prometheus rule files
    by tests/monitoring)."""
    return sorted(p for p in ROOT.rglob("*") if p.suffix in (".yaml", ".yml", ".json") and p.is_file()
                  and p.name != "kustomization.yaml" and not p.name.endswith(".rules.yaml"))


def _docs(path: Path) -> Iterator[dict[str, Any]]:
    for d in yaml.safe_load_all(path.read_text()):
        if d is not None:
            assert isinstance(d, dict), f"{path}: a document is not a mapping"
            yield d


def _all_docs() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in _files() for d in _docs(p)]


def _crd_schemas() -> dict[tuple[str, str, str], dict[str, Any]]:
    """(group, version, kind) -> openAPIV3Schema, from the CRDs under manifests/."""
    out = {}
    for _, d in _all_docs():
        if d.get("kind") == "CustomResourceDefinition":
            spec = d["spec"]
            for v in spec["versions"]:
                out[(spec["group"], v["name"], spec["names"]["kind"])] = v["schema"]["openAPIV3Schema"]
    return out


def _to_jsonschema(schema: Any) -> Any:
    """openAPIV3Schema -> JSON schema: drop the x-kubernetes-* extensions, keep the rest."""
    if isinstance(schema, dict):
        return {k: _to_jsonschema(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if isinstance(schema, list):
        return [_to_jsonschema(v) for v in schema]
    return schema


def _check_cert_manager(doc: dict[str, Any], by_kind: dict[str, dict[str, dict[str, Any]]]) -> None:
    kind, spec = doc["kind"], doc.get("spec")
    assert doc["apiVersion"] == "cert-manager.io/v1", doc["apiVersion"]
    assert isinstance(doc["metadata"].get("name"), str)
    assert isinstance(spec, dict), f"{kind}.spec"
    if kind in ("Issuer", "ClusterIssuer"):
        kinds = [k for k in ("selfSigned", "ca", "acme", "vault", "venafi") if k in spec]
        assert len(kinds) == 1, f"{kind} {doc['metadata']['name']} must have exactly one issuer type, has {kinds}"
        if "ca" in spec:
            assert isinstance(spec["ca"].get("secretName"), str)
    elif kind == "Certificate":
        assert isinstance(spec.get("secretName"), str)
        ref = spec.get("issuerRef")
        assert isinstance(ref, dict) and isinstance(ref.get("name"), str)
        assert ref.get("kind", "Issuer") in ("Issuer", "ClusterIssuer")
        assert ref.get("group", "cert-manager.io") == "cert-manager.io"
        issuers = by_kind.get(ref.get("kind", "Issuer"), {})
        assert ref["name"] in issuers, f"Certificate {doc['metadata']['name']}: issuer {ref['name']} not defined"
        assert spec.get("dnsNames") or spec.get("commonName")
        for f in ("duration", "renewBefore"):
            if f in spec:
                assert isinstance(spec[f], str) and spec[f][-1] in "hms", f
        pk = spec.get("privateKey", {})
        assert pk.get("algorithm", "RSA") in ("RSA", "ECDSA", "Ed25519")
    else:
        pytest.fail(f"no check for cert-manager kind {kind}")


def _check_kubelet_config(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "kubelet.config.k8s.io/v1beta1"
    if "cpuManagerPolicy" in doc:
        assert doc["cpuManagerPolicy"] == "none", "numapin needs kubelet's CPU manager policy none"
    if "containerRuntimeEndpoint" in doc:
        assert isinstance(doc["containerRuntimeEndpoint"], str)
        assert doc["containerRuntimeEndpoint"].startswith("unix://")


def _check_scheduler_config(doc: dict[str, Any], by_kind: dict[str, dict[str, dict[str, Any]]]) -> None:
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    (entry,) = doc["extenders"]
    assert entry["filterVerb"] == "filter" and entry["nodeCacheCapable"] is True and entry["ignorable"] is True, entry
    assert entry["enableHTTPS"] is True and entry["tlsConfig"].get("caFile") and not entry["tlsConfig"].get("insecure")
    assert not {"prioritizeVerb", "bindVerb", "preemptVerb", "managedResources"} & set(entry), entry
    svc = by_kind["Service"]["numapin-webhook"]
    name = f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc"
    assert entry["urlPrefix"] == f"https://{name}:{svc['spec']['ports'][0]['port']}", entry["urlPrefix"]
    assert entry["tlsConfig"]["serverName"] == name


def _check_prometheus_rule(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    groups = doc["spec"]["groups"]
    assert groups and all(isinstance(g["name"], str) and g["rules"] for g in groups)
    for rule in (r for g in groups for r in g["rules"]):
        assert ("alert" in rule) != ("record" in rule) and isinstance(rule["expr"], str), rule


def test_there_are_manifests() -> None:
    kinds = {d["kind"] for _, d in _all_docs()}
    assert {"Namespace", "Deployment", "PodDisruptionBudget", "Service", "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration", "ClusterRole", "ClusterRoleBinding", "ServiceAccount",
            "CustomResourceDefinition", "Certificate", "Issuer"} <= kinds


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_manifest_validates(path: Path) -> None:
    crds = _crd_schemas()
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for _, d in _all_docs():
        by_kind.setdefault(d["kind"], {})[d.get("metadata", {}).get("name", "")] = d
    docs = list(_docs(path))
    assert docs, f"{path} has no documents"
    for doc in docs:
        assert {"apiVersion", "kind"} <= doc.keys(), f"{path}: apiVersion and kind are required"
        name = f"{path.name}: {doc['kind']} {doc.get('metadata', {}).get('name')}"
        group, _, version = doc["apiVersion"].rpartition("/")
        if (group, version, doc["kind"]) in crds:
            jsonschema.validate(doc, _to_jsonschema(crds[(group, version, doc["kind"])]))
            continue
        if group == "cert-manager.io":
            _check_cert_manager(doc, by_kind)
            continue
        if doc["kind"] == "KubeletConfiguration":
            _check_kubelet_config(doc)
            continue
        if doc["kind"] == "PrometheusRule":
            _check_prometheus_rule(doc)
            continue
        if doc["kind"] == "KubeSchedulerConfiguration":
            _check_scheduler_config(doc, by_kind)
            continue
        for v in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(copy.deepcopy(doc), v, strict=True)
            except SchemaNotFoundError:
                pytest.fail(f"{name}: no Kubernetes schema and no structural check for this kind")
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{name} invalid for Kubernetes {v}: {e.message} at {list(e.absolute_path)}")


def _webhook_docs() -> dict[str, dict[str, dict[str, Any]]]:
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for p, d in _all_docs():
        if p.parent.name == "webhook":
            by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    return by_kind


def test_webhook_configurations_follow_the_rules() -> None:
    docs = _webhook_docs()
    svc = docs["Service"]["numapin-webhook"]
    cert = docs["Certificate"]["numapin-webhook-tls"]
    seen_resources = set()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for cfg in docs[kind].values():
            ns, _, cname = cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].partition("/")
            assert (ns, cname) == (cert["metadata"]["namespace"], cert["metadata"]["name"])
            for w in cfg["webhooks"]:
                assert w["sideEffects"] == "None"
                assert w["admissionReviewVersions"] == ["v1"]
                assert 1 <= w["timeoutSeconds"] <= 10
                s = w["clientConfig"]["service"]
                assert (s["name"], s["namespace"]) == (svc["metadata"]["name"], svc["metadata"]["namespace"])
                assert s["port"] in [p["port"] for p in svc["spec"]["ports"]]
                assert f"{s['name']}.{s['namespace']}.svc" in cert["spec"]["dnsNames"]
                excluded = [e for e in w["namespaceSelector"]["matchExpressions"]
                            if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
                assert excluded and {"kube-system", "numapin"} <= set(excluded[0]["values"])
                for r in w["rules"]:
                    seen_resources.update((op, res) for op in r["operations"] for res in r["resources"])
    assert {("CREATE", "pods"), ("UPDATE", "pods"), ("CREATE", "pods/binding")} <= seen_resources


def test_deployment_is_hardened_and_wired() -> None:
    docs = _webhook_docs()
    dep = docs["Deployment"]["numapin-webhook"]
    spec = dep["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["serviceAccountName"] in docs["ServiceAccount"]
    secret = next(v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v)
    assert secret == docs["Certificate"]["numapin-webhook-tls"]["spec"]["secretName"]
    pdb = docs["PodDisruptionBudget"]["numapin-webhook"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert docs["Service"]["numapin-webhook"]["spec"]["selector"].items() <= \
        spec["template"]["metadata"]["labels"].items()
    # the args parse with the real CLI
    from numapin.cli import build_parser

    args = build_parser().parse_args(c["args"])
    assert args.command == "webhook" and args.in_cluster
    rules = docs["ClusterRole"]["numapin-webhook"]["rules"]
    assert any("noderesourcetopologies" in r["resources"] and "watch" in r["verbs"] for r in rules)
    assert any("pods" in r["resources"] and {"get", "list", "watch"} <= set(r["verbs"]) for r in rules)


def test_network_policy_admits_only_the_webhook_port_of_the_webhook_pods() -> None:
    docs = _webhook_docs()
    policy = docs["NetworkPolicy"]["numapin-webhook"]["spec"]
    pod = docs["Deployment"]["numapin-webhook"]["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    (port,) = rule["ports"]
    (container,) = pod["spec"]["containers"]
    assert port["port"] == next(p["containerPort"] for p in container["ports"] if p["name"] == "https")
    assert all(set(peer) == {"ipBlock"} for peer in rule["from"]), "only addresses (the control plane), no pods"


def test_crd_is_api_approved_and_accepts_published_documents() -> None:
    crd = next(d for _, d in _all_docs() if d.get("kind") == "CustomResourceDefinition"
               and d["spec"]["group"] == "topology.node.k8s.io")
    assert crd["metadata"]["annotations"]["api-approved.kubernetes.io"]
    schema = _to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    t = machine(2, 4)
    doc = build_nrt("w", t, free_cpus=t.all_cpus - CPUSet([0]), reserved_cpus=CPUSet([0]),
                    topology_manager_policy="restricted")
    jsonschema.validate(doc, schema)
    bad = copy.deepcopy(doc)
    bad["zones"][0]["resources"][0]["available"] = "lots"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
