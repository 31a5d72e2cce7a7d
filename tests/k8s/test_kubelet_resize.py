"""In-place resize through ``pods/resize`` with a real kubelet v1.36.2, through both of numapin's doors (the proxy as
kubelet's runtime endpoint; the NRI plugin, kubelet on containerd 2.x's own socket), as a user asks for it
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


def _shown(pods: Pods, name: str, cpu: str) -> dict[str, Any] | None:
    """The pod once its resize to ``cpu`` is done and shown in its status: no resize in progress, the CPU request
    the runtime reports back (from the container's CPU shares) is ``cpu``."""
    pod = pods.get(name)
    status = pod["status"]["containerStatuses"][0]
    if _condition(pod, "PodResizeInProgress") is None and status.get("resources", {}).get("requests", {}).get(
            "cpu") == cpu:
        return pod
    return None


class StaleCpuLimit(AssertionError):
    """The CPU limit the pod's status shows is not the one kubelet set (kubelet keeps the last positive limit when
    the runtime reports a container without a CFS quota)."""


def _limit(pod: dict[str, Any]) -> str | None:
    return pod["status"]["containerStatuses"][0].get("resources", {}).get("limits", {}).get("cpu")  # type: ignore[no-any-return]


@pytest.mark.parametrize("pods", ["proxy", "nri"], indirect=True)
def test_a_growth_numapin_cannot_give_is_refused_a_shrink_to_a_fraction_and_a_growth_that_fits_are_done(
        pods: Pods) -> None:
    """Every check runs through both doors; where the status shows a CPU limit other than kubelet's, the story goes
    on and fails at its end with ``StaleCpuLimit``. A pinned container runs without a CFS quota in the kernel, yet
    kubelet shows its limit: the proxy rewrites ContainerStatus, the NRI door lifts the quota in the kernel only and
    leaves kubelet's in containerd's record (docs/nri.md "The CFS quota of a pinned container")."""
    stale: list[str] = []

    def limit_shown(pod: dict[str, Any], cpu: str, when: str) -> None:
        if _limit(pod) != cpu:
            stale.append(f"{when}: status.resources.limits.cpu {_limit(pod)!r}, kubelet set {cpu!r}")

    g = pods.create(pods.manifest("rs-g", cpu="1", cpu_limit="1"))
    assert pods.cpus(g) == CPUSet.parse("1"), pods.kernel(g)
    _resize(pods, "rs-g", "2")  # fits the node's allocatable (2): kubelet asks the runtime, numapin refuses
    refused = wait_for(lambda: (c := _condition(pods.get("rs-g"), "PodResizeInProgress")) and
                       c.get("reason") == "Error" and c, "the refused growth shown in the pod's conditions")
    assert "numapin: pod default/rs-g container c: resize refused" in refused["message"], refused
    assert pods.cpus(g) == CPUSet.parse("1"), pods.kernel(g)  # still on its CPU, nothing half-done
    after = pods.get("rs-g")  # right afterwards, the status shows the size the container still has
    assert after["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] == "1", after["status"]
    limit_shown(after, "1", "after the refused growth")

    _resize(pods, "rs-g", "500m")  # integer -> fractional: back to the shared pool, CFS quota half a CPU
    done = wait_for(lambda: _shown(pods, "rs-g", "500m"), "the shrink done and shown in the pod's status")
    shown = done["status"]["containerStatuses"][0]
    assert shown["allocatedResources"]["cpu"] == "500m", shown
    assert _limit(done) == "500m", shown  # a fractional container keeps its CFS quota: the runtime reports it
    assert shown["restartCount"] == 0 and pods.container_id(done) == pods.container_id(g)
    kernel = wait_for(lambda: (k := pods.kernel(g)).cpus == CPUSet.parse("0-1") and k,
                      "the container back on the whole shared pool")
    assert (kernel.cfs_quota_us, kernel.cfs_period_us) == (50000, 100000), kernel

    _resize(pods, "rs-g", "1")  # fractional -> integer: CPU 1 to itself again, the same container
    grown = wait_for(lambda: _shown(pods, "rs-g", "1"), "the growth done and shown in the pod's status")
    shown = grown["status"]["containerStatuses"][0]
    assert shown["allocatedResources"]["cpu"] == "1" and shown["restartCount"] == 0, shown
    assert pods.container_id(grown) == pods.container_id(g)
    kernel = wait_for(lambda: (k := pods.kernel(g)).cpus == CPUSet.parse("1") and k, "the container on CPU 1 again")
    assert kernel.cfs_quota_us == -1, kernel  # on a CPU of its own it runs without a CFS quota (numapin's default)
    limit_shown(grown, "1", "after the growth")
    if stale:
        raise StaleCpuLimit("; ".join(stale))
