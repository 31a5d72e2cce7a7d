"""Restarts under a real kubelet v1.36.2 with pods running, through both doors: numapin's node agent killed (SIGKILL)
and restarted (the proxy, kubelet's runtime endpoint; the NRI plugin, containerd 2.x's), and on the proxy's node
kubelet stopped and started again first (there kubelet is the proxy's client; under NRI it talks to containerd and
its restart sends the plugin nothing, so the story spares the NRI node that cost). Nothing moves (the kernel's
cpusets and every process's ``Cpus_allowed_list``, the containers kubelet shows), and the node serves kubelet's next
calls afterwards (a pod deleted gives its CPU back to the shared pool)."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.cpuset import CPUSet
from tests.k8s.kube_pods import Pods, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.kubelet]


def _unmoved(pods: Pods, before: dict[str, tuple[CPUSet | None, str]]) -> None:
    for name, was in before.items():
        now: dict[str, Any] = pods.get(name)
        status = now["status"]["containerStatuses"][0]
        assert "running" in status["state"] and status["restartCount"] == 0, status
        assert (pods.cpus(now), pods.container_id(now)) == was, pods.kernel(now)


@pytest.mark.parametrize("pods", ["proxy", "nri"], indirect=True)
def test_kubelet_and_the_node_agent_restarted_with_pods_running_move_nothing(pods: Pods) -> None:
    node = pods.node
    assert node.proxy is not None and node.kubelet is not None
    b = pods.create(pods.manifest("kill-b", cpu="100m"))
    g = pods.create(pods.manifest("kill-g", cpu="1", cpu_limit="1"))
    before = {p["metadata"]["name"]: (pods.cpus(p), pods.container_id(p)) for p in (b, g)}
    assert before == {"kill-b": (CPUSet.parse("0"), pods.container_id(b)),
                      "kill-g": (CPUSet.parse("1"), pods.container_id(g))}
    if node.door == "proxy":
        node.kubelet.kill()
        node.kubelet.start()
        _unmoved(pods, before)
    node.proxy.kill()
    node.proxy.start()
    _unmoved(pods, before)
    pods.delete("kill-g")  # through the restarted node agent (and kubelet)
    wait_for(lambda: pods.cpus(b) == CPUSet.parse("0-1"), "CPU 1 back in the shared pool")
