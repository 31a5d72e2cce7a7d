"""Where the proxy learns of a change of a running pod's CPU mode: its watch of its own node's pods on the API server
(run for real through kubernetes-asyncio against the in-test API server tests/webhook/fake_kube.py), and the root-only
local control socket with ``numapin mode``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodeagent.decisions.mode_request import ModeAnswer, ModeRequest
from nodeagent.decisions.pod_watch import NodePodWatch
from nodeagent.serve.control import ControlServer, call_control
from numapin_lab.cri.ledger import scratch_dir
from tests.webhook.fake_kube import PODS_PATH, FakeKubeAPI
from tests.webhook.test_api_sources import until

ROOT = Path(__file__).resolve().parents[2]


def _pod(name: str, node: str, mode: str | None, *, uid: str | None = None, labels: dict | None = None) -> dict:
    meta: dict = {"name": name, "namespace": "default", "uid": uid or f"uid-{name}", "labels": labels or {}}
    if mode is not None:
        meta["annotations"] = {"qos.gocrane.io/cpu-manager": mode}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "app", "resources": {
                "limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "2", "memory": "1Gi"}}}]}}


class Recorder:
    """The sink the proxy's mode applier would be: records every request, answers ``outcome``."""

    def __init__(self, outcome: str = "changed") -> None:
        self.requests: list[ModeRequest] = []
        self.outcome = outcome

    async def __call__(self, req: ModeRequest) -> ModeAnswer:
        self.requests.append(req)
        return ModeAnswer(self.outcome, f"{req.ref} -> {req.mode}")

    def of(self, name: str) -> list[tuple[str, bool]]:
        return [(r.mode, r.first_sight) for r in self.requests if r.name == name]


@pytest.fixture
async def kube() -> AsyncIterator[FakeKubeAPI]:
    api = FakeKubeAPI()
    await api.start()
    yield api
    await api.close()


@contextlib.asynccontextmanager
async def running(watch: NodePodWatch) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(watch.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)


async def test_watch_of_the_nodes_pods_hands_on_changes_of_mode(kube: FakeKubeAPI, tmp_path: Path) -> None:
    kubeconfig = str(kube.write_kubeconfig(tmp_path / "kubeconfig"))
    await kube.put(PODS_PATH, _pod("db", "n1", "exclusive"))
    await kube.put(PODS_PATH, _pod("web", "n1", None))
    await kube.put(PODS_PATH, _pod("elsewhere", "n2", "share"))
    sink = Recorder()
    watch = NodePodWatch("n1", sink, kubeconfig=kubeconfig, retry_seconds=0.05)
    async with running(watch):
        await until(lambda: watch.synced.is_set() and kube.watch_requests(PODS_PATH), "listed and watching")
        assert kube.list_requests(PODS_PATH)[0].query["fieldSelector"] == "spec.nodeName=n1"
        assert kube.watch_requests(PODS_PATH)[0].query["fieldSelector"] == "spec.nodeName=n1"
        assert sink.of("db") == [("exclusive", True)] and sink.of("web") == [("kubelet", True)]
        assert sink.of("elsewhere") == []
        first = sink.requests[0]
        assert first.source == "api" and first.uid == "uid-db" and first.pod is not None
        assert first.pod.containers[0].cpu_request_milli == 2000
        # kubectl annotate --overwrite: handed on; other updates of the pod are not
        await kube.put(PODS_PATH, _pod("db", "n1", "share"))
        await until(lambda: len(sink.of("db")) == 2, "the change")
        assert sink.of("db")[-1] == ("share", False)
        await kube.put(PODS_PATH, _pod("db", "n1", " Share ", labels={"x": "y"}))
        await kube.put(PODS_PATH, _pod("db", "n1", "turbo"))  # a bad value is skipped (the webhook denies it)
        await kube.put(PODS_PATH, _pod("db", "n1", None))      # annotation removed: kubelet's rule
        await until(lambda: len(sink.of("db")) == 3, "the removal")
        assert sink.of("db")[-1] == ("kubelet", False)
        # the watch ends (API server timeout): listed again, nothing handed on twice
        await kube.end_watches()
        await until(lambda: len(kube.list_requests(PODS_PATH)) == 2, "listed again")
        await kube.put(PODS_PATH, _pod("web", "n1", "none"))
        await until(lambda: len(sink.of("web")) == 2, "web changed after the relist")
        assert len(sink.of("db")) == 3
        # a deleted pod is forgotten; a new pod of the same name is a first sight
        await kube.delete(PODS_PATH, "web", "default")
        await kube.put(PODS_PATH, _pod("web", "n1", "none", uid="uid-web-2"))
        await until(lambda: len(sink.of("web")) == 3, "the new web")
        assert sink.of("web")[-1] == ("none", True)


