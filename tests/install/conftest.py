"""The self-contained node install, built once per session by scripts/build-node.sh (about 45 s on an idle 2-core
machine; tests.install.node_build.session_build, shared with the systemd host's story) for the tests that run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.install.node_build import session_build


@pytest.fixture(scope="session")
def built(pytestconfig: pytest.Config) -> Path:
    """A build directory: ``opt/numapin`` (the install), ``numapin-node.tar.gz`` and ``numapin-node.deb``."""
    return session_build(pytestconfig).get()
