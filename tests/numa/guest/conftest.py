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
def guest_node(shape: Shape) -> Iterator[GuestNode]:
    n = GuestNode(systemd=shape.init == "systemd").start()
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def node(guest_node: GuestNode, request: pytest.FixtureRequest) -> Iterator[GuestNode]:
    """The node for a module's checks. A check that starts a scenario calls ``configure`` (pods deleted, the
    proxy on the configuration it needs); the checks after it in the module continue that scenario (one boot is
    slow under emulation: pods are shared by the steps of a story rather than made again for every check).
    When a later module uses this fixture, the next proxy starts importing while this module's pods go."""
    yield guest_node
    if later_modules_use_node(request):
        guest_node.prepare_proxy()
    guest_node.delete_all()


def later_modules_use_node(request: pytest.FixtureRequest) -> bool:
    """Whether a test of a module after the requesting one uses the ``node`` fixture (and may configure)."""
    users = [item.path for item in request.session.items if "node" in getattr(item, "fixturenames", ())]
    here = request.node.path
    return here in users and any(p != here for p in users[len(users) - users[::-1].index(here):])
