"""numapin's state carries a schema version; a state written by a newer numapin is refused, with both versions named
and what to do, and never overwritten (not by the store, not by a starting proxy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocator import CheckpointError, CheckpointStore, CPUSet, CPUState
from allocator.state_schema import SCHEMA_KEY, STATE_SCHEMA_VERSION, WRITTEN_BY_KEY
from numapin.cli import main


def _state() -> CPUState:
    s = CPUState(default_cpuset=CPUSet.parse("0-1,4-7"))
    s.set("pod-a", "app", CPUSet.parse("2-3"))
    return s


def _newer(path: Path, version: int, by: str | None = "9.9.9") -> bytes:
    """A file as a newer numapin would write it: the same layout with a higher schema version."""
    CheckpointStore(path).save(_state())
    doc = json.loads(path.read_bytes())
    doc["numapin"][SCHEMA_KEY] = version
    if by is None:
        doc["numapin"].pop(WRITTEN_BY_KEY, None)
    else:
        doc["numapin"][WRITTEN_BY_KEY] = by
    data = json.dumps(doc).encode()
    path.write_bytes(data)
    return data


def test_a_saved_state_names_its_schema_and_release(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    CheckpointStore(path).save(_state())
    extra = json.loads(path.read_bytes())["numapin"]
    assert extra[SCHEMA_KEY] == STATE_SCHEMA_VERSION
    assert extra[WRITTEN_BY_KEY] == "0.1.0"  # this checkout's release (pyproject.toml)
    cp = CheckpointStore(path).read()
    assert cp is not None and cp.schema_version == STATE_SCHEMA_VERSION


def test_a_state_from_before_versions_is_schema_1_and_loads(tmp_path: Path) -> None:
    path = tmp_path / "cpu_manager_state"
    CheckpointStore(path).save(_state())
    doc = json.loads(path.read_bytes())
    del doc["numapin"][SCHEMA_KEY], doc["numapin"][WRITTEN_BY_KEY]
    path.write_text(json.dumps(doc))
    cp = CheckpointStore(path).read()
    assert cp is not None and cp.schema_version == 1
    assert CheckpointStore(path).load() == _state()


@pytest.mark.parametrize("by", ["9.9.9", None])
def test_a_newer_schema_is_refused_with_both_versions_and_kept(tmp_path: Path, by: str | None) -> None:
    path = tmp_path / "cpu_manager_state"
    data = _newer(path, STATE_SCHEMA_VERSION + 1, by)
    with pytest.raises(CheckpointError) as e:
        CheckpointStore(path).load()
    msg = str(e.value)
    assert f"state schema {STATE_SCHEMA_VERSION + 1}" in msg and f"state schema {STATE_SCHEMA_VERSION} and older" in msg
    assert "numapin 0.1.0" in msg  # this release
    assert ("numapin 9.9.9" in msg) if by else ("a newer numapin" in msg)
    assert "export-kubelet-state" in msg and "rollback" in msg
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        CheckpointStore(path).save(_state())
    assert path.read_bytes() == data


@pytest.mark.parametrize("bad", [0, -1, "2", True, 1.5])
def test_a_malformed_schema_version_is_refused(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "cpu_manager_state"
    CheckpointStore(path).save(_state())
    doc = json.loads(path.read_bytes())
    doc["numapin"][SCHEMA_KEY] = bad
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="schemaVersion must be a positive integer"):
        CheckpointStore(path).load()


def test_the_proxy_refuses_to_start_on_a_newer_state_and_keeps_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    path = state_dir / "cpu_manager_state"
    data = _newer(path, STATE_SCHEMA_VERSION + 1)
    rc = main(["criproxy", "--sysfs", "/sys", "--state-dir", str(state_dir), "--listen", str(tmp_path / "p.sock"),
               "--runtime-endpoint", f"unix://{tmp_path}/none.sock", "--reserved-cpus", "0",
               "--metrics-address", ""])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "numapin 9.9.9" in err and f"state schema {STATE_SCHEMA_VERSION + 1}" in err
    assert path.read_bytes() == data
    assert not (tmp_path / "p.sock").exists()
