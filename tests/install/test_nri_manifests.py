"""numapin's NRI mode as shipped (manifests/nri/): the DaemonSet's command line is one ``numapin nri`` accepts (parsed
by the real parser, its settings loaded by the real loader), every path it gives the plugin is a host path mounted
into the pod the way the plugin needs it (the NRI socket's DIRECTORY, which survives containerd's restarts; the
cgroup file system writable, /sys and /proc read-only), its policy is the proxy's (a node moves between the modes on
the same state), and no node can run both doors; the host service's unit and default settings likewise. The
Kubernetes schemas validate the objects in tests/webhook/test_manifests.py, systemd's parser the unit in
test_units.py."""

from __future__ import annotations

import shlex
from dataclasses import fields
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from nriplugin.config import NriConfig
from nriplugin.config import load_config as load_nri
from numapin.cli import build_parser
from tests.install.node_host import NRI_SETTINGS, NRI_UNIT
from tests.install.test_units import parse_unit

ROOT = Path(__file__).resolve().parents[2]
NRI_DS = ROOT / "manifests/nri/daemonset.yaml"
INSTALLER = ROOT / "manifests/criproxy/installer-daemonset.yaml"
# the node's policy: what must be the same in both modes for them to share the state
POLICY = ("state_dir", "reserved_cpus", "num_reserved_cpus", "topology_manager_policy", "topology_manager_scope",
          "topology_manager_policy_options", "cpu_manager_policy_options", "lift_cfs_quota", "memory_manager_policy",
          "reserved_memory", "metrics_address", "control_socket", "cpuset_writes", "converge_period",
          "reconcile_period")
NRI_UNIT_KEYS = {
    "Unit": {"Description", "Documentation", "After", "Wants", "Before", "StartLimitIntervalSec"},
    "Service": {"Type", "ExecStartPre", "ExecStart", "Restart", "RestartSec", "StateDirectory", "RuntimeDirectory",
                "RuntimeDirectoryPreserve", "KillSignal", "TimeoutStartSec", "TimeoutStopSec", "LimitNOFILE",
                "OOMScoreAdjust"},
    "Install": {"WantedBy"},
}


def _objects(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(path.read_text()) if d}


def _settings(text: str, tmp_path: Path, args: list[str]) -> tuple[Any, NriConfig]:
    """``numapin nri`` ARGS parsed by numapin's parser, the settings file they name given ``text``."""
    parsed = build_parser().parse_args(args)
    assert parsed.command == "nri"
    settings = tmp_path / "nri.yaml"
    settings.write_text(text)
    names = {f.name for f in fields(NriConfig)}
    overrides = {k: v for k, v in vars(parsed).items() if k in names}
    return parsed, load_nri(str(settings), overrides)


def _proxy_policy(tmp_path: Path) -> dict[str, Any]:
    from criproxy.config import load_config as load_proxy

    cm = _objects(INSTALLER)[("ConfigMap", "numapin-node")]
    f = tmp_path / "criproxy.yaml"
    f.write_text(cm["data"]["criproxy.yaml"])
    cfg = load_proxy(str(f), {})
    return {k: getattr(cfg, k) for k in POLICY}


def _mounts(pod: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any], bool]]:
    """mountPath -> (volume name, volume, read-only) of the pod's one container."""
    [c] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: (m["name"], volumes[m["name"]], bool(m.get("readOnly"))) for m in c["volumeMounts"]}


def _host_path_of(path: str, mounts: dict[str, tuple[str, dict[str, Any], bool]]) -> tuple[str, bool]:
    """Where ``path`` in the pod is on the host (through the deepest hostPath mount holding it), and whether the
    pod may write there."""
    p = PurePosixPath(path)
    best = max((m for m in mounts if p == PurePosixPath(m) or PurePosixPath(m) in p.parents),
               key=lambda m: len(PurePosixPath(m).parts), default=None)
    assert best is not None, f"{path} is on no volume of the pod"
    _, volume, ro = mounts[best]
    assert "hostPath" in volume, f"{path} is on {best}, which is not the host's"
    return str(PurePosixPath(volume["hostPath"]["path"]) / p.relative_to(best)), not ro


