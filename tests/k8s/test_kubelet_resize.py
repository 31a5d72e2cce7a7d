"""In-place resize through ``pods/resize`` with a real kubelet v1.36.2 on numapin's proxy, as a user asks for it
(``kubectl patch --subresource resize``) and reads the answer (the pod's conditions and status resources), and as
the kernel runs it. CPUs 0-1, CPU 0 reserved by numapin: a container can have CPU 1 to itself and no more."""

from __future__ import annotations

import json
from typing import Any

import pytest

from allocator.cpuset import CPUSet
from tests.k8s.kube_pods import Pods, wait_for

pytestmark = [pytest.mark.apiserver, pytest.mark.kubelet]


def _resize(pods: Pods, name: str, cpu: str) -> None:
    patch = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]}}
    pods.cp.kubectl("patch", "pod", name, "--subresource", "resize", "-p", json.dumps(patch))


def _condition(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in pod["status"].get("conditions", []) if c["type"] == kind), None)


def test_a_growth_numapin_cannot_give_is_refused_and_a_shrink_to_a_fraction_is_done(pods: Pods) -> None:
    g = pods.create(pods.manifest("rs-g", cpu="1", cpu_limit="1"))
    assert pods.cpus(g) == CPUSet.parse("1"), pods.kernel(g)
    _resize(pods, "rs-g", "2")  # fits the node's allocatable (2): kubelet asks the runtime, numapin refuses
    refused = wait_for(lambda: (c := _condition(pods.get("rs-g"), "PodResizeInProgress")) and
                       c.get("reason") == "Error" and c, "the refused growth shown in the pod's conditions")
    assert "numapin: pod default/rs-g container c: resize refused" in refused["message"], refused
    assert pods.cpus(g) == CPUSet.parse("1"), pods.kernel(g)  # still on its CPU, nothing half-done

    _resize(pods, "rs-g", "500m")  # integer -> fractional: back to the shared pool, CFS quota half a CPU
    done = wait_for(lambda: (p := pods.get("rs-g")) and _condition(p, "PodResizeInProgress") is None and
                    p["status"]["containerStatuses"][0].get("resources", {}).get("limits", {}).get("cpu") ==
                    "500m" and p, "the shrink done and shown in the pod's status")
    shown = done["status"]["containerStatuses"][0]
    assert shown["resources"]["requests"]["cpu"] == "500m" and shown["allocatedResources"]["cpu"] == "500m"
    assert shown["restartCount"] == 0 and pods.container_id(done) == pods.container_id(g)
    kernel = wait_for(lambda: (k := pods.kernel(g)).cpus == CPUSet.parse("0-1") and k,
                      "the container back on the whole shared pool")
    assert (kernel.cfs_quota_us, kernel.cfs_period_us) == (50000, 100000), kernel
