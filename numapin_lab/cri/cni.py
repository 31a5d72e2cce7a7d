"""A lab containerd's own CNI network: a Linux bridge of its own with a /24 of its own, for pods that are not on the
host's network (the CRI validation suite's specs).

Debian's containernetworking-plugins (``/usr/lib/cni``: bridge, host-local, loopback) do the work. The lab makes the
bridge itself, up and with the gateway's address, before containerd runs a pod: its subnet is then visible to the
next lab choosing one (labs run side by side), and the bridge plugin runs with ``isGateway: false`` and
``ipMasq: false``, so it changes no machine-wide setting (no ``net.ipv4.ip_forward``, no iptables rule). The host
reaches the pods (the bridge has the gateway's address) and the pods reach the host (their default route is the
gateway); nothing is routed beyond. A pod's veth goes with its network namespace (mounted under the lab's state
directory: ``netns_mounts_under_state_dir``); the bridge is noted in the ledger (kind ``link``) and deleted by
``remove()``, or by the test session's sweep.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import ledger

__all__ = ["CNI_PLUGINS", "CniError", "CniNetwork", "bridge_exists", "remove_bridge"]

CNI_PLUGINS = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
NEEDED = ("bridge", "host-local", "loopback")  # containerd sets up each pod's lo with the last
SUBNETS = ipaddress.ip_network("10.251.0.0/16")  # the labs' /24s are chosen in here


class CniError(RuntimeError):
    """The lab's network could not be set up (plugins missing, no free subnet, ``ip`` failed)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    except OSError as e:
        raise CniError(f"ip {' '.join(args)}: {e} (apt-get install iproute2)") from None
    if check and r.returncode != 0:
        raise CniError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def bridge_exists(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def remove_bridge(name: str) -> None:
    """Delete the link ``name`` if it is there (the pods' veths on it go with their namespaces)."""
    if bridge_exists(name):
        _ip("link", "delete", name, check=False)


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _ip("-j", "-4", "addr", "show").stdout
    nets = []
    for link in json.loads(out or "[]"):
        for a in link.get("addr_info", []):
            nets.append(ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False))
    return nets


@dataclass(frozen=True)
class CniNetwork:
    """The network of the lab in ``directory``: bridge ``bridge`` on ``subnet`` (gateway: its first address)."""

    bridge: str
    subnet: ipaddress.IPv4Network
    plugins: Path = CNI_PLUGINS

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    @staticmethod
    def check_prerequisites(plugins: Path = CNI_PLUGINS) -> None:
        missing = [str(plugins / p) for p in NEEDED if not (plugins / p).is_file()]
        if missing:
            raise CniError(f"missing {', '.join(missing)}: apt-get install containernetworking-plugins")

    @classmethod
    def create(cls, directory: Path, plugins: Path = CNI_PLUGINS) -> CniNetwork:
        """Make the bridge of the lab in ``directory`` (named from its path, up, with the gateway's address on a
        /24 no interface of the machine is on) and note it in the ledger."""
        cls.check_prerequisites(plugins)
        digest = hashlib.sha256(str(directory).encode()).digest()
        bridge = f"npcni{digest[:4].hex()}"  # 13 characters: a link's name has at most 15
        ledger.note("link", bridge)
        remove_bridge(bridge)  # a crashed run's, of the same directory
        _ip("link", "add", "name", bridge, "type", "bridge")
        try:
            used = _used_networks()
            subnets = list(SUBNETS.subnets(new_prefix=24))
            start = digest[4] % len(subnets)
            for i in range(len(subnets)):
                subnet = subnets[(start + i) % len(subnets)]
                if not any(subnet.overlaps(u) for u in used):
                    break
            else:
                raise CniError(f"no free /24 in {SUBNETS} for the lab's bridge")
            net = cls(bridge, subnet, plugins)
            _ip("addr", "add", f"{net.gateway}/{subnet.prefixlen}", "dev", bridge)
            _ip("link", "set", bridge, "up")
        except BaseException:
            remove_bridge(bridge)
            raise
        return net

    def conflist(self, ipam_dir: Path) -> str:
        """The CNI configuration list containerd reads (host-local's leases in ``ipam_dir``)."""
        return json.dumps({
            "cniVersion": "0.4.0",
            "name": "numapin-lab",
            "plugins": [{
                "type": "bridge", "bridge": self.bridge, "isGateway": False, "ipMasq": False, "hairpinMode": True,
                "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                         "ranges": [[{"subnet": str(self.subnet), "gateway": self.gateway}]],
                         "routes": [{"dst": "0.0.0.0/0", "gw": self.gateway}]},
            }],
        }, indent=2) + "\n"

    def remove(self) -> None:
        remove_bridge(self.bridge)
