"""numapin's systemd unit and kubelet's drop-in: verified by systemd's own parser (``systemd-analyze verify`` against
a root holding them, systemd's targets and stand-ins for containerd and kubelet; any warning fails), parsed strictly
here too, and their ordering and commands checked: containerd -> the proxy (waits for containerd's socket, counts as
started once its own socket answers, restarted on any exit) -> kubelet (waits for the proxy's socket, but never
stopped with it)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from criproxy.config import load_config
from numapin.cli import build_parser
from tests.install.node_host import DROPIN, NRI_UNIT, SETTINGS, UNIT

SYSTEMD_UNITS = Path("/lib/systemd/system")
UNIT_KEYS = {
    "Unit": {"Description", "Documentation", "After", "Wants", "Before", "StartLimitIntervalSec"},
    "Service": {"Type", "ExecStartPre", "ExecStart", "ExecStartPost", "Restart", "RestartSec", "StateDirectory",
                "RuntimeDirectory", "RuntimeDirectoryPreserve", "KillSignal", "TimeoutStartSec", "TimeoutStopSec",
                "LimitNOFILE", "OOMScoreAdjust"},
    "Install": {"WantedBy"},
}
DROPIN_KEYS = {"Unit": {"After", "Wants"}, "Service": {"ExecStartPre"}}


def parse_unit(text: str, allowed: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """A strict reading of a unit file: sections and keys from ``allowed`` only, no line outside a section, no
    continuation lines, every value non-empty; a key may repeat (its values are kept in order)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"line {n}: continuation lines are not used"
        if line.startswith("["):
            assert line.endswith("]"), f"line {n}: {line}"
            section = line[1:-1]
            assert section in allowed and section not in out, f"line {n}: section {section}"
            out[section] = {}
            continue
        assert section is not None, f"line {n}: outside a section"
        key, sep, value = line.partition("=")
        assert sep and key in allowed[section], f"line {n}: unexpected key {key!r} in [{section}]"
        assert value.strip(), f"line {n}: empty value"
        out[section].setdefault(key, []).append(value.strip())
    return out


def _numapin_args(command: str) -> tuple[str, list[str]]:
    argv = shlex.split(command.removeprefix("-"))
    assert argv[0] == "/opt/numapin/bin/numapin", argv[0]
    return argv[0], argv[1:]


def test_the_unit_orders_containerd_proxy_kubelet_and_restarts_forever() -> None:
    unit = parse_unit(UNIT.read_text(), UNIT_KEYS)
    settings = load_config(str(SETTINGS), {})
    assert "containerd.service" in unit["Unit"]["After"] and "containerd.service" in unit["Unit"]["Wants"]
    assert unit["Unit"]["Before"] == ["kubelet.service"]
    assert unit["Unit"]["StartLimitIntervalSec"] == ["0"]
    svc = unit["Service"]
    assert svc["Restart"] == ["always"] and svc["Type"] == ["simple"]
    parser = build_parser()
    [pre] = svc["ExecStartPre"]
    args = parser.parse_args(_numapin_args(pre)[1])
    assert args.command == "wait-socket" and "unix://" + args.socket == settings.runtime_endpoint
    [start] = svc["ExecStart"]
    args = parser.parse_args(_numapin_args(start)[1])
    assert args.command == "criproxy" and args.config == "/etc/numapin/criproxy.yaml"
    [post] = svc["ExecStartPost"]
    args = parser.parse_args(_numapin_args(post)[1])
    assert args.command == "wait-socket" and args.socket == settings.listen
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_kubelets_drop_in_waits_for_the_proxy_but_never_depends_on_it() -> None:
    dropin = parse_unit(DROPIN.read_text(), DROPIN_KEYS)
    assert dropin["Unit"] == {"After": ["numapin-criproxy.service"], "Wants": ["numapin-criproxy.service"]}
    [pre] = dropin["Service"]["ExecStartPre"]
    assert pre.startswith("-"), "a missing or failing numapin must not keep kubelet from starting"
    args = build_parser().parse_args(_numapin_args(pre)[1])
    assert args.command == "wait-socket" and args.socket == load_config(str(SETTINGS), {}).listen
    assert args.timeout <= 120


@pytest.mark.parametrize("text", ["[Unit]\nRequires=numapin-criproxy.service\n", "After=x\n", "[Unit]\nAfter=\n",
                                  "[Service]\nExecStartPre=a \\\n"])
def test_the_strict_parse_catches_what_it_must(text: str) -> None:
    with pytest.raises(AssertionError):
        parse_unit(text, DROPIN_KEYS)


@pytest.fixture
def systemd_root(tmp_path: Path) -> Path:
    if shutil.which("systemd-analyze") is None or not (SYSTEMD_UNITS / "sysinit.target").exists():
        pytest.skip("systemd-analyze or systemd's units are not installed (the strict parse above still runs)")
    root = tmp_path / "root"
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    for p in [*SYSTEMD_UNITS.glob("*.target"), *SYSTEMD_UNITS.glob("*.slice")]:
        shutil.copy(p, units / p.name)
    for name, exe in (("containerd", "/usr/bin/containerd"), ("kubelet", "/usr/bin/kubelet")):
        (units / f"{name}.service").write_text(f"[Unit]\nDescription={name}\n[Service]\nExecStart={exe}\n")
    for exe in ("usr/bin/containerd", "usr/bin/kubelet", "opt/numapin/bin/numapin"):
        (root / exe).parent.mkdir(parents=True, exist_ok=True)
        (root / exe).write_text("#!/bin/sh\n")
        (root / exe).chmod(0o755)
    (root / "etc/systemd/system/kubelet.service.d").mkdir(parents=True)
    shutil.copy(UNIT, root / "etc/systemd/system" / UNIT.name)
    shutil.copy(NRI_UNIT, root / "etc/systemd/system" / NRI_UNIT.name)
    shutil.copy(DROPIN, root / "etc/systemd/system/kubelet.service.d/90-numapin.conf")
    return root


def _verify(root: Path, *units: str) -> subprocess.CompletedProcess[str]:
    units = units or ("numapin-criproxy.service", "kubelet.service")
    return subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", *units],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "SYSTEMD_LOG_LEVEL": "info"})


def test_systemd_verifies_the_unit_and_the_drop_in_without_a_warning(systemd_root: Path) -> None:
    r = _verify(systemd_root)
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr + r.stdout


def test_systemd_verifies_the_nri_plugins_unit_without_a_warning(systemd_root: Path) -> None:
    r = _verify(systemd_root, NRI_UNIT.name, "kubelet.service")
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr + r.stdout
    unit = systemd_root / "etc/systemd/system" / NRI_UNIT.name
    unit.write_text(unit.read_text().replace("RestartSec=", "RestartSecs="))
    assert "RestartSecs" in _verify(systemd_root, NRI_UNIT.name).stderr


def test_systemd_verify_would_catch_a_bad_unit(systemd_root: Path) -> None:
    dropin = systemd_root / "etc/systemd/system/kubelet.service.d/90-numapin.conf"
    dropin.write_text(dropin.read_text() + "RestartMaybe=yes\n")
    r = _verify(systemd_root)
    assert "RestartMaybe" in r.stderr
