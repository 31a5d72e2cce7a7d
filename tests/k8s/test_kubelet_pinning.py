"""numapin under a real kubelet v1.36.2 (``cpuManagerPolicy: none``) and API server: pods made with kubectl, judged
from the kernel and from what ``kubectl get pod`` shows. This machine has CPUs 0-1; the node's proxy reserves CPU 0,
so CPU 1 is the only one a container can have to itself. The first story runs through both of numapin's doors: the
proxy (kubelet's runtime endpoint) and the NRI plugin (kubelet on containerd 2.x's own socket)."""

from __future__ import annotations

import pytest

from allocator.cpuset import CPUSet
from tests.k8s.kube_pods import Pods, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.kubelet]

ALL, RESERVED, EXCLUSIVE = CPUSet.parse("0-1"), CPUSet.parse("0"), CPUSet.parse("1")


@pytest.mark.parametrize("pods", ["proxy", "nri"], indirect=True)
def test_a_guaranteed_pod_is_pinned_and_a_burstable_one_narrowed_then_widened(pods: Pods) -> None:
    b = pods.create(pods.manifest("pin-b", cpu="100m"))
    assert b["status"]["qosClass"] == "Burstable"
    assert pods.cpus(b) == ALL, pods.kernel(b)
    g = pods.create(pods.manifest("pin-g", cpu="1", cpu_limit="1"))
    assert g["status"]["qosClass"] == "Guaranteed" and g["spec"]["nodeName"] == pods.node.name
    assert pods.cpus(g) == EXCLUSIVE, pods.kernel(g)
    assert pods.cpus(b) == RESERVED, pods.kernel(b)  # narrowed before g's container started
    pods.delete("pin-g")
    wait_for(lambda: pods.cpus(b) == ALL, "the Burstable pod widened again once the Guaranteed one went")
    after = pods.get("pin-b")
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert pods.container_id(after) == pods.container_id(b)  # the same container, moved in place


def test_a_share_pod_gets_its_own_cpu_that_stays_in_the_shared_pool(pods: Pods) -> None:
    b = pods.create(pods.manifest("share-b", cpu="100m"))
    s = pods.create(pods.manifest("share-s", cpu="1", cpu_limit="1",
                                  annotations={"qos.gocrane.io/cpu-manager": "share"}))
    assert s["metadata"]["annotations"]["qos.gocrane.io/cpu-manager"] == "share"
    assert pods.cpus(s) == EXCLUSIVE, pods.kernel(s)
    assert pods.cpus(b) == ALL, pods.kernel(b)  # CPU 1 is still the shared pool's
