"""``numapin export-kubelet-state``: numapin's state written as kubelet's static policy's ``cpu_manager_state``.

The file must be what kubelet accepts: kubelet's layout and checksum (a file a real kubelet wrote is reproduced byte
for byte), read back by numapin's importer of kubelet's files (the one the way in uses, with kubelet's checksum and
policy checks) to the same pins, and kubelet's start-up rules (validateState) for the machine. Refusals write nothing.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

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


# -- the Memory Manager's file (memoryManagerPolicy Static) ---------------------------------------------------------
GI = 1 << 30
MEMORY_FLAGS = ("--memory-manager-policy", "Static", "--reserved-memory", "0:memory=100Mi")


def _memory_node(tmp_path: Path) -> tuple[Path, Any]:
    """TWO_SOCKETS with 4Gi per NUMA node, and its Memory Manager as the proxy builds it from the same flags."""
    from criproxy.app import node_parts_of
    from criproxy.config import load_config
    from tests.fixtures.make_sysfs import write_node_memory

    sysfs = build(TWO_SOCKETS, tmp_path / "sys")
    for node in (0, 1):
        write_node_memory(sysfs, node, 4 * GI // 1024, ((2048, 0),))
    config = load_config(None, {"sysfs": str(sysfs), "reserved_cpus": "0,8", "memory_manager_policy": "Static",
                                "reserved_memory": "0:memory=100Mi"})
    return sysfs, node_parts_of(config).memory_policy


def _memory_state(policy: Any) -> Any:
    from allocator.memory import MemoryState
    from allocator.pod import ContainerInfo, PodInfo

    state = MemoryState()
    policy.start(state)
    for uid, size in (("pod-db", 6 * GI), ("pod-web", GI)):  # db spans both nodes, web on node 1 (or 0)
        c = ContainerInfo("app", "app", 1000, 1000, size, size)
        policy.allocate(state, PodInfo(uid, "default", uid, "Guaranteed", None, False, (c,)), "app", None)
    return state


def _export_memory(tmp_path: Path, sysfs: Path, *extra: str) -> tuple[int, Path, Path]:
    memory_out = tmp_path / "kubelet" / "memory_manager_state"
    rc, out = _export(tmp_path, sysfs, "--reserved-cpus", "0,8", *MEMORY_FLAGS, "--memory-out", str(memory_out),
                      *extra)
    return rc, out, memory_out


def test_the_memory_managers_file_is_written_as_kubelet_writes_it(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from allocator.memory import MemoryCheckpointStore, memory_checksum, parse_memory_checkpoint
    from allocator.memory.checkpoint import import_kubelet_memory_state

    sysfs, policy = _memory_node(tmp_path)
    state = _memory_state(policy)
    _save(tmp_path / "numapin", CPUState(default_cpuset=Topology.from_sysfs(str(sysfs)).all_cpus))
    MemoryCheckpointStore(tmp_path / "numapin" / "memory_manager_state").save(state)
    assert "numapin" in json.loads((tmp_path / "numapin" / "memory_manager_state").read_text())
    rc, out, memory_out = _export_memory(tmp_path, sysfs)
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    doc = json.loads(memory_out.read_bytes())
    assert list(doc) == ["policyName", "machineState", "entries", "checksum"]  # kubelet's, without numapin's field
    assert doc["policyName"] == "Static" and doc["checksum"] == memory_checksum(doc) != 0
    assert parse_memory_checkpoint(memory_out.read_bytes(), str(memory_out))[1] == state
    back = import_kubelet_memory_state(memory_out)  # the way in reads it back: the same blocks
    assert back == state
    policy.start(back.copy())  # kubelet's restart check accepts it on this machine
    assert out.exists()
    assert 'memoryManagerPolicy: "Static"' in stdout
    assert 'reservedMemory: [{"numaNode": 0, "limits": {"memory": "100Mi"}}]' in stdout
    assert "memory of 2 container(s) of 2 pod(s)" in stdout


def test_memory_export_refusals_write_neither_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from allocator.memory import MemoryCheckpointStore, memory_checksum, serialize_memory_checkpoint

    sysfs, policy = _memory_node(tmp_path)
    _save(tmp_path / "numapin", CPUState(default_cpuset=Topology.from_sysfs(str(sysfs)).all_cpus))
    rc, out, memory_out = _export_memory(tmp_path, sysfs)  # no numapin memory state
    assert rc == 1 and "no numapin memory state" in capsys.readouterr().err
    state = _memory_state(policy)
    bad = state.copy()
    bad.machine[0].memory["memory"].free += 4096  # does not add up (checksum made right: only kubelet's check sees it)
    doc = json.loads(serialize_memory_checkpoint(bad))
    del doc["numapin"]
    doc["checksum"] = memory_checksum(doc)
    (tmp_path / "numapin" / "memory_manager_state").write_text(json.dumps(doc))
    rc, out, memory_out = _export_memory(tmp_path, sysfs)
    assert rc == 1 and "kubelet's Memory Manager would refuse it" in capsys.readouterr().err
    assert not out.exists() and not memory_out.exists()
    MemoryCheckpointStore(tmp_path / "numapin" / "memory_manager_state").save(state, force=True)
    memory_out.parent.mkdir(parents=True)
    memory_out.write_bytes(serialize_memory_checkpoint(state, numapin=False))  # kubelet's Static file is there
    rc, out, _ = _export_memory(tmp_path, sysfs)
    assert rc == 1 and "holds policy 'Static'" in capsys.readouterr().err
    assert not out.exists()
    from allocator.memory import MemoryState
    memory_out.write_bytes(serialize_memory_checkpoint(MemoryState(), "None", numapin=False))  # kubelet's None
    rc, out, _ = _export_memory(tmp_path, sysfs)
    assert rc == 0 and out.exists() and json.loads(memory_out.read_text())["policyName"] == "Static"
