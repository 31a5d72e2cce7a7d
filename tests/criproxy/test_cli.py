"""`numapin criproxy` configuration: flags over file, bad configuration exits 2 with a message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from allocator.errors import ConfigError
from criproxy.config import load_config
from numapin.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_file_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("runtimeEndpoint: unix:///a.sock\nreserved-cpus: 0-1\ntopology_manager_policy: restricted\n"
                 "cpuManagerPolicyOptions: {full-pcpus-only: true}\nliftCfsQuota: false\n")
    cfg = load_config(str(f), {"topology_manager_policy": "single-numa-node", "listen": None})
    assert cfg.runtime_endpoint == "unix:///a.sock"
    assert str(cfg.reserved_cpus) == "0-1"
    assert cfg.topology_manager_policy == "single-numa-node"
    assert cfg.cpu_manager_policy_options == {"full-pcpus-only": "true"}
    assert cfg.lift_cfs_quota is False
    assert not cfg.feature_gates.pod_level_resource_managers  # kubelet's default
    f.write_text("featureGates: {PodLevelResourceManagers: true}\n")  # kubelet's KubeletConfiguration form
    assert load_config(str(f), {}).feature_gates.pod_level_resource_managers
    assert not load_config(str(f), {"feature_gates": "PodLevelResourceManagers=false"}
                           ).feature_gates.pod_level_resource_managers  # the flag wins


@pytest.mark.parametrize(("content", "needle"), [
    ("bogus: 1\n", "unknown setting 'bogus'"),
    ("reservedCpus: 3-1\n", "reserved-cpus"),
    ("- a\n", "expected a mapping"),
    ("cpuManagerPolicyOptions: nonsense\n", "cpu-manager-policy-options"),
    ("cpusetWrites: sometimes\n", "cpuset-writes: expected kernel or runtime, got 'sometimes'"),
    ("featureGates: {NoSuchGate: true}\n", "unrecognized feature gate 'NoSuchGate'"),
    ("featureGates: [PodLevelResourceManagers]\n", "feature-gates: expected a mapping of gate names"),
])
def test_bad_file_names_the_setting(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        load_config(str(f), {})


@pytest.mark.parametrize(("args", "needle"), [
    (["--reserved-cpus", "7"], "7"),                                    # not on this 2-CPU topology
    (["--topology-manager-policy", "sometimes"], "sometimes"),
    (["--topology-manager-scope", "galaxy"], "galaxy"),
    (["--cpu-manager-policy-options", "no-such-option=true"], "no-such-option"),
    (["--metrics-address", "nowhere"], "metrics-address"),
    (["--metrics-address", "127.0.0.1:70000"], "port 70000 is not in 0-65535"),
    (["--config", "/does/not/exist.yaml"], "/does/not/exist.yaml"),
    (["--feature-gates", "PodLevelResourceManagers=maybe"], "invalid value of PodLevelResourceManagers: 'maybe'"),
    ([], "requires systemreserved.cpu + kubereserved.cpu to be greater than zero"),  # kubelet's start-up rule
])
def test_bad_configuration_exits_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  args: list[str], needle: str) -> None:
    sysfs = tmp_path / "sys"
    cpu = sysfs / "devices/system/cpu"
    for c in (0, 1):
        (cpu / f"cpu{c}/topology").mkdir(parents=True)
        (cpu / f"cpu{c}/topology/physical_package_id").write_text("0\n")
        (cpu / f"cpu{c}/topology/thread_siblings_list").write_text(f"{c}\n")
    rc = main(["criproxy", "--sysfs", str(sysfs), "--state-dir", str(tmp_path / "s"), "--listen",
               str(tmp_path / "p.sock"), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("numapin criproxy: ") and needle in err
    assert "Traceback" not in err


def test_help_lists_the_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "numapin", "criproxy", "--help"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    for flag in ("--listen", "--runtime-endpoint", "--state-dir", "--sysfs", "--reserved-cpus",
                 "--topology-manager-policy", "--topology-manager-scope", "--cpu-manager-policy-options", "--config",
                 "--feature-gates"):
        assert flag in out


def test_shipped_configuration_loads() -> None:
    import shlex

    import yaml

    docs = list(yaml.safe_load_all((ROOT / "manifests/criproxy/installer-daemonset.yaml").read_text()))
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as tmp:
        tmp.write(cm["data"]["criproxy.yaml"])
        tmp.flush()
        cfg = load_config(tmp.name, {})
    assert cfg.listen == "/var/run/numapin/criproxy.sock" and cfg.sysfs == "/sys"  # a host service's paths
    node_default = load_config(str(ROOT / "scripts/node/criproxy.yaml"), {})
    assert node_default.listen == cfg.listen and node_default.state_dir == cfg.state_dir
    unit = (ROOT / "manifests/criproxy/numapin-criproxy.service").read_text()
    [exec_start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(exec_start.split("=", 1)[1])
    from numapin.cli import build_parser

    args = build_parser().parse_args(argv[1:])
    assert args.command == "criproxy" and args.config == "/etc/numapin/criproxy.yaml"
    kubelet = yaml.safe_load((ROOT / "manifests/criproxy/kubelet-config.yaml").read_text())
    assert kubelet["containerRuntimeEndpoint"] == "unix://" + cfg.listen
    assert kubelet["cpuManagerPolicy"] == "none"


def test_corrupt_state_file_refuses_to_start_and_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "s" / "cpu_manager_state"
    state.parent.mkdir()
    state.write_text('{"policyName":"numapin","defaultCpuSet":"0-1","checksum":12345}')
    rc = main(["criproxy", "--sysfs", "/sys", "--state-dir", str(state.parent), "--listen", str(tmp_path / "p.sock"),
               "--runtime-endpoint", f"unix://{tmp_path}/none.sock", "--reserved-cpus", "0", "--metrics-address", ""])
    err = capsys.readouterr().err
    assert rc == 1 and "checksum" in err and "Traceback" not in err
    assert state.read_text() == '{"policyName":"numapin","defaultCpuSet":"0-1","checksum":12345}'
    assert not (tmp_path / "p.sock").exists()
