"""The NRI door's device hints: NRI's ``LinuxDevice`` (the OCI spec's device) carries the device's path *inside* the
container and the host device's numbers; the NUMA node comes from the host device those numbers name (a device plugin
may mount ``/dev/vfio/7`` or ``/dev/nvidia0`` at another path in the container). sysfs is a tree of real files, the
device a real one of this host (``/dev/null``), as in ``tests/criproxy/test_cri_intent.py``."""

from __future__ import annotations

import os
from pathlib import Path

from nodeagent.node.devices import devices_numa_nodes, host_device_path
from nriplugin.door.translate import create_request, device_key
from protos import nri_pb2


def _sysfs_with_null_on_node_1(root: Path) -> tuple[int, int]:
    st = os.stat("/dev/null")
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    dev = root / f"dev/char/{major}:{minor}"
    pci = root / "devices/pci0000:00/0000:00:01.0"
    pci.mkdir(parents=True)
    (pci / "numa_node").write_text("1\n")
    dev.mkdir(parents=True)
    (dev / "device").symlink_to(pci)
    (dev / "uevent").write_text(f"MAJOR={major}\nMINOR={minor}\nDEVNAME=null\n")
    return major, minor


def test_a_device_mounted_elsewhere_in_the_container_gives_the_host_devices_numa_node(tmp_path: Path) -> None:
    major, minor = _sysfs_with_null_on_node_1(tmp_path)
    pod = nri_pb2.PodSandbox(id="sb", uid="u", namespace="ns", name="p")
    container = nri_pb2.Container(id="c", pod_sandbox_id="sb", name="main")
    container.linux.devices.add(path="/dev/accel0", type="c", major=major, minor=minor)
    container.linux.devices.add(path="/dev/unknown", type="c", major=4095, minor=4095)  # sysfs does not know it

    hosts = {k: p for d in container.linux.devices
             if (p := host_device_path(*(k := device_key(d)), tmp_path)) is not None}
    assert hosts == {("c", major, minor): "/dev/null"}
    req = create_request(pod, container, hosts)
    assert [(d.container_path, d.host_path) for d in req.config.devices] == [("/dev/accel0", "/dev/null")]
    assert devices_numa_nodes([d.host_path for d in req.config.devices], tmp_path) == {"/dev/null": frozenset({1})}


def test_the_host_path_of_a_device_number(tmp_path: Path) -> None:
    major, minor = _sysfs_with_null_on_node_1(tmp_path)
    assert host_device_path("c", major, minor, tmp_path) == "/dev/null"
    assert host_device_path("b", major, minor, tmp_path) is None  # a block device of these numbers: none here
    vfio = tmp_path / "dev/char/511:0"
    vfio.mkdir(parents=True)
    (vfio / "uevent").write_text("MAJOR=511\nMINOR=0\nDEVNAME=vfio/7\n")
    assert host_device_path("c", 511, 0, tmp_path) == "/dev/vfio/7"
    (vfio / "uevent").write_text("MAJOR=511\nMINOR=0\nDEVNAME=../etc/passwd\n")
    assert host_device_path("c", 511, 0, tmp_path) is None
    assert host_device_path("c", -1, 0, tmp_path) is None
