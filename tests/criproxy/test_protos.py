"""protos/: generated code is current, unknown fields survive, and wire edits touch only what changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from criproxy.relay import wire
from numapin_lab.cri import cri_full_pb2 as full
from protos import cri_pb2

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_current(tmp_path: Path) -> None:
    env_python = {"PYTHON": sys.executable}
    subprocess.run(["bash", str(ROOT / "scripts" / "gen-protos.sh"), str(tmp_path)], check=True, cwd=ROOT,
                   env={"PATH": "/usr/bin:/bin", **env_python})
    for rel in ("protos/cri_pb2.py", "protos/nri_pb2.py", "protos/ttrpc_pb2.py",
                "numapin_lab/cri/cri_full_pb2.py"):
        assert (tmp_path / rel).read_text() == (ROOT / rel).read_text(), f"{rel} is stale: run scripts/gen-protos.sh"


def _kubelet_request(cpuset: str = "") -> full.CreateContainerRequest:
    """A CreateContainerRequest full of fields numapin's protos do not describe."""
    return full.CreateContainerRequest(
        pod_sandbox_id="sb1",
        config=full.ContainerConfig(
            metadata=full.ContainerMetadata(name="app", attempt=2),
            image=full.ImageSpec(image="localhost/busybox:latest", annotations={"a": "b"}),
            command=["sleep", "1"], args=["x"], working_dir="/w", envs=[full.KeyValue(key="K", value="V")],
            mounts=[full.Mount(container_path="/c", host_path="/h", readonly=True)],
            devices=[full.Device(container_path="/dev/x", host_path="/dev/null", permissions="rw")],
            labels={"io.kubernetes.container.name": "app"}, annotations={"x": "y"}, log_path="app/2.log",
            stdin=True, tty=True,
            linux=full.LinuxContainerConfig(
                resources=full.LinuxContainerResources(
                    cpu_period=100000, cpu_quota=200000, cpu_shares=2048, memory_limit_in_bytes=1 << 30,
                    oom_score_adj=-997, cpuset_cpus=cpuset, hugepage_limits=[full.HugepageLimit(page_size="2MB")],
                    unified={"memory.high": "max"}, memory_swap_limit_in_bytes=1 << 30),
                security_context=full.LinuxContainerSecurityContext(privileged=True))),
        sandbox_config=full.PodSandboxConfig(
            metadata=full.PodSandboxMetadata(name="p", uid="u1", namespace="ns"), hostname="h", log_directory="/l",
            labels={"l": "1"}, annotations={"numapin.io/x": "1"},
            linux=full.LinuxPodSandboxConfig(cgroup_parent="/kubepods/podu1", sysctls={"k": "v"})))


def test_partial_messages_keep_unknown_fields() -> None:
    raw = _kubelet_request().SerializeToString()
    ours = cri_pb2.CreateContainerRequest.FromString(raw)
    assert ours.config.metadata.name == "app"
    assert ours.sandbox_config.linux.cgroup_parent == "/kubepods/podu1"
    assert ours.config.linux.resources.cpu_shares == 2048
    again = full.CreateContainerRequest.FromString(ours.SerializeToString())
    assert again == _kubelet_request()


def test_wire_edit_changes_only_the_cpuset_fields() -> None:
    original = _kubelet_request().SerializeToString()
    edited = wire.set_fields(original, (2, 15, 1), {6: wire.encode_string(6, "1"), 7: wire.encode_string(7, "0"),
                                                    2: wire.encode_int64(2, -1)})
    expected = _kubelet_request("1")
    expected.config.linux.resources.cpuset_mems = "0"
    expected.config.linux.resources.cpu_quota = -1
    # kubelet (Go) serialises in field order, as does protobuf with a full schema: the edited bytes are
    # exactly the original request with those three fields changed, every other byte in place
    assert edited == expected.SerializeToString()


def test_wire_edit_creates_missing_messages_and_removes_fields() -> None:
    req = full.UpdateContainerResourcesRequest(container_id="c1", annotations={"a": "b"})
    edited = wire.set_fields(req.SerializeToString(), (2,), {6: wire.encode_string(6, "0-3")})
    assert full.UpdateContainerResourcesRequest.FromString(edited) == full.UpdateContainerResourcesRequest(
        container_id="c1", annotations={"a": "b"}, linux=full.LinuxContainerResources(cpuset_cpus="0-3"))
    cleared = wire.set_fields(edited, (2,), {6: b""})
    back = full.UpdateContainerResourcesRequest.FromString(cleared)
    assert not back.linux.cpuset_cpus and back.HasField("linux")


def test_wire_edit_leaves_a_message_without_the_path_when_not_creating() -> None:
    """``create=False`` (what kubelet reads back of a pinned container's limit: only when the runtime reports
    resources at all): a missing message on the path leaves the bytes as they are; a present one is edited."""
    bare = full.UpdateContainerResourcesRequest(container_id="c1", annotations={"a": "b"}).SerializeToString()
    assert wire.set_fields(bare, (2,), {2: wire.encode_int64(2, 5)}, create=False) == bare
    with_linux = full.UpdateContainerResourcesRequest(container_id="c1", linux=full.LinuxContainerResources(
        cpu_quota=-1, cpu_shares=2))
    edited = wire.set_fields(with_linux.SerializeToString(), (2,), {2: wire.encode_int64(2, 5)}, create=False)
    with_linux.linux.cpu_quota = 5
    assert edited == with_linux.SerializeToString()


def test_wire_rejects_garbage() -> None:
    with pytest.raises(wire.WireError):
        wire.fields(b"\x0a\x05ab")


@settings(max_examples=60, deadline=None)
@given(cpus=st.text(alphabet="0123456789,-", max_size=12), quota=st.integers(-1, 10**9),
       shares=st.integers(0, 262144), name=st.text(max_size=10))
def test_wire_edit_matches_a_full_reserialisation(cpus: str, quota: int, shares: int, name: str) -> None:
    req = _kubelet_request("7")
    req.config.metadata.name = name
    req.config.linux.resources.cpu_shares = shares
    edited = wire.set_fields(req.SerializeToString(), (2, 15, 1),
                             {6: wire.encode_string(6, cpus), 2: wire.encode_int64(2, quota)})
    req.config.linux.resources.cpuset_cpus = cpus
    req.config.linux.resources.cpu_quota = quota
    assert edited == req.SerializeToString()
