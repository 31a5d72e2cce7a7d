"""The containerds a shape's guest tests run besides the system's (``Shape.containerds``: the NRI story's 2.x on
2s4n, 2.1 and 1.7 under systemd on 1s2n-systemd): the host has them in its cache before the boot, and inside the guest
a missing one is an error that says so, never a download."""

from __future__ import annotations

from pathlib import Path

import pytest

from numapin_lab.cri import containerd_versions
from numapin_lab.cri.containerd import LabError, containerd_version
from numapin_lab.cri.containerd_versions import CONTAINERDS, containerd_bin_dir
from tests.numa.boots import GUEST, ensure_containerds
from tests.numa.guest import test_systemd_driver
from tests.numa.shapes import SHAPES


def test_a_missing_cache_is_an_error_without_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containerd_versions, "CACHE", tmp_path / "cache")
    with pytest.raises(LabError, match=r"containerd 2\.x .* is not in the cache .* may not be fetched here"):
        containerd_bin_dir("2.x", fetch=False)
    assert not (tmp_path / "cache").exists()  # nothing was fetched, not even the directory made


def test_the_nri_storys_containerd_is_in_the_hosts_cache_before_the_2s4n_boot() -> None:
    shape = SHAPES["2s4n"]
    assert "test_nri.py" in shape.guest_tests and shape.containerds == ("2.x",)
    assert "CONTAINERD = \"2.x\"" in (GUEST / "test_nri.py").read_text()  # the version its guest node runs
    (found,) = ensure_containerds(shape)
    assert containerd_version(found).startswith(CONTAINERDS["2.x"].prefix)
    assert containerd_bin_dir("2.x", fetch=False) == found  # what the guest will find


def test_the_systemd_shapes_containerds_are_in_the_hosts_cache_before_its_boot() -> None:
    shape = SHAPES["1s2n-systemd"]
    assert shape.guest_tests == ("test_systemd_driver.py",)
    assert shape.containerds == test_systemd_driver.VERSIONS == ("2.x", "1.7")  # what its guest nodes run
    found = ensure_containerds(shape)
    for version, bin_dir in zip(shape.containerds, found, strict=True):
        assert containerd_version(bin_dir).startswith(CONTAINERDS[version].prefix)
        assert containerd_bin_dir(version, fetch=False) == bin_dir  # what the guest will find
