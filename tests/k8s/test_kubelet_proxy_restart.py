"""numapin's proxy killed (SIGKILL) and restarted under a real kubelet v1.36.2 with pods running: nothing moves
(the kernel's cpusets, the containers kubelet shows), and the restarted proxy serves kubelet's next calls (a pod
deleted gives its CPU back to the shared pool)."""

from __future__ import annotations

import pytest

from allocator.cpuset import CPUSet
from tests.k8s.kube_pods import Pods, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.kubelet]


def test_a_proxy_killed_and_restarted_moves_nothing(pods: Pods) -> None:
    proxy = pods.node.proxy
    assert proxy is not None
    b = pods.create(pods.manifest("kill-b", cpu="100m"))
    g = pods.create(pods.manifest("kill-g", cpu="1", cpu_limit="1"))
    before = {p["metadata"]["name"]: (pods.cpus(p), pods.container_id(p)) for p in (b, g)}
    assert before == {"kill-b": (CPUSet.parse("0"), pods.container_id(b)),
                      "kill-g": (CPUSet.parse("1"), pods.container_id(g))}
    proxy.kill()
    proxy.start()
    for name in ("kill-b", "kill-g"):
        now = pods.get(name)
        status = now["status"]["containerStatuses"][0]
        assert "running" in status["state"] and status["restartCount"] == 0, status
        assert (pods.cpus(now), pods.container_id(now)) == before[name], pods.kernel(now)
    pods.delete("kill-g")  # through the restarted proxy
    wait_for(lambda: pods.cpus(b) == CPUSet.parse("0-1"), "CPU 1 back in the shared pool")
