"""Programs the tests run from Debian packages that cannot be installed beside what the machine has (Debian's
``kubernetes-client`` ships /usr/bin/kubectl, which may already belong to another package): the package is
downloaded with ``apt-get download`` and unpacked with ``dpkg -x`` into a cache directory keyed by its version, so
later runs reuse it. Fails loudly (never skips) when the package cannot be had."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

__all__ = ["CACHE", "debian_program"]

CACHE = Path(os.environ.get("NUMAPIN_TEST_TOOLS", "/var/cache/numapin-test-tools"))


def _candidate(package: str) -> str:
    out = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True, check=False).stdout
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            return "" if version == "(none)" else version
    return ""


def debian_program(package: str, path: str) -> Path:
    """``path`` (e.g. ``usr/bin/kubectl``) from the Debian ``package``, unpacked in the cache."""
    version = _candidate(package)
    if not version:
        subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600)
        version = _candidate(package)
    if not version:
        raise AssertionError(f"Debian package {package} not found by apt-cache policy (check the apt sources)")
    root = CACHE / f"{package}_{version.replace(':', '%3a')}"
    program = root / path
    if program.exists():
        return program
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        subprocess.run(["apt-get", "download", "-qq", f"{package}={version}"], cwd=tmp, check=True, timeout=600,
                       capture_output=True)
        debs = list(Path(tmp).glob("*.deb"))
        assert len(debs) == 1, f"apt-get download {package} gave {debs}"
        unpacked = Path(tmp) / "root"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True, timeout=300)
        assert (unpacked / path).exists(), f"{package} {version} has no {path}"
        try:
            unpacked.rename(root)
        except OSError:  # another run unpacked it meanwhile
            if not program.exists():
                raise
    return program

