"""CDI devices (CRI's ``ContainerConfig.CDI_devices``): real spec files (JSON and YAML) in spec directories, resolved
to device nodes whose NUMA nodes come from a sysfs tree (``/dev/null`` and ``/dev/zero`` given NUMA nodes through
their ``dev/char/M:m/device`` links); then the proxy steering a container's CPUs by a CDI device's node, and an
unknown device giving no hint, a log line and a count, never a failed create."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from criproxy.app import CriProxy
from nodeagent.node.cdi import CDIProblem, cdi_numa_nodes, load_specs, resolve
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy.test_pinning import created_resources, proxy_config

GPU_YAML = """\
cdiVersion: "0.6.0"
kind: vendor.example/gpu
devices:
  - name: gpu0
    containerEdits:
      deviceNodes:
        - path: /dev/gpu0
          hostPath: /dev/null
  - name: gpu1
    containerEdits:
      deviceNodes:
        - path: /dev/zero
containerEdits:
  env: ["VENDOR=1"]
"""

NIC_JSON = {"cdiVersion": "0.5.0", "kind": "vendor.example/nic",
            "devices": [{"name": "vf0", "containerEdits": {"deviceNodes": [{"path": "/dev/vf0",
                                                                            "hostPath": "/dev/zero"}]}}],
            "containerEdits": {"deviceNodes": [{"path": "/dev/null"}]}}


def char_device_on(sysfs: Path, dev: str, node: int) -> None:
    """Give the character device ``dev`` a NUMA node in the sysfs tree (through a PCI-like parent)."""
    st = os.stat(dev)
    pci = sysfs / f"devices/pci0000:00/{os.major(st.st_rdev)}-{os.minor(st.st_rdev)}"
    (pci / "func").mkdir(parents=True, exist_ok=True)
    (pci / "numa_node").write_text(f"{node}\n")
    link = sysfs / f"dev/char/{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
    link.mkdir(parents=True, exist_ok=True)
    (link / "device").symlink_to(pci / "func")


@pytest.fixture
def spec_dirs(tmp_path: Path) -> tuple[Path, Path]:
    etc, run = tmp_path / "etc-cdi", tmp_path / "run-cdi"
    etc.mkdir()
    run.mkdir()
    (etc / "gpu.yaml").write_text(GPU_YAML)
    (etc / "nic.json").write_text(json.dumps(NIC_JSON))
    (etc / "README").write_text("not a spec: ignored")
    return etc, run


def test_names_resolve_to_their_device_nodes_in_json_and_yaml_specs(spec_dirs: tuple[Path, Path]) -> None:
    specs = load_specs(spec_dirs)
    assert specs.problems == ()
    assert resolve(["vendor.example/gpu=gpu0"], specs).host_paths == ("/dev/null",)  # hostPath
    assert resolve(["vendor.example/gpu=gpu1"], specs).host_paths == ("/dev/zero",)  # path when no hostPath
    # the spec's own containerEdits go with each of its devices; a node named twice is one
    assert resolve(["vendor.example/nic=vf0", "vendor.example/gpu=gpu0"], specs).host_paths == (
        "/dev/zero", "/dev/null")


def test_all_is_every_device_of_the_kind_or_the_spec_s_own_device_named_all(spec_dirs: tuple[Path, Path]) -> None:
    etc, _ = spec_dirs
    assert resolve(["vendor.example/gpu=all"], load_specs(spec_dirs)).host_paths == ("/dev/null", "/dev/zero")
    (etc / "gpu.yaml").write_text(GPU_YAML.replace("  - name: gpu1\n", "  - name: all\n"))
    assert resolve(["vendor.example/gpu=all"], load_specs(spec_dirs)).host_paths == ("/dev/zero",)


def test_a_later_directory_s_device_wins(spec_dirs: tuple[Path, Path]) -> None:
    _, run = spec_dirs
    (run / "gpu-override.json").write_text(json.dumps({
        "cdiVersion": "0.6.0", "kind": "vendor.example/gpu",
        "devices": [{"name": "gpu0", "containerEdits": {"deviceNodes": [{"path": "/dev/zero"}]}}]}))
    specs = load_specs(spec_dirs)
    assert resolve(["vendor.example/gpu=gpu0"], specs).host_paths == ("/dev/zero",)
    assert resolve(["vendor.example/gpu=gpu1"], specs).host_paths == ("/dev/zero",)  # the rest of /etc/cdi's stays


def test_unknown_malformed_and_unreadable_give_problems_not_errors(spec_dirs: tuple[Path, Path],
                                                                   tmp_path: Path) -> None:
    etc, _ = spec_dirs
    (etc / "broken.yaml").write_text("kind: [unclosed\n")
    (etc / "nokind.json").write_text('{"devices": [{"name": "x"}]}')
    (etc / "huge.json").write_text(" " * ((4 << 20) + 1))
    not_a_dir = tmp_path / "file-not-dir"
    not_a_dir.write_text("")
    specs = load_specs([*spec_dirs, not_a_dir, tmp_path / "missing"])  # a missing directory is no problem
    assert sorted(p.reason for p in specs.problems) == ["invalid", "invalid", "unreadable", "unreadable"]
    got = resolve(["vendor.example/gpu=gpu9", "not-a-name", "vendor.example/gpu=gpu0"], specs)
    assert got.host_paths == ("/dev/null",)  # what resolves still does
    reasons = [p.reason for p in got.problems]
    assert reasons[:2] == ["unknown", "malformed"] and sorted(reasons[2:]) == sorted(p.reason for p in specs.problems)
    assert all(isinstance(p, CDIProblem) and p.detail for p in got.problems)
    assert resolve(["vendor.example/gpu=gpu0"], specs).problems == ()  # spec problems only matter for the unknown


def test_numa_nodes_of_cdi_devices_from_sysfs(spec_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    char_device_on(sysfs, "/dev/null", 1)
    char_device_on(sysfs, "/dev/zero", 0)
    nodes, problems = cdi_numa_nodes(["vendor.example/gpu=gpu0", "vendor.example/nic=vf0"], sysfs, spec_dirs)
    assert (nodes, problems) == ({"/dev/null": frozenset({1}), "/dev/zero": frozenset({0})}, ())
    assert cdi_numa_nodes([], sysfs, spec_dirs) == ({}, ())


# -- through the proxy --------------------------------------------------------------------------------------------


@pytest.fixture
async def cdi_proxy(short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> AsyncIterator[CriProxy]:
    etc = short_tmp / "cdi"
    etc.mkdir()
    (etc / "gpu.yaml").write_text(GPU_YAML)
    char_device_on(two_numa_sysfs, "/dev/null", 1)  # gpu0 on node 1 (CPUs 4-7)
    p = await CriProxy(proxy_config(short_tmp, runtime, two_numa_sysfs, topology_manager_policy="single-numa-node",
                                    cdi_spec_dirs=f"{short_tmp}/none:{etc}")).start()
    await asyncio.wait_for(p.reconciled.wait(), 30)
    yield p
    await p.stop()


def cdi_container(k: CRIClient, name: str, *devices: str) -> pb.ContainerConfig:
    cc = k.container_config(name, cpu_milli=2000, limit_milli=2000)
    cc.CDI_devices.extend(pb.CDIDevice(name=d) for d in devices)
    return cc


async def test_a_cdi_device_s_numa_node_steers_the_cpus(cdi_proxy: CriProxy, runtime: MemoryRuntime) -> None:
    async with CRIClient(cdi_proxy.config.listen) as k:
        cfg = k.sandbox_config("gpu", "uid-gpu")
        sid = await k.run_pod_sandbox(cfg)
        cid = await k.create_container(sid, cdi_container(k, "app", "vendor.example/gpu=gpu0"), cfg)
    res = created_resources(runtime, cid)
    assert CPUSet.parse(res.cpuset_cpus).issubset(CPUSet.parse("4-7")) and res.cpuset_mems == "1"
    assert [d.name for d in runtime.containers[cid].config.CDI_devices] == ["vendor.example/gpu=gpu0"]  # forwarded


async def test_an_unknown_cdi_device_gives_no_hint_a_log_line_and_a_count(
        cdi_proxy: CriProxy, runtime: MemoryRuntime, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "numapin.criproxy")
    async with CRIClient(cdi_proxy.config.listen) as k:
        cfg = k.sandbox_config("x", "uid-x")
        sid = await k.run_pod_sandbox(cfg)
        cid = await k.create_container(sid, cdi_container(k, "app", "vendor.example/gpu=nosuch", "bad name"), cfg)
    assert CPUSet.parse(created_resources(runtime, cid).cpuset_cpus)  # created and pinned, with no device hint
    assert "CDI device 'vendor.example/gpu=nosuch' is in no readable spec" in caplog.text
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{cdi_proxy.metrics_port}/metrics", timeout=10).read().decode())
    assert 'numapin_criproxy_cdi_unresolved_total{reason="unknown"} 1.0' in text
    assert 'numapin_criproxy_cdi_unresolved_total{reason="malformed"} 1.0' in text