def test_the_daemonsets_command_line_is_numapin_nris(tmp_path: Path) -> None:
    objs = _objects(NRI_DS)
    ds = objs[("DaemonSet", "numapin-nri")]
    pod = ds["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert "command" not in c  # the image's entrypoint is numapin
    config = c["args"][c["args"].index("--config") + 1]
    mounts = _mounts(pod)
    cm_volume = mounts[str(PurePosixPath(config).parent)][1]
    cm = objs[("ConfigMap", cm_volume["configMap"]["name"])]
    _, cfg = _settings(cm["data"][PurePosixPath(config).name], tmp_path, c["args"])
    assert {k: getattr(cfg, k) for k in POLICY} == _proxy_policy(tmp_path)
    assert cfg.publish_nrt and cfg.watch_pods  # in-cluster credentials: its ServiceAccount's
    # every path the plugin uses is the host's, where the plugin needs it
    host = {what: _host_path_of(path, mounts) for what, path in (
        ("nri", str(PurePosixPath(cfg.nri_socket).parent)),
        ("cri", cfg.runtime_endpoint.removeprefix("unix://")),
        ("state", cfg.state_dir), ("control", str(PurePosixPath(str(cfg.control_path)).parent)),
        ("sysfs", cfg.sysfs), ("proc", cfg.proc_root), ("cgroup", cfg.cgroup_root),
        ("kubelet", cfg.kubelet_config), *((f"cdi{i}", d) for i, d in enumerate(cfg.cdi_dirs)))}
    assert host["nri"] == ("/var/run/nri", True)
    assert host["cri"][0] == "/run/containerd/containerd.sock"
    assert host["state"] == ("/var/lib/numapin", True) and host["control"] == ("/var/run/numapin", True)
    assert host["sysfs"] == ("/sys", False) and host["proc"] == ("/proc", False)
    assert host["cgroup"] == ("/sys/fs/cgroup", True)  # it writes running containers' cpusets in the kernel
    assert host["kubelet"] == ("/var/lib/kubelet/config.yaml", False)
    # the NRI socket's directory is mounted, not the socket: containerd re-creates the socket when it restarts
    nri_volume = mounts["/var/run/nri"][1]["hostPath"]
    assert nri_volume["path"] == "/var/run/nri" and nri_volume["type"] != "Socket"
    # /status and the probes: on the node's loopback (hostNetwork), the port of --metrics-address
    port = int(cfg.metrics_address.rpartition(":")[2])
    assert pod["hostNetwork"] is True and c["livenessProbe"]["httpGet"]["port"] == port
    ready = " ".join(c["readinessProbe"]["exec"]["command"])
    assert f"127.0.0.1:{port}/status" in ready and '"synchronized"' in ready
    # the plugin's own pod is passed through
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name", "POD_UID": "metadata.uid",
                   "NODE_NAME": "spec.nodeName"}


def test_the_plugin_pod_is_node_critical_root_and_not_privileged() -> None:
    objs = _objects(NRI_DS)
    ds = objs[("DaemonSet", "numapin-nri")]
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical" and pod["hostPID"] is True
    assert {"operator": "Exists"} in pod["tolerations"]
    [c] = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsUser"] == 0 and sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    # RBAC: what publishing the NRT, watching its node's pods and recording Events need, for its own ServiceAccount
    role = objs[("ClusterRole", "numapin-nri")]
    assert {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"]} == {
        ("topology.node.k8s.io", "noderesourcetopologies"): {"get", "list", "watch", "create", "update", "patch"},
        ("", "pods"): {"get", "list", "watch"}, ("", "events"): {"create", "patch"}}
    binding = objs[("ClusterRoleBinding", "numapin-nri")]
    assert binding["roleRef"]["name"] == "numapin-nri"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": ds["metadata"]["namespace"]}]


def test_no_node_runs_both_doors() -> None:
    """The proxy's installer and the plugin select the same label key with different values."""
    installer = _objects(INSTALLER)[("DaemonSet", "numapin-node-installer")]["spec"]["template"]["spec"]
    plugin = _objects(NRI_DS)[("DaemonSet", "numapin-nri")]["spec"]["template"]["spec"]
    key = "numapin.io/node"
    assert installer["nodeSelector"][key] != plugin["nodeSelector"][key]


@pytest.mark.parametrize("bad", [["nri", "--plugin-index", "9"], ["nri", "--no-such-flag"]])
def test_the_flag_check_catches_a_bad_command_line(bad: list[str], tmp_path: Path) -> None:
    with pytest.raises((SystemExit, ValueError)):
        _settings("", tmp_path, bad)


def test_the_host_service_runs_numapin_nri_and_restarts_at_once(tmp_path: Path) -> None:
    unit = parse_unit(NRI_UNIT.read_text(), NRI_UNIT_KEYS)
    assert "containerd.service" in unit["Unit"]["After"] and "containerd.service" in unit["Unit"]["Wants"]
    assert unit["Unit"]["Before"] == ["kubelet.service"] and unit["Unit"]["StartLimitIntervalSec"] == ["0"]
    svc = unit["Service"]
    assert svc["Restart"] == ["always"] and svc["RestartSec"] in (["500ms"], ["1"], ["250ms"])
    [start] = svc["ExecStart"]
    argv = shlex.split(start)
    assert argv[0] == "/opt/numapin/bin/numapin"
    _, cfg = _settings(NRI_SETTINGS.read_text(), tmp_path, argv[1:])
    assert argv[argv.index("--config") + 1] == "/etc/numapin/nri.yaml"
    from criproxy.config import load_config as load_proxy

    proxy = load_proxy(str(ROOT / "scripts/node/criproxy.yaml"), {})
    assert {k: getattr(cfg, k) for k in POLICY} == {k: getattr(proxy, k) for k in POLICY}
    [pre] = svc["ExecStartPre"]
    args = build_parser().parse_args(shlex.split(pre)[1:])
    assert args.command == "wait-socket" and "unix://" + args.socket == cfg.runtime_endpoint
    # kubelet never depends on the plugin: no drop-in, nothing Requires it
    assert "Requires" not in unit["Unit"]
