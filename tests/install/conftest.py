"""The self-contained node install, built once per session by scripts/build-node.sh (about 45 s on an idle 2-core
machine) for the tests that run it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build directory: ``opt/numapin`` (the install), ``numapin-node.tar.gz`` and ``numapin-node.deb``."""
    out = tmp_path_factory.mktemp("node-build")
    r = subprocess.run(["bash", str(ROOT / "scripts/build-node.sh"), "--prefix", str(out / "opt/numapin"),
                        "--tar", str(out / "numapin-node.tar.gz"), "--deb", str(out / "numapin-node.deb")],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"build-node.sh failed:\n{r.stderr[-5000:]}"
    return out
