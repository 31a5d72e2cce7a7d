"""A running pod's CPU mode changed by a user patching its ``qos.gocrane.io/cpu-manager`` annotation with kubectl,
on a real kubelet v1.36.2: numapin's node agent (``--watch-pods``), through either door (the proxy; the NRI plugin),
sees the change on the API server and moves the pod and the shared pool in place, judged from the kernel; the
containers kubelet shows are the same."""

from __future__ import annotations

import pytest

from allocator.cpuset import CPUSet
from tests.k8s.kube_pods import Pods, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.kubelet]

ALL = CPUSet.parse("0-1")


@pytest.mark.parametrize("pods", ["proxy", "nri"], indirect=True)
def test_a_mode_changed_by_annotating_a_running_pod_moves_it_in_place(pods: Pods) -> None:
    b = pods.create(pods.manifest("mode-b", cpu="100m"))
    g = pods.create(pods.manifest("mode-g", cpu="1", cpu_limit="1"))
    assert (pods.cpus(g), pods.cpus(b)) == (CPUSet.parse("1"), CPUSet.parse("0")), (pods.kernel(g), pods.kernel(b))
    pods.cp.kubectl("annotate", "pod", "mode-g", "qos.gocrane.io/cpu-manager=none")
    wait_for(lambda: pods.cpus(g) == ALL and pods.cpus(b) == ALL, "mode-g on the shared pool, mode-b widened")
    pods.cp.kubectl("annotate", "--overwrite", "pod", "mode-g", "qos.gocrane.io/cpu-manager=exclusive")
    wait_for(lambda: pods.cpus(g) == CPUSet.parse("1") and pods.cpus(b) == CPUSet.parse("0"),
             "mode-g on CPU 1 again, mode-b narrowed")
    for name, was in (("mode-b", b), ("mode-g", g)):
        now = pods.get(name)
        assert now["status"]["containerStatuses"][0]["restartCount"] == 0
        assert pods.container_id(now) == pods.container_id(was)
