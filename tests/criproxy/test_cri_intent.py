"""The pod model the proxy builds from CRI when the webhook's annotation is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.decisions.cri_intent import container_from_cri, pod_from_cri, qos_from_cgroup_parent
from nodeagent.node.devices import device_numa_node, devices_numa_nodes
from protos import cri_pb2


@pytest.mark.parametrize(("parent", "qos"), [
    ("/kubepods/pod1234", "Guaranteed"),
    ("/kubepods/burstable/pod1234", "Burstable"),
    ("/kubepods/besteffort/pod1234", "BestEffort"),
    ("kubepods-pod1234.slice", "Guaranteed"),
    ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice", "Burstable"),
    ("kubepods-besteffort-pod1234.slice", "BestEffort"),
    ("/kubepods.slice/kubepods-pod1234.slice", "Guaranteed"),
    ("/system.slice/foo", None),
    ("", None),
])
def test_qos_from_cgroup_parent(parent: str, qos: str | None) -> None:
    assert qos_from_cgroup_parent(parent) == qos


def test_requests_and_limits_from_cfs_values() -> None:
    res = cri_pb2.LinuxContainerResources(cpu_shares=2048, cpu_quota=200000, cpu_period=100000,
                                          memory_limit_in_bytes=1 << 30)
    c = container_from_cri("app", res, "Guaranteed")
    assert (c.cpu_request_milli, c.cpu_limit_milli, c.memory_request, c.memory_limit) == (2000, 2000, 1 << 30, 1 << 30)
    b = container_from_cri("b", cri_pb2.LinuxContainerResources(cpu_shares=512), "Burstable")
    assert (b.cpu_request_milli, b.cpu_limit_milli, b.memory_request) == (500, None, None)
    e = container_from_cri("e", cri_pb2.LinuxContainerResources(cpu_shares=2), "BestEffort")
    assert (e.cpu_request_milli, e.cpu_limit_milli) == (None, None)


def test_pod_grows_with_each_container_and_reads_annotations() -> None:
    req = cri_pb2.CreateContainerRequest(
        config=cri_pb2.ContainerConfig(metadata=cri_pb2.ContainerMetadata(name="b"), linux=cri_pb2.LinuxContainerConfig(
            resources=cri_pb2.LinuxContainerResources(cpu_shares=1024, cpu_quota=100000, cpu_period=100000))),
        sandbox_config=cri_pb2.PodSandboxConfig(
            metadata=cri_pb2.PodSandboxMetadata(name="p", namespace="ns", uid="u"),
            annotations={"qos.gocrane.io/cpu-manager": " Share ", "numapin.io/bypass": "TRUE"},
            linux=cri_pb2.LinuxPodSandboxConfig(cgroup_parent="/kubepods/burstable/podu")))
    pod = pod_from_cri(req, {"a": cri_pb2.LinuxContainerResources(cpu_shares=2)})
    assert [c.name for c in pod.containers] == ["a", "b"]
    assert (pod.qos_class, pod.cpu_manager, pod.bypass, pod.ref) == ("Burstable", "share", True, "ns/p")
    assert pod.container("b").cpu_limit_milli == 1000


def test_device_numa_node_from_sysfs(tmp_path: Path) -> None:
    st = os.stat("/dev/null")
    dev = tmp_path / f"dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    pci = tmp_path / "devices/pci0000:00/0000:00:01.0"
    (pci / "sub").mkdir(parents=True)
    (pci / "numa_node").write_text("1\n")
    dev.parent.mkdir(parents=True)
    dev.mkdir()
    (dev / "device").symlink_to(pci / "sub")
    assert device_numa_node("/dev/null", tmp_path) == 1  # found on the parent PCI device
    (pci / "numa_node").write_text("-1\n")
    assert device_numa_node("/dev/null", tmp_path) is None
    assert device_numa_node("/no/such/device", tmp_path) is None
    grp = tmp_path / "kernel/iommu_groups/7/devices"
    grp.mkdir(parents=True)
    gpu = tmp_path / "devices/gpu"
    gpu.mkdir()
    (gpu / "numa_node").write_text("0\n")
    (grp / "0000:3b:00.0").symlink_to(gpu)
    assert devices_numa_nodes(["/dev/vfio/7", "/dev/null"], tmp_path) == {"/dev/vfio/7": frozenset({0})}
