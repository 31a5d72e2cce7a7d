"""The lab's CNI network (numapin_lab.cri.cni): its bridge is made with the gateway's address on a free /24, the
conflist changes no machine-wide setting, the ledger names the bridge, and the session's end check finds a bridge
left behind and sweeps it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from numapin_lab.cri import ledger
from numapin_lab.cri.cni import CniNetwork, bridge_exists, remove_bridge
from tests.leak_check import find_leftovers, sweep

pytestmark = pytest.mark.containerd


def test_a_left_bridge_is_found_by_the_end_check_and_swept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    book = tmp_path / "ledger.txt"
    monkeypatch.setenv(ledger.ENV, str(book))
    net = CniNetwork.create(tmp_path / "lab")
    try:
        other = CniNetwork.create(tmp_path / "lab2")
        try:
            assert other.bridge != net.bridge and not other.subnet.overlaps(net.subnet)
        finally:
            other.remove()
        shown = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", net.bridge], capture_output=True,
                               text=True, check=True).stdout
        assert f"{net.gateway}/24" in shown
        plugin = json.loads(net.conflist(tmp_path / "ipam"))["plugins"][0]
        assert (plugin["type"], plugin["bridge"], plugin["isGateway"], plugin["ipMasq"]) == (
            "bridge", net.bridge, False, False)
        assert ledger.read(book)["link"] == [net.bridge, other.bridge]
        assert f"link {net.bridge}" in find_leftovers(book).lines()
        assert sweep(book) == []
        assert not bridge_exists(net.bridge)
    finally:
        remove_bridge(net.bridge)
