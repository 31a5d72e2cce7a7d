"""A fake host for the node installer (scripts/node/install.sh): a root file system in a directory, and a
``systemctl`` that records its calls there and keeps whether numapin's unit is active (systemd cannot run here; the
files the installer writes, its decisions and the order of its calls to systemd are what is checked)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SH = ROOT / "scripts/node/install.sh"
UNIT = ROOT / "manifests/criproxy/numapin-criproxy.service"
DROPIN = ROOT / "manifests/criproxy/kubelet-numapin.conf"
SETTINGS = ROOT / "scripts/node/criproxy.yaml"
NRI_UNIT = ROOT / "manifests/nri/numapin-nri.service"  # install.sh --mode nri
NRI_SETTINGS = ROOT / "scripts/node/nri.yaml"

FAKE_SYSTEMCTL = """#!/bin/sh
# records every call; "is-active" answers from the state file that start/restart/stop write; a release holding a file
# FAILS_TO_START does not start (its proxy would exit)
echo "$*" >> "{log}"
case "$1" in
    start|restart)
        target=$(readlink "{root}/opt/numapin" || true)
        if [ -e "{root}$target/FAILS_TO_START" ]; then rm -f "{active}"; exit 1; fi
        touch "{active}" ;;
    stop) rm -f "{active}" ;;
    disable) [ "$2" = --now ] && rm -f "{active}" ;;
    is-active) [ -f "{active}" ] ;;
esac
"""


@dataclass
class FakeHost:
    root: Path
    tmp: Path

    @property
    def systemctl(self) -> Path:
        return self.tmp / "systemctl"

    @property
    def log(self) -> Path:
        return self.tmp / "systemctl.log"

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def clear_calls(self) -> None:
        self.log.unlink(missing_ok=True)

    @property
    def active(self) -> bool:
        return (self.tmp / "active").exists()

    def release(self) -> str:
        """The release /opt/numapin points at (the link's target is a host path)."""
        link = self.root / "opt/numapin"
        assert link.is_symlink(), f"{link} is not a link"
        target = os.readlink(link)
        assert target.startswith("/opt/numapin-releases/"), target
        return Path(target).name

    def releases(self) -> set[str]:
        d = self.root / "opt/numapin-releases"
        return {p.name for p in d.iterdir() if p.is_dir()} if d.exists() else set()

    def run(self, *args: str, script: Path = INSTALL_SH) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", str(script), "--host-root", str(self.root), "--systemctl", str(self.systemctl),
                               *args], capture_output=True, text=True, timeout=60)


def fake_host(tmp: Path) -> FakeHost:
    root = tmp / "host"
    for d in ("etc/systemd/system", "opt", "var/lib"):
        (root / d).mkdir(parents=True)
    host = FakeHost(root, tmp)
    host.systemctl.write_text(FAKE_SYSTEMCTL.format(log=host.log, active=tmp / "active", root=root))
    host.systemctl.chmod(0o755)
    return host


def fake_release(dest: Path, release: str) -> Path:
    """A release laid out as scripts/build-node.sh lays it out, with a stand-in for the interpreter (the real build
    is checked in test_build_node.py)."""
    meta = dest / "share/numapin"
    meta.mkdir(parents=True)
    (dest / "bin").mkdir()
    numapin = dest / "bin/numapin"
    numapin.write_text(f"#!/bin/sh\necho numapin {release}\n")
    numapin.chmod(numapin.stat().st_mode | stat.S_IXUSR)
    (meta / "RELEASE").write_text(release + "\n")
    shutil.copy(INSTALL_SH, meta / "install.sh")
    shutil.copy(UNIT, meta / UNIT.name)
    shutil.copy(DROPIN, meta / DROPIN.name)
    shutil.copy(SETTINGS, meta / SETTINGS.name)
    shutil.copy(NRI_UNIT, meta / NRI_UNIT.name)
    shutil.copy(NRI_SETTINGS, meta / NRI_SETTINGS.name)
    return dest


def second_release(built: Path, dest: Path) -> Path:
    """The same build as another release (what a new version looks like to the installer and the unit)."""
    shutil.copytree(built / "opt/numapin", dest, symlinks=True)
    release = (dest / "share/numapin/RELEASE").read_text().strip()
    (dest / "share/numapin/RELEASE").write_text(release.replace("0.1.0-", "0.1.1-", 1) + "\n")
    return dest
