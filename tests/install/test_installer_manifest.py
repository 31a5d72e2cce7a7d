"""No manifest puts numapin's proxy in a pod kubelet runs (kubelet would need the proxy to re-create the proxy), and
the installer DaemonSet is wired to what scripts/build-image.sh puts in the image and scripts/node/install.sh takes."""

from __future__ import annotations

import copy
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
POD_OWNERS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}


def _objects() -> Iterator[tuple[Path, dict[str, Any]]]:
    for p in sorted(MANIFESTS.rglob("*.y*ml")):
        for d in yaml.safe_load_all(p.read_text()):
            if isinstance(d, dict) and "metadata" in d:  # not kustomization.yaml, not kubelet's configuration
                yield p, d


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj.get("kind") == "Pod":
        return [obj["spec"]]
    if obj.get("kind") in POD_OWNERS:
        return [obj["spec"]["template"]["spec"]]
    if obj.get("kind") == "CronJob":
        return [obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]]
    return []


def runs_the_proxy(pod: dict[str, Any]) -> list[str]:
    """The containers of ``pod`` that would run ``numapin criproxy`` (as the image's entrypoint's argument, or named
    in a command line, shell included)."""
    found = []
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        words = [w for part in c.get("command", []) + c.get("args", []) for w in shlex.split(part)]
        if "criproxy" in words:
            found.append(c["name"])
    return found


def test_no_manifest_runs_the_proxy_in_a_pod() -> None:
    offenders = [(str(p.relative_to(ROOT)), d["metadata"]["name"], c) for p, d in _objects()
                 for pod in _pod_specs(d) for c in runs_the_proxy(pod)]
    assert offenders == []


def test_the_check_finds_a_proxy_in_a_pod() -> None:
    [ds] = [d for _, d in _objects()
            if d.get("kind") == "DaemonSet" and d["metadata"]["name"] == "numapin-node-installer"]
    pod = copy.deepcopy(ds["spec"]["template"]["spec"])
    pod["containers"][0]["args"] = ["criproxy", "--config", "/etc/numapin/criproxy.yaml"]
    assert runs_the_proxy(pod) == ["install"]
    pod["containers"][0].update(command=["/bin/sh", "-c"], args=["exec numapin criproxy --listen /x.sock"])
    assert runs_the_proxy(pod) == ["install"]


def test_the_installer_only_installs_through_the_hosts_systemd_and_sleeps() -> None:
    objs = {(d["kind"], d["metadata"]["name"]): d for _, d in _objects()}
    ds = objs[("DaemonSet", "numapin-node-installer")]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is False
    assert pod["nodeSelector"]["numapin.io/node"] == "true"
    [c] = pod["containers"]
    assert c["command"] == ["/bin/sh", "-c"]
    [script] = c["args"]
    install, _, tail = script.partition("&&")
    assert shlex.split(tail) == ["exec", "sleep", "infinity"]
    argv = shlex.split(install)
    opts = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert argv[0] == opts["--from"] + "/share/numapin/install.sh"
    assert opts["--mode"] == "proxy"  # a node that ran the NRI plugin as a host service is switched, not upgraded
    # where build-image.sh puts the node install in the image
    build = (ROOT / "scripts/build-image.sh").read_text()
    assert f'--prefix "$layer{opts["--from"]}"' in build  # built there
    assert f'cp -a "$NODE_INSTALL" "$layer{opts["--from"]}"' in build  # or one built before copied there
    assert shlex.split(opts["--systemctl"])[:3] == ["nsenter", "--target", "1"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    host = next(n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/")
    assert mounts[host] == opts["--host-root"]
    settings = next(n for n, v in volumes.items() if "configMap" in v)
    assert Path(opts["--config"]).parent == Path(mounts[settings])
    cm = objs[("ConfigMap", volumes[settings]["configMap"]["name"])]
    assert Path(opts["--config"]).name in cm["data"]
    assert c["securityContext"]["privileged"] is True
    # the pod never serves anything and never touches kubelet's configuration
    assert "ports" not in c and "livenessProbe" not in c
