"""The lab's control plane (numapin_lab.k8s), the session's ``control_plane``: binaries found or a loud failure
saying what to do, identities by client certificate (a kubelet's one passes the Node authorizer), and numapin's
node agent publishing its NodeResourceTopology to it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from allocator.nrt import build_nrt
from nodeagent.serve.nrt import ApiPublisher
from numapin_lab.k8s.binaries import K8sBinariesMissing, find_k8s_binaries
from numapin_lab.k8s.control_plane import ControlPlane, node_user
from numapin_lab.k8s.crds import install_nrt_crd
from tests import topologies

pytestmark = pytest.mark.apiserver


def test_a_missing_binary_fails_saying_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KUBE_APISERVER_BIN", str(tmp_path / "kube-apiserver"))
    with pytest.raises(K8sBinariesMissing, match=r"\$KUBE_APISERVER_BIN=.*: not an executable file"):
        find_k8s_binaries()
    monkeypatch.delenv("KUBE_APISERVER_BIN")
    monkeypatch.setenv("NUMAPIN_K8S_BIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("NUMAPIN_K8S_BIN_DIR", str(tmp_path / "k8s-bin"))
    with pytest.raises(K8sBinariesMissing, match=r"set KUBE_APISERVER_BIN.*unpack\.sh in .*k8s-bin"):
        find_k8s_binaries()
    monkeypatch.setenv("ETCD_BIN", str(tmp_path / "etcd"))
    monkeypatch.delenv("NUMAPIN_K8S_BIN_CACHE")
    monkeypatch.delenv("NUMAPIN_K8S_BIN_DIR")
    with pytest.raises(K8sBinariesMissing, match=r"apt-get install etcd-server"):
        find_k8s_binaries()


def test_a_kubelet_identity_passes_the_node_authorizer(control_plane: ControlPlane) -> None:
    kubeconfig = control_plane.kubeconfig_for(*node_user("lab-node-a"))
    who = control_plane.kubectl("auth", "whoami", "-o", "json", user_kubeconfig=kubeconfig)
    info = json.loads(who.stdout)["status"]["userInfo"]
    assert info["username"] == "system:node:lab-node-a" and "system:nodes" in info["groups"]
    assert control_plane.kubectl("auth", "can-i", "list", "secrets", "-A", user_kubeconfig=kubeconfig,
                                 check=False).stdout.startswith("no")
    assert control_plane.kubectl("auth", "can-i", "list", "secrets", "-A").stdout.strip() == "yes"


async def test_the_node_agent_publishes_its_topology_there(control_plane: ControlPlane) -> None:
    await asyncio.to_thread(install_nrt_crd, control_plane)
    topo = topologies.dual_socket_ht()
    published = asyncio.Event()
    publisher = ApiPublisher(str(control_plane.kubeconfig), on_published=published.set)
    try:
        for free in ("0-11", "2-11"):  # created, then replaced
            published.clear()
            publisher.publish(build_nrt("lab-nrt-publish", topo, free_cpus=CPUSet.parse(free)))
            await asyncio.wait_for(published.wait(), 60)
    finally:
        await publisher.close()
    got = await asyncio.to_thread(control_plane.kubectl, "get", "noderesourcetopologies", "lab-nrt-publish",
                                  "-o", "json")
    zones = json.loads(got.stdout)["zones"]
    assert [r["available"] for z in zones for r in z["resources"] if r["name"] == "cpu"] == ["5", "5"]
    control_plane.kubectl("delete", "noderesourcetopologies", "lab-nrt-publish")
