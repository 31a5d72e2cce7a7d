"""The session's real control plane (etcd + kube-apiserver v1.36.2, ``numapin_lab.k8s``): started once, by the
first test that asks for ``control_plane``, shared by every test that needs an API server, stopped at the end of
the session. A missing binary FAILS the test that asks (never a skip). Tests share it: they make objects with
names of their own and leave alone what others made (cluster-scoped objects included)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from numapin_lab.k8s.binaries import K8sBinariesMissing
from numapin_lab.k8s.control_plane import ControlPlane

__all__ = ["control_plane"]


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    try:
        cp = ControlPlane()
    except K8sBinariesMissing as e:
        pytest.fail(str(e), pytrace=False)
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()
