"""scripts/build-node.sh run for the tests: the self-contained node install, its tarball and (optionally) its Debian
package in one directory."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["BuildError", "build_node"]

ROOT = Path(__file__).resolve().parents[2]


class BuildError(RuntimeError):
    """build-node.sh failed (its stderr's tail in the message)."""


def build_node(out: Path, *, deb: bool = True, environ: Mapping[str, str] | None = None) -> Path:
    """Build into ``out``: ``opt/numapin`` (the install), ``numapin-node.tar.gz`` and, with ``deb``,
    ``numapin-node.deb``; ``out`` returned."""
    argv = ["bash", str(ROOT / "scripts/build-node.sh"), "--prefix", str(out / "opt/numapin"),
            "--tar", str(out / "numapin-node.tar.gz")]
    if deb:
        argv += ["--deb", str(out / "numapin-node.deb")]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env=None if environ is None else dict(environ))
    if r.returncode != 0:
        raise BuildError(f"build-node.sh failed (exit {r.returncode}):\n{r.stderr[-5000:]}")
    return out
