"""The lab's NRI section: on in the lab's own directory with ``nri=True`` (containerd >= 1.7), switched off
explicitly otherwise on >= 1.7 (2.x would listen on the machine-wide socket), absent on 1.6 (which has no NRI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from numapin_lab.cri.containerd import ContainerdLab, LabError


def _config(tmp_path: Path, version: str, nri: bool) -> str:
    lab = ContainerdLab(tmp_path / "lab", nri=nri)
    lab.version = version  # what start() reads from `containerd --version`
    lab._write_config()
    return lab.config.read_text()


@pytest.mark.parametrize("version", ["1.7.24~ds1", "2.1.9+unknown"])
def test_nri_on_in_the_labs_directory_or_off(tmp_path: Path, version: str) -> None:
    on = _config(tmp_path, version, True)
    lab_dir = tmp_path / "lab"
    assert 'plugins."io.containerd.nri.v1.nri"]\n    disable = false' in on
    assert f'socket_path = "{lab_dir}/nri.sock"' in on and f'plugin_path = "{lab_dir}/nri/plugins"' in on
    assert "/var/run/nri" not in on and "/opt/nri" not in on
    off = _config(tmp_path, version, False)
    assert 'plugins."io.containerd.nri.v1.nri"]\n    disable = true' in off and "/var/run/nri" not in off


def test_containerd_1_6_has_no_nri(tmp_path: Path) -> None:
    assert "io.containerd.nri" not in _config(tmp_path, "1.6.20~ds1", False)
    with pytest.raises(LabError, match=r"containerd 1\.6\.20~ds1 has no NRI"):
        _config(tmp_path, "1.6.20~ds1", True)
