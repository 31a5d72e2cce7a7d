"""docs/node.md's runbooks, played: the ``install.sh`` commands of its install, upgrade, rollback and removal
sections run as written (paths mapped onto a fake host and its releases) in the order a node sees them, the export
command of the way back to kubelet's static policy runs against a node state, and the cluster-side removal deletes
the webhook configurations first, then the webhook, the NodeResourceTopology objects and the CRD."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

from allocator import CheckpointStore, CPUSet, CPUState
from allocator.checkpoint import import_kubelet_state
from numapin.cli import main
from tests.fixtures.make_sysfs import Machine, build
from tests.install.node_host import NRI_SETTINGS, SETTINGS, FakeHost, fake_host, fake_release

NODE_MD = Path(__file__).resolve().parents[2] / "docs/node.md"
NRI_MD = NODE_MD.with_name("nri.md")


def _section(title: str, md: Path = NODE_MD) -> str:
    text = md.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def _sh_commands(section: str) -> list[str]:
    out = []
    for block in re.findall(r"^\s*```sh\n(.*?)^\s*```", section, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _install_commands(title: str, md: Path = NODE_MD) -> list[list[str]]:
    return [shlex.split(c) for c in _sh_commands(_section(title, md)) if "install.sh" in c and " && " not in c]


def _play(host: FakeHost, argv: list[str], artifact: Path, files: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    script = argv[0]
    if script.startswith("/tmp/numapin-node/"):
        script = str(artifact / script.removeprefix("/tmp/numapin-node/"))
    elif script.startswith("/opt/numapin/"):
        script = str(host.root / "opt/numapin-releases" / host.release() / script.removeprefix("/opt/numapin/"))
    args = [files.get(a, a) for a in argv[1:]]
    return host.run(*map(str, args), script=Path(script))


def test_the_node_runbooks_install_upgrade_roll_back_and_remove(tmp_path: Path) -> None:
    host = fake_host(tmp_path)
    settings = tmp_path / "criproxy.yaml"
    settings.write_text(SETTINGS.read_text())
    files = {"/root/criproxy.yaml": settings}

    [install] = [c for c in _install_commands("Installing the proxy on a node") if c[0].startswith("/tmp/")]
    r = _play(host, install, fake_release(tmp_path / "v1", "0.1.0-aaaa"), files)
    assert r.returncode == 0, r.stderr
    assert host.release() == "0.1.0-aaaa" and host.active
    assert (host.root / "etc/numapin/criproxy.yaml").read_text() == settings.read_text()

    [upgrade] = [c for c in _install_commands("Upgrading numapin on a node") if c[0].startswith("/tmp/")]
    r = _play(host, upgrade, fake_release(tmp_path / "v2", "0.2.0-bbbb"), files)
    assert r.returncode == 0, r.stderr
    assert host.release() == "0.2.0-bbbb" and host.calls()[-1] == "restart numapin-criproxy.service"

    [rollback] = [c for c in _install_commands("Upgrading numapin on a node") if "--rollback" in c]
    r = _play(host, rollback, tmp_path, files)
    assert r.returncode == 0, r.stderr
    assert host.release() == "0.1.0-aaaa"

    kubelet = host.root / "var/lib/kubelet/config.yaml"
    kubelet.parent.mkdir(parents=True)
    kubelet.write_text("containerRuntimeEndpoint: unix:///var/run/numapin/criproxy.sock\n")
    [uninstall] = _install_commands("Removing numapin")
    assert _play(host, uninstall, tmp_path, files).returncode == 1  # kubelet still uses the proxy
    kubelet.write_text("containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
    r = _play(host, uninstall, tmp_path, files)
    assert r.returncode == 0, r.stderr
    assert not (host.root / "opt/numapin").is_symlink() and not (host.root / "etc/numapin").exists()
    assert not host.active


def test_the_way_back_exports_with_the_proxys_settings(tmp_path: Path) -> None:
    [export] = [shlex.split(c) for c in _sh_commands(_section("Back to kubelet's static policy, without a drain"))
                if c.startswith("numapin export-kubelet-state")]
    opts = dict(zip(export[2::2], export[3::2], strict=True))
    assert opts == {"--config": "/etc/numapin/criproxy.yaml", "--out": "/var/lib/kubelet/cpu_manager_state"}
    sysfs = build(Machine("2s", "two sockets, 2 cores, HT", 2, 2, 2), tmp_path / "sysfs")
    state = CPUState(default_cpuset=CPUSet.parse("0,2-4,6-7"))
    state.set("pod", "app", CPUSet.parse("1,5"))
    (tmp_path / "state").mkdir()
    CheckpointStore(tmp_path / "state/cpu_manager_state").save(state)
    out = tmp_path / "cpu_manager_state"
    # the documented command; the node's paths are pointed at this test's (flags override the settings file)
    rc = main([*export[1:3], str(SETTINGS), "--out", str(out), "--state-dir", str(tmp_path / "state"),
               "--sysfs", str(sysfs), "--listen", str(tmp_path / "none.sock")])
    assert rc == 0 and import_kubelet_state(out) == state
    assert json.loads(out.read_text())["policyName"] == "static"


def test_the_cluster_is_cleared_webhook_configurations_first() -> None:
    deletes = [c for c in _sh_commands(_section("Removing numapin")) if c.startswith("kubectl delete")]
    order = ["webhook-configurations.yaml", "deployment.yaml", "noderesourcetopologies", "crd-noderesourcetopology"]
    positions = [next(i for i, c in enumerate(deletes) if key in c) for key in order]
    assert positions == sorted(positions), deletes


# -- every command of the runbooks is run by a test ----------------------------------------------------------------

RUNBOOKS = ("Installing the proxy on a node", "Switching kubelet to the proxy", "Upgrading numapin on a node",
            "Back to kubelet's static policy, without a drain", "Removing numapin", "Checking a node")
GUEST_STORY = Path(__file__).resolve().parents[2] / "tests/numa/guest/test_systemd_install.py"
# commands that do not run on a node, and the test that covers each instead
ELSEWHERE = {
    "scripts/build-node.sh --help": "test_every_runbook_command_is_run_by_a_test (below)",
    "scripts/build-node.sh --tar": "tests/install/test_build_node.py (the build with --tar and --deb)",
    "apt-get install ./numapin-node.deb": "tests/install/test_build_node.py (the package's postinst runs install.sh)",
    "kubectl ": "the cluster's side: tests/webhook/test_manifests.py, test_kustomize.py; the removal's order above",
}
# what this file plays on a fake host (the install.sh commands and the export, above)
ON_THE_FAKE_HOST = ("/tmp/numapin-node/share/numapin/install.sh", "/opt/numapin/share/numapin/install.sh",
                    "numapin export-kubelet-state")
# what only reads the machine: run here as written (below), with this checkout's numapin
ON_THIS_MACHINE = ("numapin criproxy --help", "numapin topology --sysfs /sys")


def node_commands() -> list[tuple[str, str]]:
    """(section, command) of every runbook command, trailing comments dropped."""
    return [(t, c.split("  #")[0].strip()) for t in RUNBOOKS for c in _sh_commands(_section(t))]


def _guest_prefixes() -> list[str]:
    """The command prefixes the systemd VM's story plays (its ``play(SECTION, "prefix")`` and ``doc(...)`` calls)."""
    import ast

    tree = ast.parse(GUEST_STORY.read_text())
    return [node.args[1].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("play", "doc")
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)]


