"""``numapin export-kubelet-state``: numapin's state written as kubelet's static policy's ``cpu_manager_state``.

The file must be what kubelet accepts: kubelet's layout and checksum (a file a real kubelet wrote is reproduced byte
for byte), read back by numapin's importer of kubelet's files (the one the way in uses, with kubelet's checksum and
policy checks) to the same pins, and kubelet's start-up rules (validateState) for the machine. Refusals write nothing.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from allocator import CheckpointStore, CPUSet, CPUState, checkpoint_checksum
from allocator.checkpoint import import_kubelet_state, parse_checkpoint
from allocator.state_schema import SCHEMA_KEY
from allocator.static_policy import StaticPolicy
from allocator.topology import Topology
from numapin.cli import main
from tests.fixtures.make_sysfs import Machine, build

# written by a real kubelet (static policy, 12 cores x 2 threads, reservedSystemCPUs 0), published in a public note
# on kubelet's CPU manager
KUBELET_FILE = (b'{"policyName":"static","defaultCpuSet":"0,2-12,14-23","entries":{"235148fe-393f-47a8-a17d-bd55bc1a'
                b'836b":{"cgroup1-0":"1,13"}},"checksum":1552716370}')
ONE_SOCKET_12C = Machine("12c-ht", "one socket, 12 cores, HT (x86 numbering: 1 and 13 are siblings)", 1, 12, 2)
TWO_SOCKETS = Machine("2s-4c-ht", "two sockets, 4 cores each, HT", 2, 4, 2, numa_per_socket=1)


@pytest.fixture(scope="module")
def sysfs_12c(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(ONE_SOCKET_12C, tmp_path_factory.mktemp("sysfs-12c"))


@pytest.fixture(scope="module")
def sysfs_2s(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(TWO_SOCKETS, tmp_path_factory.mktemp("sysfs-2s"))


def _save(state_dir: Path, state: CPUState) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    CheckpointStore(state_dir / "cpu_manager_state").save(state)


def _export(tmp_path: Path, sysfs: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "kubelet" / "cpu_manager_state"
    rc = main(["export-kubelet-state", "--state-dir", str(tmp_path / "numapin"), "--sysfs", str(sysfs),
               "--listen", str(tmp_path / "proxy.sock"), "--out", str(out), *extra])
    return rc, out


def _exclusive(state: CPUState) -> CPUState:
    out = CPUState(default_cpuset=state.default_cpuset)
    for uid, cs in state.assignments.items():
        for name, cpus in cs.items():
            out.set(uid, name, cpus)
    return out


def test_a_state_is_written_exactly_as_kubelet_writes_it(tmp_path: Path, sysfs_12c: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    state = CPUState(default_cpuset=CPUSet.parse("0,2-12,14-23"))
    state.set("235148fe-393f-47a8-a17d-bd55bc1a836b", "cgroup1-0", CPUSet.parse("1,13"))
    _save(tmp_path / "numapin", state)
    rc, out = _export(tmp_path, sysfs_12c, "--reserved-cpus", "0")
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    assert out.read_bytes() == KUBELET_FILE
    assert import_kubelet_state(out) == state  # numapin's importer of kubelet's files reads the same pins back
    assert 'reservedSystemCPUs: "0"' in stdout and 'cpuManagerPolicy: "static"' in stdout


def test_round_trip_of_exclusive_and_share_containers(tmp_path: Path, sysfs_2s: Path) -> None:
    topology = Topology.from_sysfs(str(sysfs_2s))
    state = CPUState()
    state.set("pod-db", "db", CPUSet.parse("1,9"))
    state.set("pod-db", "sidecar", CPUSet.parse("2,10"))
    state.set("pod-web", "web", CPUSet.parse("4-5,12-13"), "share")
    state.default_cpuset = topology.all_cpus - state.assigned_cpus()
    _save(tmp_path / "numapin", state)

    rc, out = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0,8", "--cpu-manager-policy-options",
                      "full-pcpus-only=true")
    assert rc == 0
    cp = parse_checkpoint(out.read_bytes(), str(out))  # kubelet's checksum rules (a mismatch raises)
    doc = json.loads(out.read_bytes())
    assert list(doc) == ["policyName", "defaultCpuSet", "entries", "checksum"]  # kubelet's json.Marshal order
    assert "numapin" not in doc and cp.policy_name == "static" and cp.version == 2
    assert doc["checksum"] == checkpoint_checksum("static", doc["defaultCpuSet"], doc["entries"]) != 0
    back = import_kubelet_state(out)
    assert back == _exclusive(state)  # the share container keeps its CPUs, as an entry
    policy = StaticPolicy(topology, reserved_cpus=CPUSet.parse("0,8"), options={"full-pcpus-only": "true"})
    policy.start(back.copy())  # kubelet's validateState accepts it

    out.unlink()
    rc, out = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0,8", "--share", "release")
    assert rc == 0
    back = import_kubelet_state(out)
    assert back.get("pod-web", "web") is None
    assert back.default_cpuset == state.default_cpuset | CPUSet.parse("4-5,12-13")
    assert back.assignments == {"pod-db": {"db": CPUSet.parse("1,9"), "sidecar": CPUSet.parse("2,10")}}
    policy.start(back.copy())


def test_nothing_is_written_while_the_proxy_answers(tmp_path: Path, sysfs_2s: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    topology = Topology.from_sysfs(str(sysfs_2s))
    _save(tmp_path / "numapin", CPUState(default_cpuset=topology.all_cpus))
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "proxy.sock"))
        listener.listen()
        rc, out = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0")
    assert rc == 1 and "still answers" in capsys.readouterr().err
    assert not out.exists()
    rc, out = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0")  # the socket file is left, nobody answers
    assert rc == 0 and import_kubelet_state(out).default_cpuset == topology.all_cpus


def test_an_existing_checkpoint_is_replaced_only_when_it_is_kubelets_none_or_forced(
        tmp_path: Path, sysfs_2s: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topology = Topology.from_sysfs(str(sysfs_2s))
    _save(tmp_path / "numapin", CPUState(default_cpuset=topology.all_cpus))
    out = tmp_path / "kubelet" / "cpu_manager_state"
    out.parent.mkdir()
    # what kubelet with cpuManagerPolicy none writes
    out.write_text(json.dumps({"policyName": "none", "defaultCpuSet": "",
                               "checksum": checkpoint_checksum("none", "")}))
    rc, _ = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0")
    assert rc == 0 and parse_checkpoint(out.read_bytes()).policy_name == "static"
    static = out.read_bytes()
    rc, _ = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0")
    assert rc == 1 and "holds policy 'static'" in capsys.readouterr().err
    out.write_text("garbage")
    rc, _ = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0")
    assert rc == 1 and out.read_text() == "garbage"
    rc, _ = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0", "--force")
    assert rc == 0 and out.read_bytes() == static


@pytest.mark.parametrize(("reserved", "expected"), [
    ("1", "not all reserved cpus"),  # kubelet would reserve a CPU a container holds
    (None, "current set of available CPUs"),  # the state is of another machine (set below)
])
def test_a_state_kubelet_would_refuse_is_refused_with_kubelets_reason(
        tmp_path: Path, sysfs_2s: Path, sysfs_12c: Path, capsys: pytest.CaptureFixture[str], reserved: str | None,
        expected: str) -> None:
    topology = Topology.from_sysfs(str(sysfs_2s))
    state = CPUState()
    state.set("pod", "app", CPUSet.parse("1,9"))
    state.default_cpuset = topology.all_cpus - state.assigned_cpus()
    _save(tmp_path / "numapin", state)
    sysfs = sysfs_2s if reserved else sysfs_12c
    rc, out = _export(tmp_path, sysfs, "--reserved-cpus", reserved or "0")
    err = capsys.readouterr().err
    assert rc == 1 and expected in err and "nothing was written" in err and "Traceback" not in err
    assert not out.exists()


def test_a_state_of_a_newer_numapin_or_none_at_all_is_refused(tmp_path: Path, sysfs_2s: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0")
    assert rc == 2 and "no numapin state" in capsys.readouterr().err
    topology = Topology.from_sysfs(str(sysfs_2s))
    _save(tmp_path / "numapin", CPUState(default_cpuset=topology.all_cpus))
    path = tmp_path / "numapin" / "cpu_manager_state"
    doc = json.loads(path.read_bytes())
    doc["numapin"][SCHEMA_KEY] = 99
    path.write_text(json.dumps(doc))
    rc, out = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0")
    err = capsys.readouterr().err
    assert rc == 2 and "state schema 99" in err and not out.exists()


def test_dry_run_json_shows_the_file_and_kubelets_settings(tmp_path: Path, sysfs_2s: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    topology = Topology.from_sysfs(str(sysfs_2s))
    state = CPUState()
    state.set("pod", "app", CPUSet.parse("3,11"), "share")
    state.default_cpuset = topology.all_cpus - state.assigned_cpus()
    _save(tmp_path / "numapin", state)
    rc, out = _export(tmp_path, sysfs_2s, "--reserved-cpus", "0", "--topology-manager-policy", "single-numa-node",
                      "--dry-run", "--format", "json")
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and not out.exists() and doc["written"] is False
    assert doc["checkpoint"]["entries"] == {"pod": {"app": "3,11"}}
    assert doc["kubeletConfiguration"]["topologyManagerPolicy"] == "single-numa-node"
    assert doc["keptShare"] == [{"podUID": "pod", "container": "app", "cpus": "3,11"}]
