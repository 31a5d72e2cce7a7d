"""scripts/build-node.sh run for the tests: the self-contained node install, its tarball and (optionally) its Debian
package in one directory; and the session's one build (``session_build``), shared by the tests that run the install
on this host (tests/install/conftest.py's ``built``) and the systemd host's install story in a VM
(tests/install/test_systemd_host.py), whichever asks first: the build is about 40 s of CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

__all__ = ["BuildError", "SessionBuild", "build_node", "session_build"]

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


class SessionBuild:
    """One build (install, tarball and Debian package) for the whole session, made by the first caller of ``get``
    (another caller meanwhile waits for it; a failed build fails every caller with the same error). It lives in
    /var/tmp, where a multi-NUMA guest sees it too (the guest has its own tmpfs /tmp); ``remove`` deletes it."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = dict(environ)
        self._lock = threading.Lock()
        self._out: Path | None = None
        self._error: BuildError | None = None

    def get(self) -> Path:
        """The build directory (``build_node``'s layout), building it now if nothing did."""
        with self._lock:
            if self._error is not None:
                raise self._error
            if self._out is None:
                out = Path(tempfile.mkdtemp(prefix="numapin-node-build-", dir="/var/tmp"))
                try:
                    self._out = build_node(out, environ=self.environ)
                except BuildError as e:
                    shutil.rmtree(out, ignore_errors=True)
                    self._error = e
                    raise
            return self._out

    def remove(self) -> None:
        with self._lock:
            if self._out is not None:
                shutil.rmtree(self._out, ignore_errors=True)
                self._out = None


_SESSION_BUILD: pytest.StashKey[SessionBuild] = pytest.StashKey()


def session_build(config: pytest.Config) -> SessionBuild:
    """The session's build (made on first use with the environment of that moment, removed at the session's end)."""
    build = config.stash.get(_SESSION_BUILD, None)
    if build is None:
        build = config.stash[_SESSION_BUILD] = SessionBuild(os.environ)
        config.add_cleanup(build.remove)
    return build
