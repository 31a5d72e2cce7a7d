"""Fixtures of the checks that run inside a multi-NUMA VM: the shape it was booted as, the machine the kernel
reports, and one containerd + ``numapin criproxy`` node for the whole boot (pods deleted after every module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from allocator.topology import Topology
from tests.numa.guest.node import GuestNode
from tests.numa.shapes import Shape, current_shape


@pytest.fixture(scope="session")
def shape() -> Shape:
    return current_shape()


@pytest.fixture(scope="session")
def machine() -> Topology:
    return Topology.from_sysfs("/sys")


@pytest.fixture(scope="session")
def guest_node() -> Iterator[GuestNode]:
    n = GuestNode().start()
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def node(guest_node: GuestNode) -> Iterator[GuestNode]:
    """The node for a module's checks. A check that starts a scenario calls ``configure`` (pods deleted, the
    proxy on the configuration it needs); the checks after it in the module continue that scenario (one boot is
    slow under emulation: pods are shared by the steps of a story rather than made again for every check)."""
    yield guest_node
    guest_node.delete_all()
