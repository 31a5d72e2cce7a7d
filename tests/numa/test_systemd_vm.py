"""numapin_lab.systemd_vm's pieces that run without a VM: the appended cpio archive (read back by GNU cpio), the
choice of numa-lab's cached kernel and initramfs, the QEMU command line. The boot itself is the 1s2n-systemd
shape's (tests/numa/test_multi_numa.py)."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from numapin_lab.numa_vm import VMError, VMSpec
from numapin_lab.systemd_vm import INIT2, TARGET, LabAssets, _newc, find_assets, qemu_argv, systemd_initramfs


def test_appended_archive_replaces_init2_as_cpio_reads_it(tmp_path: Path) -> None:
    cpio = shutil.which("cpio")
    if cpio is None:
        pytest.fail("cpio not found: apt-get install cpio")
    base = tmp_path / "initramfs-6.1.0-9-amd64-0123456789ab.cpio.gz"
    base.write_bytes(gzip.compress(_newc([("init", 0o755, b"#!/bin/sh\n"), ("init2", 0o755, b"old\n")])))
    out = systemd_initramfs(LabAssets(tmp_path / "vmlinux", base, "6.1.0-9-amd64"), tmp_path / "cache")
    data = out.read_bytes()
    assert data.startswith(base.read_bytes())
    extra = gzip.decompress(data[len(base.read_bytes()):])
    (tmp_path / "x").mkdir()
    subprocess.run([cpio, "-id", "--quiet"], input=extra, cwd=tmp_path / "x", check=True)
    init2 = tmp_path / "x" / "init2"
    assert init2.read_text() == INIT2.replace("__TARGET__", TARGET)
    assert init2.stat().st_mode & 0o777 == 0o755
    assert "exec /lib/systemd/systemd --unit=numalab.target" in init2.read_text()
    assert systemd_initramfs(LabAssets(tmp_path / "vmlinux", base, "6.1.0-9-amd64"), tmp_path / "cache") == out


def test_assets_are_the_newest_initramfs_and_its_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMA_VM_CACHE", str(tmp_path))
    old = tmp_path / "initramfs-6.1.0-8-amd64-aaaaaaaaaaaa.cpio.gz"
    new = tmp_path / "initramfs-6.1.0-9-amd64-bbbbbbbbbbbb.cpio.gz"
    old.write_bytes(b"x")
    new.write_bytes(b"y")
    os.utime(old, (1, 1))
    (tmp_path / "vmlinux-6.1.0-9-amd64").write_bytes(b"k")
    got = find_assets(Path("/nonexistent/numa-vm.sh"))
    assert (got.initramfs, got.kernel, got.kver) == (new, tmp_path / "vmlinux-6.1.0-9-amd64", "6.1.0-9-amd64")
    (tmp_path / "vmlinux-6.1.0-9-amd64").unlink()
    if not Path("/boot/vmlinuz-6.1.0-9-amd64").exists():
        with pytest.raises(VMError, match=r"no kernel for 6\.1\.0-9-amd64"):
            find_assets(Path("/nonexistent/numa-vm.sh"))


def test_qemu_command_line_boots_systemd_on_cgroup_v2(tmp_path: Path) -> None:
    from numapin_lab.numa_vm import find_numa_vm

    try:
        numa_vm = find_numa_vm()
    except VMError as e:
        pytest.fail(str(e))
    argv = qemu_argv(numa_vm, VMSpec(topology="1s2n", cgroup="v2", init="systemd", shares=("/srv/x",),
                                     kernel_args="hugepagesz=1G hugepages=0:1"), tmp_path, tmp_path / "initrd",
                     tmp_path / "kernel")
    append = argv[argv.index("-append") + 1]
    assert "systemd.unified_cgroup_hierarchy=1" in append and f"systemd.unit={TARGET}" in append
    assert append.endswith(" hugepagesz=1G hugepages=0:1")
    assert "rdinit=/init" in append
    assert argv[argv.index("-smp") + 1].startswith("4,sockets=1")
    assert "local,path=/srv/x,mount_tag=rw0,security_model=none,multidevs=remap" in argv
    assert argv.count("-numa") >= 2