def guest_plays(command: str) -> bool:
    return any(command.startswith(p) for p in _guest_prefixes())


def test_every_runbook_command_is_run_by_a_test() -> None:
    """Each command of docs/node.md's runbooks is played on a systemd host (tests/install/test_systemd_host.py, its
    guest story), on the fake host here, or is not a node's command and is covered where ELSEWHERE says."""
    left = [(t, c) for t, c in node_commands() if not guest_plays(c) and not c.startswith(ON_THE_FAKE_HOST)
            and not c.startswith(ON_THIS_MACHINE) and not c.startswith(tuple(ELSEWHERE))]
    assert left == []
    for command in [c for _, c in node_commands() if c.startswith(ON_THIS_MACHINE)]:
        argv = shlex.split(command)
        assert argv[0] == "numapin"
        r = subprocess.run([sys.executable, "-m", "numapin", *argv[1:]], capture_output=True, text=True, timeout=120,
                           cwd=NODE_MD.parents[1])
        assert r.returncode == 0 and r.stdout, (command, r.stderr)
    assert all(any(c.startswith(p) for _, c in node_commands()) for p in _guest_prefixes()), "a stale prefix"
    r = subprocess.run(["bash", str(NODE_MD.parents[1] / "scripts/build-node.sh"), "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--tar" in r.stdout, r.stderr


# -- docs/nri.md: the NRI plugin as a host service, and the switch between the modes ------------------------------

NRI_INSTALL, NRI_UPGRADE = "Installing the NRI plugin on a node", "Upgrading and rolling back the NRI plugin"
NRI_REMOVE, SWITCH = "Removing the NRI plugin", "Switching a node between the modes"
NRI_UNIT_PATH, PROXY_UNIT_PATH = "etc/systemd/system/numapin-nri.service", "etc/systemd/system/numapin-criproxy.service"
DROPIN_PATH = "etc/systemd/system/kubelet.service.d/90-numapin.conf"


def _nri_files(tmp_path: Path) -> dict[str, Path]:
    nri = tmp_path / "nri.yaml"
    nri.write_text(NRI_SETTINGS.read_text().replace('reservedCpus: "0"', 'reservedCpus: "0-1"'))
    proxy = tmp_path / "criproxy.yaml"
    proxy.write_text(SETTINGS.read_text())
    return {"/root/nri.yaml": nri, "/root/criproxy.yaml": proxy}


def test_the_nri_runbooks_install_upgrade_roll_back_and_remove(tmp_path: Path) -> None:
    host, files = fake_host(tmp_path), _nri_files(tmp_path)
    [install] = [c for c in _install_commands(NRI_INSTALL, NRI_MD) if c[0].startswith("/tmp/")]
    r = _play(host, install, fake_release(tmp_path / "v1", "0.1.0-aaaa"), files)
    assert r.returncode == 0, r.stderr
    assert (host.root / NRI_UNIT_PATH).exists() and host.active and host.calls()[-1] == "start numapin-nri.service"
    assert not (host.root / PROXY_UNIT_PATH).exists() and not (host.root / DROPIN_PATH).exists()  # kubelet untouched
    assert (host.root / "etc/numapin/nri.yaml").read_text() == files["/root/nri.yaml"].read_text()

    [upgrade] = [c for c in _install_commands(NRI_UPGRADE, NRI_MD) if c[0].startswith("/tmp/")]
    assert "--mode" not in upgrade  # the node's mode is kept
    r = _play(host, upgrade, fake_release(tmp_path / "v2", "0.2.0-bbbb"), files)
    assert r.returncode == 0, r.stderr
    assert host.release() == "0.2.0-bbbb" and host.calls()[-1] == "restart numapin-nri.service"
    assert not (host.root / PROXY_UNIT_PATH).exists()

    [rollback] = [c for c in _install_commands(NRI_UPGRADE, NRI_MD) if "--rollback" in c]
    r = _play(host, rollback, tmp_path, files)
    assert r.returncode == 0, r.stderr
    assert host.release() == "0.1.0-aaaa" and host.calls()[-1] == "restart numapin-nri.service"

    [uninstall] = _install_commands(NRI_REMOVE, NRI_MD)
    r = _play(host, uninstall, tmp_path, files)
    assert r.returncode == 0, r.stderr
    assert "disable --now numapin-nri.service" in host.calls() and not host.active
    assert not (host.root / NRI_UNIT_PATH).exists() and not (host.root / "etc/numapin").exists()
    assert not (host.root / "opt/numapin").is_symlink()


def test_a_node_switches_from_the_proxy_to_nri_and_back_on_the_same_state(tmp_path: Path) -> None:
    host, files = fake_host(tmp_path), _nri_files(tmp_path)
    [install] = [c for c in _install_commands("Installing the proxy on a node") if c[0].startswith("/tmp/")]
    assert _play(host, install, fake_release(tmp_path / "v1", "0.1.0-aaaa"), files).returncode == 0
    state = host.root / "var/lib/numapin/cpu_manager_state"
    state.parent.mkdir(parents=True)
    state.write_text('{"policyName": "numapin"}')
    kubelet = host.root / "var/lib/kubelet/config.yaml"
    kubelet.parent.mkdir(parents=True)
    kubelet.write_text("containerRuntimeEndpoint: unix:///var/run/numapin/criproxy.sock\n")

    to_nri, to_proxy = _install_commands(SWITCH, NRI_MD)
    assert to_nri[to_nri.index("--mode") + 1] == "nri" and to_proxy[to_proxy.index("--mode") + 1] == "proxy"
    host.clear_calls()
    r = _play(host, to_nri, tmp_path, files)
    assert r.returncode == 1 and "kubelet still uses the proxy" in r.stderr  # kubelet not pointed back yet
    assert host.calls() == [] and (host.root / PROXY_UNIT_PATH).exists() and host.active  # nothing changed
    kubelet.write_text("cpuManagerPolicy: none\n")
    r = _play(host, to_nri, tmp_path, files)
    assert r.returncode == 0, r.stderr
    calls = host.calls()
    assert calls.index("disable --now numapin-criproxy.service") < calls.index("start numapin-nri.service"), calls
    assert not (host.root / PROXY_UNIT_PATH).exists() and not (host.root / DROPIN_PATH).exists()
    assert (host.root / NRI_UNIT_PATH).exists() and host.active
    assert (host.root / "etc/numapin/nri.yaml").read_text() == files["/root/nri.yaml"].read_text()
    assert state.read_text() == '{"policyName": "numapin"}'  # the same state

    host.clear_calls()
    r = _play(host, to_proxy, tmp_path, files)
    assert r.returncode == 0, r.stderr
    calls = host.calls()
    assert calls.index("disable --now numapin-nri.service") < calls.index("start numapin-criproxy.service"), calls
    assert not (host.root / NRI_UNIT_PATH).exists()
    assert (host.root / PROXY_UNIT_PATH).exists() and (host.root / DROPIN_PATH).exists() and host.active
    assert state.read_text() == '{"policyName": "numapin"}'


def test_a_bad_mode_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    host = fake_host(tmp_path)
    r = host.run("--mode", "kubelet", "--from", str(fake_release(tmp_path / "v1", "0.1.0-aaaa")))
    assert r.returncode == 2 and "--mode must be proxy or nri" in r.stderr
    assert host.calls() == [] and not (host.root / "opt/numapin").exists()


NRI_RUNBOOKS = (NRI_INSTALL, NRI_UPGRADE, NRI_REMOVE, SWITCH)
# the commands of docs/nri.md that this file does not play, and what covers each
NRI_ELSEWHERE = {
    "kubectl ": "the cluster's side: tests/install/test_nri_manifests.py, tests/webhook/test_manifests.py, "
                "test_kustomize.py::test_the_nri_plugin_alone_renders_with_the_built_image",
    "mkdir -p /tmp/numapin-node && tar": "node.md's same command, played by the systemd host's story",
    "numapin status --status-url": "tests/nri/test_switch_modes.py (against a real plugin on containerd 2.1.9)",
    "curl -s http://127.0.0.1:9464/status": "not played: /status's door is read by every tests/nri test "
                                            "(NriProcess.wait_synchronized)",
    "systemctl stop kubelet": "not played: no kubelet runs in the suite (node.md, support matrix)",
    "systemctl start kubelet": "not played: no kubelet runs in the suite (node.md, support matrix)",
}


def test_every_nri_runbook_command_is_run_by_a_test() -> None:
    commands = [c.split("  #")[0].strip() for t in NRI_RUNBOOKS for c in _sh_commands(_section(t, NRI_MD))]
    left = [c for c in commands if not c.startswith(ON_THE_FAKE_HOST) and not c.startswith(tuple(NRI_ELSEWHERE))
            and c != "numapin nri --help"]
    assert left == []
    assert guest_plays("mkdir -p /tmp/numapin-node && tar") and any(
        c.startswith("mkdir -p /tmp/numapin-node && tar") for _, c in node_commands())
    r = subprocess.run([sys.executable, "-m", "numapin", "nri", "--help"], capture_output=True, text=True,
                       timeout=120, cwd=NODE_MD.parents[1])
    assert r.returncode == 0 and "--nri-socket" in r.stdout, r.stderr
