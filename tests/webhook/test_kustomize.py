"""manifests/kustomization.yaml rendered by a real kustomize: the one in Debian's kubectl (kubernetes-client's
``kubectl kustomize``, an old kustomize, so the file stays within what every kustomize reads)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.debian_tools import debian_program

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
IMAGE = "localhost/numapin:0.1.0"  # what scripts/build-image.sh builds by default
# a node's kubelet configuration, not an API object; a NetworkPolicy naming the control plane's addresses, which the
# operator edits before applying (a wrong CIDR would cut the API server off the webhook)
# monitoring/: the PrometheusRule needs the Prometheus Operator's CRD (its own kustomization), the plain rules file
# is for Prometheus itself
# scheduler/: kube-scheduler's configuration file, merged on the control plane (docs/webhook.md)
NOT_APPLIED = {"criproxy/kubelet-config.yaml", "webhook/networkpolicy.yaml", "monitoring/prometheusrule.yaml",
               "monitoring/numapin.rules.yaml", "scheduler/kube-scheduler-extender.yaml"}


def _key(d: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = d.get("metadata") or {}
    return d["apiVersion"], d["kind"], meta.get("namespace", ""), meta["name"]


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = debian_program("kubernetes-client", "usr/bin/kubectl")
    r = subprocess.run([str(kubectl), "kustomize", str(MANIFESTS)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_kustomization_lists_every_manifest() -> None:
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    listed = set(k["resources"])
    files = {str(p.relative_to(MANIFESTS)) for p in MANIFESTS.rglob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == files - NOT_APPLIED


def test_render_is_the_manifests_with_the_built_image(rendered: list[dict[str, Any]]) -> None:
    k = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
    sources = [d for f in k["resources"] for d in yaml.safe_load_all((MANIFESTS / f).read_text()) if d]
    assert sorted(map(_key, rendered)) == sorted(map(_key, sources))
    by_key = {_key(d): d for d in rendered}
    images = []
    for src in sources:
        out = by_key[_key(src)]
        if src["kind"] in ("Deployment", "DaemonSet"):
            images += [c["image"] for c in out["spec"]["template"]["spec"]["containers"]]
        else:
            assert out == src, f"kustomize changed {_key(src)}"
    assert images and set(images) == {IMAGE}


def test_the_nri_plugin_alone_renders_with_the_built_image() -> None:
    """manifests/nri/ (`kubectl apply -k manifests/nri/`): the NRI plugin's objects, as the top level has them."""
    kubectl = debian_program("kubernetes-client", "usr/bin/kubectl")
    r = subprocess.run([str(kubectl), "kustomize", str(MANIFESTS / "nri")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    rendered = [d for d in yaml.safe_load_all(r.stdout) if d]
    sources = [d for d in yaml.safe_load_all((MANIFESTS / "nri/daemonset.yaml").read_text()) if d]
    assert sorted(map(_key, rendered)) == sorted(map(_key, sources))
    [ds] = [d for d in rendered if d["kind"] == "DaemonSet"]
    assert [c["image"] for c in ds["spec"]["template"]["spec"]["containers"]] == [IMAGE]
