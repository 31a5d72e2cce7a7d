"""The self-contained node install, built once per session by scripts/build-node.sh (about 45 s on an idle 2-core
machine) for the tests that run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.install.node_build import build_node


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build directory: ``opt/numapin`` (the install), ``numapin-node.tar.gz`` and ``numapin-node.deb``."""
    return build_node(tmp_path_factory.mktemp("node-build"))
