"""The session's real node (``numapin_lab.k8s.lab_node``): kubelet v1.36.2 (``cpuManagerPolicy: none``) registered
with the session's ``control_plane`` as node ``numapin-node``, its runtime endpoint a ``numapin criproxy`` (CPU 0
reserved) in front of a containerd of its own, and kube-scheduler. Started once, by the first test that asks for
``kubelet_node``, shared by the kubelet stories, stopped at the session's end (kernel settings put back, its cgroup
root and directory removed; the ledger's end check sweeps what a killed run leaves). A missing binary or package
FAILS the test that asks (never a skip). Stories share it: each makes pods of its own names and deletes them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from numapin_lab.cri.containerd import LabError
from numapin_lab.k8s import manifests
from numapin_lab.k8s.binaries import K8sBinariesMissing
from numapin_lab.k8s.control_plane import ControlPlane
from numapin_lab.k8s.crds import install_nrt_crd
from numapin_lab.k8s.lab_node import LabNode
from numapin_lab.k8s.scheduler import Scheduler

__all__ = ["NRI_USER", "PROXY_USER", "kubelet_node", "kubelet_nri_node"]

PROXY_USER = "system:serviceaccount:kube-system:numapin-criproxy"  # the identity manifests/criproxy's RBAC binds
NRI_USER = "system:serviceaccount:kube-system:numapin-nri"  # the identity manifests/nri's RBAC binds


@pytest.fixture(scope="session")
def kubelet_node(control_plane: ControlPlane) -> Iterator[LabNode]:
    install_nrt_crd(control_plane)
    manifests.apply(control_plane, manifests.docs(manifests.CRIPROXY_RBAC))
    proxy_kubeconfig = control_plane.kubeconfig_for(PROXY_USER)
    node = LabNode(control_plane, proxy_args=("--kubeconfig", str(proxy_kubeconfig), "--watch-pods",
                                              "--topology-manager-policy", "single-numa-node"))
    try:
        node.start()
    except (K8sBinariesMissing, LabError) as e:
        pytest.fail(str(e), pytrace=False)
    assert node.dir is not None
    scheduler = Scheduler(control_plane, node.dir)
    try:
        scheduler.start()
        yield node
    finally:
        scheduler.stop()
        node.stop()


@pytest.fixture(scope="session")
def kubelet_nri_node(kubelet_node: LabNode) -> Iterator[LabNode]:
    """A second node, ``numapin-nri-node``: kubelet v1.36.2 on containerd 2.x's own socket, ``numapin nri`` plugged
    into that containerd (CPU 0 reserved), scheduled by the same kube-scheduler. Both nodes are this machine's CPUs:
    a story uses one node at a time (the pods it makes select their node) and deletes its pods. The plugin has the
    proxy's settings: it watches its node's pods (``--watch-pods``) and publishes its NodeResourceTopology, as the
    ServiceAccount manifests/nri's RBAC binds."""
    cp = kubelet_node.cp
    manifests.apply(cp, manifests.docs(manifests.NRI_RBAC))
    node = LabNode(cp, name="numapin-nri-node", door="nri",
                   proxy_args=("--kubeconfig", str(cp.kubeconfig_for(NRI_USER)), "--watch-pods",
                               "--topology-manager-policy", "single-numa-node"))
    try:
        node.start()
    except (K8sBinariesMissing, LabError) as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield node
    finally:
        node.stop()
