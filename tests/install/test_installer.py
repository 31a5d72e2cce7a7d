"""The node installer (scripts/node/install.sh, the installer DaemonSet's only job) against a fake host root:
install, the same release again (nothing changes, no restart), an upgrade (restart, state and previous release
kept), rollback, new settings, and the uninstall that is refused while kubelet still uses the proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.install.node_host import DROPIN, SETTINGS, UNIT, FakeHost, fake_host, fake_release

UNIT_PATH = "etc/systemd/system/numapin-criproxy.service"
DROPIN_PATH = "etc/systemd/system/kubelet.service.d/90-numapin.conf"
SETTINGS_PATH = "etc/numapin/criproxy.yaml"


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return fake_host(tmp_path)


def _install(host: FakeHost, release: str, *extra: str) -> str:
    src = host.tmp / "artifacts" / release
    if not src.exists():
        fake_release(src, release)
    r = host.run("--from", str(src), *extra, script=src / "share/numapin/install.sh")
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_a_fresh_install_places_the_release_the_units_and_starts_the_proxy(host: FakeHost) -> None:
    _install(host, "0.1.0-aaaa")
    assert host.release() == "0.1.0-aaaa"
    assert (host.root / "opt/numapin-releases/0.1.0-aaaa/bin/numapin").stat().st_mode & 0o111
    assert (host.root / UNIT_PATH).read_bytes() == UNIT.read_bytes()
    assert (host.root / DROPIN_PATH).read_bytes() == DROPIN.read_bytes()
    assert (host.root / SETTINGS_PATH).read_bytes() == SETTINGS.read_bytes()  # the default: the node had none
    assert host.calls() == ["daemon-reload", "enable numapin-criproxy.service",
                            "is-active --quiet numapin-criproxy.service", "start numapin-criproxy.service"]
    assert host.active


def test_the_same_release_again_changes_nothing_and_restarts_nothing(host: FakeHost) -> None:
    _install(host, "0.1.0-aaaa")
    files = {p: p.stat().st_mtime_ns for p in host.root.rglob("*") if p.is_file()}
    host.clear_calls()
    err = _install(host, "0.1.0-aaaa")
    assert "nothing changed" in err
    assert {p: p.stat().st_mtime_ns for p in host.root.rglob("*") if p.is_file()} == files
    assert host.calls() == ["daemon-reload", "enable numapin-criproxy.service", "start numapin-criproxy.service"]


def test_an_upgrade_restarts_the_proxy_and_keeps_state_settings_and_the_previous_release(host: FakeHost) -> None:
    _install(host, "0.1.0-aaaa")
    state = host.root / "var/lib/numapin/cpu_manager_state"
    state.parent.mkdir(parents=True)
    state.write_text("the proxy's state")
    settings = host.root / SETTINGS_PATH
    settings.write_text("reservedCpus: 0-1\n")  # the operator's edit
    host.clear_calls()
    _install(host, "0.2.0-bbbb")
    assert host.release() == "0.2.0-bbbb"
    assert host.releases() == {"0.1.0-aaaa", "0.2.0-bbbb"}
    assert (host.root / "opt/numapin-releases/.previous").read_text().strip() == "0.1.0-aaaa"
    assert host.calls()[-2:] == ["is-active --quiet numapin-criproxy.service", "restart numapin-criproxy.service"]
    assert state.read_text() == "the proxy's state" and settings.read_text() == "reservedCpus: 0-1\n"
    _install(host, "0.3.0-cccc")
    assert host.releases() == {"0.2.0-bbbb", "0.3.0-cccc"}  # only the one --rollback goes back to is kept


def test_rollback_points_back_at_the_previous_release_and_restarts(host: FakeHost) -> None:
    _install(host, "0.1.0-aaaa")
    _install(host, "0.2.0-bbbb")
    host.clear_calls()
    r = host.run("--rollback")
    assert r.returncode == 0, r.stderr
    assert host.release() == "0.1.0-aaaa"
    assert (host.root / "opt/numapin-releases/.previous").read_text().strip() == "0.2.0-bbbb"
    assert host.calls()[-1] == "restart numapin-criproxy.service"


def test_a_release_that_does_not_start_is_rolled_back_at_once(host: FakeHost) -> None:
    _install(host, "0.1.0-aaaa")
    bad = fake_release(host.tmp / "artifacts/0.2.0-bbbb", "0.2.0-bbbb")
    (bad / "FAILS_TO_START").write_text("")
    host.clear_calls()
    r = host.run("--from", str(bad), script=bad / "share/numapin/install.sh")
    assert r.returncode == 1 and "numapin 0.2.0-bbbb did not start" in r.stderr and "0.1.0-aaaa runs again" in r.stderr
    assert host.release() == "0.1.0-aaaa" and host.active
    assert host.calls()[-2:] == ["daemon-reload", "restart numapin-criproxy.service"]
    assert (host.root / "opt/numapin-releases/.previous").read_text().strip() == "0.2.0-bbbb"


def test_a_first_release_that_does_not_start_fails_the_install(host: FakeHost) -> None:
    bad = fake_release(host.tmp / "artifacts/0.1.0-aaaa", "0.1.0-aaaa")
    (bad / "FAILS_TO_START").write_text("")
    r = host.run("--from", str(bad), script=bad / "share/numapin/install.sh")
    assert r.returncode == 1 and "did not start: journalctl -u numapin-criproxy.service" in r.stderr
    assert not host.active


def test_new_settings_are_installed_and_restart_the_proxy(host: FakeHost) -> None:
    _install(host, "0.1.0-aaaa")
    new = host.tmp / "criproxy.yaml"
    new.write_text(SETTINGS.read_text().replace('reservedCpus: "0"', 'reservedCpus: "0-1"'))
    host.clear_calls()
    _install(host, "0.1.0-aaaa", "--config", str(new))
    assert (host.root / SETTINGS_PATH).read_text() == new.read_text()
    assert host.calls()[-1] == "restart numapin-criproxy.service"


def test_a_broken_artifact_installs_nothing(host: FakeHost) -> None:
    src = fake_release(host.tmp / "broken", "0.1.0-aaaa")
    (src / "share/numapin/RELEASE").unlink()
    r = host.run("--from", str(src))
    assert r.returncode == 1 and "RELEASE" in r.stderr
    assert not (host.root / "opt/numapin").exists() and not (host.root / UNIT_PATH).exists()
    assert host.calls() == []


def test_uninstall_is_refused_while_kubelet_uses_the_proxy_then_removes_everything(host: FakeHost) -> None:
    _install(host, "0.1.0-aaaa")
    (host.root / "var/lib/numapin").mkdir(parents=True)
    (host.root / "var/lib/numapin/cpu_manager_state").write_text("state")
    kubelet = host.root / "var/lib/kubelet/config.yaml"
    kubelet.parent.mkdir(parents=True)
    kubelet.write_text("containerRuntimeEndpoint: unix:///var/run/numapin/criproxy.sock\n")
    host.clear_calls()
    r = host.run("--uninstall")
    assert r.returncode == 1 and "kubelet still uses the proxy" in r.stderr and str(kubelet) in r.stderr
    assert host.calls() == [] and host.active and (host.root / UNIT_PATH).exists()

    kubelet.write_text("containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
    r = host.run("--uninstall")
    assert r.returncode == 0, r.stderr
    assert host.calls() == ["disable --now numapin-criproxy.service", "daemon-reload"] and not host.active
    for gone in ("opt/numapin", "opt/numapin-releases", UNIT_PATH, DROPIN_PATH):
        assert not (host.root / gone).exists() and not (host.root / gone).is_symlink(), gone
    assert (host.root / "var/lib/numapin/cpu_manager_state").exists() and (host.root / SETTINGS_PATH).exists()
    r = host.run("--uninstall", "--purge")
    assert r.returncode == 0, r.stderr
    assert not (host.root / "var/lib/numapin").exists() and not (host.root / "etc/numapin").exists()


def test_the_installer_never_runs_the_proxy_itself(host: FakeHost) -> None:
    """Every start of the proxy goes through the host's systemd: install.sh (the installer pod's only command)
    executes no program of a release in any action, so the proxy never runs in the installer's pod."""
    ran = host.tmp / "numapin-ran"
    for release in ("0.1.0-aaaa", "0.2.0-bbbb"):
        src = fake_release(host.tmp / "artifacts" / release, release)
        (src / "bin/numapin").write_text(f"#!/bin/sh\necho \"$0 $*\" >> {ran}\n")
    _install(host, "0.1.0-aaaa")
    _install(host, "0.2.0-bbbb")
    assert host.run("--rollback").returncode == 0
    assert host.run("--uninstall", "--purge").returncode == 0
    assert not ran.exists(), ran.read_text()
    assert [c.split()[0] for c in host.calls() if c.split()[0] in ("start", "restart")]  # systemd was asked
