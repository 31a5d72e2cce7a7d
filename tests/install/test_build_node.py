"""The self-contained node install (scripts/build-node.sh), built for real into a temporary prefix: it runs outside
this checkout with nothing but its own directory (its interpreter, standard library, libraries, dependencies and
numapin), the installer puts it on a fake host from which it runs, the proxy itself starts from it (and refuses a
newer state, which imports its whole stack), and the tarball and the Debian package hold it.

Cost: the build, once for the session (conftest.py): about 45 s on an idle 2-core machine (40 s of CPU: the
dependencies installed from pip's cached wheels, numapin built as a wheel of this checkout, the byte-code compiled);
170 s was seen with the machine's load at 9.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import tomllib
from pathlib import Path

from allocator import CheckpointStore, CPUState
from allocator.state_schema import SCHEMA_KEY
from tests.fixtures.make_sysfs import Machine, build
from tests.install.node_host import DROPIN, INSTALL_SH, NRI_SETTINGS, NRI_UNIT, SETTINGS, UNIT, fake_host

ROOT = Path(__file__).resolve().parents[2]
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}


def _run(exe: Path, *args: str, cwd: Path = Path("/")) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], cwd=cwd, env=CLEAN_ENV, capture_output=True, text=True, timeout=120)


def test_numapin_runs_from_the_install_alone(built: Path) -> None:
    prefix = built / "opt/numapin"
    r = _run(prefix / "bin/numapin", "--help")
    assert r.returncode == 0, r.stderr
    for command in ("criproxy", "export-kubelet-state", "wait-socket", "status"):
        assert command in r.stdout
    # every module of every package pyproject.toml ships imports, and from the install (the interpreter is isolated)
    packages = [p.rstrip("*") for p in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]]
    probe = ("import importlib, json, pkgutil, sys, ssl, sqlite3, grpc\n"
             f"for name in {packages!r}:\n"
             "    pkg = importlib.import_module(name)\n"
             "    for m in pkgutil.walk_packages(pkg.__path__, name + '.'):\n"
             "        if not m.name.endswith('.__main__'):\n"
             "            importlib.import_module(m.name)\n"
             "import numapin\n"
             "print(json.dumps({'path': sys.path, 'numapin': numapin.__file__, 'grpc': grpc.__file__}))")
    r = subprocess.run([str(prefix / "bin/python3"), "-I", "-c", probe], cwd="/", capture_output=True, text=True,
                       env={**CLEAN_ENV, "LD_LIBRARY_PATH": str(prefix / "lib/so")}, timeout=120)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert all(p.startswith(str(prefix)) for p in seen["path"]), seen["path"]
    assert seen["numapin"].startswith(str(prefix)) and seen["grpc"].startswith(str(prefix))
    # no link leads outside; every library the interpreter loads is glibc's or the install's own
    assert [p for p in prefix.rglob("*") if p.is_symlink() and not p.resolve().is_relative_to(prefix)] == []
    r = subprocess.run(["ldd", str(prefix / "bin/python3")], capture_output=True, text=True,
                       env={**CLEAN_ENV, "LD_LIBRARY_PATH": str(prefix / "lib/so")}, check=True)
    libs = re.findall(r"=> (/\S+)", r.stdout)
    outside = [lib for lib in libs if not lib.startswith(str(prefix)) and not re.search(
        r"/(libc|libm|libpthread|libdl|librt|libutil|libresolv|ld-linux[^/]*)\.so", lib)]
    assert outside == []


def test_the_install_carries_the_installer_the_units_and_its_release(built: Path) -> None:
    meta = built / "opt/numapin/share/numapin"
    release = (meta / "RELEASE").read_text().strip()
    assert re.fullmatch(r"0\.1\.0-[0-9a-f]{12}", release), release
    for src in (INSTALL_SH, UNIT, DROPIN, SETTINGS, NRI_UNIT, NRI_SETTINGS):  # the proxy's and the plugin's
        assert (meta / src.name).read_bytes() == src.read_bytes(), src.name
    with tarfile.open(built / "numapin-node.tar.gz") as tf:
        names = set(tf.getnames())
    assert {"./bin/numapin", "./bin/python3", "./share/numapin/RELEASE", "./share/numapin/install.sh"} <= names
    info = subprocess.run(["dpkg-deb", "-f", str(built / "numapin-node.deb"), "Package", "Version"],
                          capture_output=True, text=True, check=True).stdout
    assert "Package: numapin-node" in info and f"Version: {release.replace('-', '+', 1)}" in info
    listing = subprocess.run(["dpkg-deb", "-c", str(built / "numapin-node.deb")], capture_output=True, text=True,
                             check=True).stdout
    assert f"./opt/numapin-releases/{release}/bin/numapin" in listing
    postinst = subprocess.run(["dpkg-deb", "-I", str(built / "numapin-node.deb"), "postinst"], capture_output=True,
                              text=True, check=True).stdout
    opt = f"/opt/numapin-releases/{release}"
    assert f"{opt}/share/numapin/install.sh --from {opt}" in postinst


def test_installed_on_a_host_the_release_runs_and_the_proxy_starts_from_it(built: Path, tmp_path: Path) -> None:
    host = fake_host(tmp_path)
    prefix = built / "opt/numapin"
    r = host.run("--from", str(prefix), script=prefix / "share/numapin/install.sh")
    assert r.returncode == 0, r.stderr
    installed = host.root / "opt/numapin-releases" / host.release()
    assert (installed / "share/numapin/RELEASE").read_text() == (prefix / "share/numapin/RELEASE").read_text()

    # numapin export-kubelet-state from the installed release (an empty node state)
    sysfs = build(Machine("2c", "one socket, 2 cores, HT", 1, 2, 2), tmp_path / "sysfs")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    CheckpointStore(state_dir / "cpu_manager_state").save(CPUState())
    out = tmp_path / "kubelet/cpu_manager_state"
    r = _run(installed / "bin/numapin", "export-kubelet-state", "--state-dir", str(state_dir), "--sysfs", str(sysfs),
             "--reserved-cpus", "0", "--listen", str(tmp_path / "none.sock"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["policyName"] == "static"

    # the proxy from the installed release: its whole stack imports, and a newer state is refused and kept
    path = state_dir / "cpu_manager_state"
    doc = json.loads(path.read_bytes())
    doc["numapin"][SCHEMA_KEY] = 99
    path.write_text(json.dumps(doc))
    before = path.read_bytes()
    r = _run(installed / "bin/numapin", "criproxy", "--sysfs", str(sysfs), "--state-dir", str(state_dir),
             "--listen", str(tmp_path / "p.sock"), "--runtime-endpoint", f"unix://{tmp_path}/none.sock",
             "--reserved-cpus", "0", "--metrics-address", "")
    assert r.returncode == 1 and "state schema 99" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert path.read_bytes() == before