async def test_watch_hands_a_failed_request_on_again(kube: FakeKubeAPI, tmp_path: Path) -> None:
    kubeconfig = str(kube.write_kubeconfig(tmp_path / "kubeconfig"))
    await kube.put(PODS_PATH, _pod("db", "n1", "exclusive"))
    sink = Recorder("error")
    watch = NodePodWatch("n1", sink, kubeconfig=kubeconfig, retry_seconds=0.05)
    async with running(watch):
        await until(lambda: len(sink.requests) == 1 and kube.watch_requests(PODS_PATH), "first attempt")
        sink.outcome = "changed"
        await kube.put(PODS_PATH, _pod("db", "n1", "exclusive", labels={"retry": "1"}))
        await until(lambda: len(sink.requests) == 2, "tried again at the next event")
        await kube.put(PODS_PATH, _pod("db", "n1", "exclusive", labels={"retry": "2"}))
        await asyncio.sleep(0.2)
        assert len(sink.requests) == 2


def test_watch_needs_a_node_name() -> None:
    with pytest.raises(ValueError, match="node's name"):
        NodePodWatch("", Recorder())


# -- the local control socket ------------------------------------------------------------------------------------


@pytest.fixture
async def control(tmp_path: Path) -> AsyncIterator[tuple[ControlServer, Recorder]]:
    sink = Recorder()
    server = ControlServer(str(tmp_path / "run" / "control.sock"), sink,
                           lambda: [{"pod": "default/db", "uid": "uid-db", "mode": "share", "changed": True}])
    await server.start()
    yield server, sink
    await server.stop()


async def test_control_socket_is_root_only(tmp_path: Path) -> None:
    sink = Recorder()
    public = scratch_dir("numapin-ctl-")  # traversable by everyone: only the socket's mode guards
    public.chmod(0o755)
    server = ControlServer(str(public / "control.sock"), sink, list)
    await server.start()
    probe = ("import json, socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
             "except PermissionError:\n    print('denied')\nelse:\n"
             "    print(json.loads(s.makefile().readline())['message'])\n")  # refused before any request is read

    def as_nobody() -> str:  # the system's python: the test's venv lives under /root, closed to nobody
        return subprocess.run(["/usr/bin/python3", "-c", probe, server.path], capture_output=True, text=True,
                               user=65534, group=65534, check=True).stdout.strip()

    try:
        st = os.stat(server.path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid() == 0
        assert await asyncio.to_thread(as_nobody) == "denied"
        # opened up by mistake: the peer's uid is still checked
        os.chmod(server.path, 0o666)
        assert "uid 65534 may not use the control socket" in await asyncio.to_thread(as_nobody)
        assert sink.requests == []
    finally:
        await server.stop()
        shutil.rmtree(public)


async def test_control_socket_requests(control: tuple[ControlServer, Recorder]) -> None:
    server, sink = control
    answer = await call_control(server.path, {"op": "set-mode", "pod": "default/db", "mode": " Share"})
    assert answer == {"outcome": "changed", "message": "default/db -> share"}
    assert sink.requests[-1] == ModeRequest("default", "db", "share", "local")
    answer = await call_control(server.path, {"op": "set-mode", "pod": "default/db", "mode": "default"})
    assert sink.requests[-1].mode == "kubelet"
    assert (await call_control(server.path, {"op": "modes"}))["pods"][0]["mode"] == "share"
    for bad, fragment in (({"op": "set-mode", "pod": "db", "mode": "share"}, "NAMESPACE/NAME"),
                          ({"op": "set-mode", "pod": "a/b", "mode": "turbo"}, "allowed values"),
                          ({"op": "set-mode", "pod": "a/b", "mode": 3}, "must be a string"),
                          ({"op": "reboot"}, "unknown op"), ([1], "JSON object")):
        answer = await call_control(server.path, bad)  # type: ignore[arg-type]
        assert answer["outcome"] == "error" and fragment in answer["message"], (bad, answer)
    # not JSON, and too long
    reader, writer = await asyncio.open_unix_connection(server.path)
    writer.write(b"{nope\n")
    assert "not JSON" in json.loads(await reader.readline())["message"]
    writer.close()
    reader, writer = await asyncio.open_unix_connection(server.path)
    writer.write(b"x" * (70 * 1024) + b"\n")
    assert "longer than" in json.loads(await reader.readline())["message"]
    writer.close()
    assert len(sink.requests) == 2


async def test_numapin_mode_command(control: tuple[ControlServer, Recorder]) -> None:
    server, sink = control

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "numapin", "mode", *args, "--socket", server.path],
                              capture_output=True, text=True, cwd=ROOT)

    out = await asyncio.to_thread(cli, "default/db", "exclusive")
    assert out.returncode == 0 and "default/db -> exclusive" in out.stdout
    assert sink.requests[-1] == ModeRequest("default", "db", "exclusive", "local")
    out = await asyncio.to_thread(cli, "--list")
    assert out.returncode == 0 and "default/db" in out.stdout and "share" in out.stdout
    out = await asyncio.to_thread(cli, "default/db", "turbo")
    assert out.returncode == 2 and "allowed values" in out.stderr and "Traceback" not in out.stderr
    sink.outcome = "refused"
    out = await asyncio.to_thread(cli, "default/db", "share")
    assert out.returncode == 1
    gone = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "numapin", "mode", "a/b", "share",
                                                    "--socket", server.path + ".none"],
                                   capture_output=True, text=True, cwd=ROOT)
    assert gone.returncode == 3 and "cannot reach the proxy" in gone.stderr
