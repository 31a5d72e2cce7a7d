"""The lab's CNI network (numapin_lab.cri.cni): its bridge is made with the gateway's address on a free /24, the
conflist changes no machine-wide setting, the ledger names the bridge, and the session's end check finds a bridge
left behind and sweeps it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from numapin_lab.cri import ledger
from numapin_lab.cri.cni import CniNetwork, bridge_exists, remove_bridge
from tests.leak_check import find_leftovers, sweep

pytestmark = pytest.mark.containerd


def test_a_left_bridge_is_found_by_the_end_check_and_swept(tmp_path: Path) -> None:
    net = CniNetwork.create(tmp_path / "lab")
    try:
        other = CniNetwork.create(tmp_path / "lab2")
        try:
            assert other.bridge != net.bridge and not other.subnet.overlaps(net.subnet)
        finally:
            other.remove()
        session = os.environ.get(ledger.ENV)
        if session:  # the session's ledger names both (the process's environment is never changed: other
            assert {net.bridge, other.bridge} <= set(ledger.read(session)["link"])  # threads note there too)
        shown = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", net.bridge], capture_output=True,
                               text=True, check=True).stdout
        assert f"{net.gateway}/24" in shown
        plugin = json.loads(net.conflist(tmp_path / "ipam"))["plugins"][0]
        assert (plugin["type"], plugin["bridge"], plugin["isGateway"], plugin["ipMasq"]) == (
            "bridge", net.bridge, False, False)
        book = tmp_path / "ledger.txt"  # a ledger of this test's own, for the end check to read and sweep
        ledger.note("link", net.bridge, env={ledger.ENV: str(book)})
        assert find_leftovers(book).lines() == [f"link {net.bridge}"]
        assert sweep(book) == []
        assert not bridge_exists(net.bridge)
    finally:
        remove_bridge(net.bridge)
