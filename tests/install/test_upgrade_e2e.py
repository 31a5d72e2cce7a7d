"""The node's life with the host service, played against a real containerd with the built install: the release
installed by install.sh, the unit's own commands run as systemd would run them (wait for containerd, the proxy, wait
for its socket), pods run through the proxy as kubelet runs them; an upgrade to a second release while they run (the
containers keep running where they ran, the state is kept), a kill -9 and a start again (nothing lost), then the way
back: the proxy stopped, kubelet's checkpoint exported and read back with the pins the kernel shows.

systemd itself is not here: the fake host's systemctl records what install.sh asks, and the test does the restarts.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from allocator import CheckpointStore
from allocator.checkpoint import import_kubelet_state
from allocator.topology import Topology
from numapin.proc_cpus import process_cpus
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.demo.pod_runner import PodRunner, RunningPod
from numapin_lab.demo.stack import ManagedProcess, cgroup_mounts
from tests.install.node_host import UNIT, FakeHost, fake_host, second_release

pytestmark = pytest.mark.containerd
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}


class HostService(ManagedProcess):
    """numapin-criproxy.service's commands, run as systemd runs them, with the node's paths mapped."""

    def __init__(self, host: FakeHost, paths: dict[str, str], log: Path) -> None:
        super().__init__("numapin-criproxy.service", [], log)
        self.host, self.paths = host, paths
        self.commands = {k: v for k, v in (line.split("=", 1) for line in UNIT.read_text().splitlines()
                                           if line.startswith("ExecStart"))}

    def _argv(self, key: str) -> list[str]:
        release = self.host.root / "opt/numapin-releases" / self.host.release()
        out = []
        for word in shlex.split(self.commands[key]):
            word = self.paths.get(word, word)
            out.append(str(release / word.removeprefix("/opt/numapin/")) if word.startswith("/opt/numapin/") else word)
        return out

    def start(self) -> None:
        pre = subprocess.run(self._argv("ExecStartPre"), env=CLEAN_ENV, capture_output=True, text=True, timeout=150)
        assert pre.returncode == 0, pre.stderr
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self._argv("ExecStart"), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=CLEAN_ENV, start_new_session=True)
        post = subprocess.run(self._argv("ExecStartPost"), env=CLEAN_ENV, capture_output=True, text=True,
                              timeout=150)
        assert post.returncode == 0, post.stderr + self.tail()

    def exe(self) -> str:
        assert self.proc is not None
        return os.readlink(f"/proc/{self.proc.pid}/exe")


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = scratch_dir("npupg-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_install_upgrade_kill_and_back_to_kubelet_with_pods_running(built: Path, scratch: Path) -> None:
    everything = Topology.from_sysfs("/sys").all_cpus
    root = f"numapin-{scratch.name}"
    lab = ContainerdLab(scratch / "ctrd")
    host = fake_host(scratch)
    settings = scratch / "criproxy.yaml"
    service = None
    pods: list[RunningPod] = []
    try:
        lab.start()
        settings.write_text(f"listen: {scratch}/proxy.sock\nruntimeEndpoint: unix://{lab.socket}\n"
                            f"stateDir: {scratch}/state\nreservedCpus: \"0\"\ntopologyManagerPolicy: single-numa-node\n"
                            f"metricsAddress: \"\"\ncontrolSocket: \"\"\nnodeName: upgrade\n")
        paths = {"/run/containerd/containerd.sock": lab.socket, "/etc/numapin/criproxy.yaml": str(settings),
                 "/var/run/numapin/criproxy.sock": str(scratch / "proxy.sock")}
        service = HostService(host, paths, scratch / "proxy.log")
        first = built / "opt/numapin"
        r = host.run("--from", str(first), "--config", str(settings), script=first / "share/numapin/install.sh")
        assert r.returncode == 0, r.stderr
        assert host.calls()[-1] == "start numapin-criproxy.service"
        service.start()
        assert service.exe().startswith(str(host.root / "opt/numapin-releases" / host.release()))

        async def run_pods() -> dict[str, int]:
            async with CRIClient(str(scratch / "proxy.sock")) as kubelet:
                runner = PodRunner(kubelet, root)
                for name, limits in (("db", {"cpu": "1", "memory": "32Mi"}), ("web", None)):
                    res = {"limits": limits} if limits else {"requests": {"cpu": "100m"}}
                    pods.append(await runner.run({"apiVersion": "v1", "kind": "Pod", "metadata": {
                        "name": name, "namespace": "default", "uid": f"uid-{name}"},
                        "spec": {"containers": [{"name": "app", "resources": res}]}}))
                return {p.name: await runner.pid_of(p.containers["app"]) for p in pods}

        pids = asyncio.run(run_pods())
        pinned = process_cpus(pids["db"]).cpus
        assert len(pinned) == 1 and 0 not in pinned
        shared = process_cpus(pids["web"]).cpus
        assert shared == everything - pinned
        state = CheckpointStore(scratch / "state/cpu_manager_state").load()
        assert state is not None and state.get("uid-db", "app") == pinned

        def unchanged(what: str, mark: int) -> None:
            service.wait_for(r"reconcile: .*adopted 2", after=mark)
            for name, pid in pids.items():  # the same processes, on the same CPUs
                assert process_cpus(pid).cpus == (pinned if name == "db" else shared), (what, name)
            assert CheckpointStore(scratch / "state/cpu_manager_state").load() == state, what

        # an upgrade while the pods run: install.sh switches the release and asks for a restart
        second = second_release(built, scratch / "release-2")
        r = host.run("--from", str(second), "--config", str(settings), script=second / "share/numapin/install.sh")
        assert r.returncode == 0, r.stderr
        assert host.calls()[-1] == "restart numapin-criproxy.service" and host.release().startswith("0.1.1-")
        mark = len(service.text())
        service.stop(signal.SIGTERM)
        service.start()
        assert service.exe().startswith(str(host.root / "opt/numapin-releases" / host.release()))
        unchanged("after the upgrade", mark)

        # kill -9; systemd's Restart=always starts it again
        mark = len(service.text())
        service.stop(signal.SIGKILL)
        service.start()
        unchanged("after kill -9", mark)

        # back to kubelet's static policy: kubelet and the proxy stopped, the checkpoint exported
        service.stop(signal.SIGTERM)
        out = scratch / "kubelet/cpu_manager_state"
        release = host.root / "opt/numapin-releases" / host.release()
        r = subprocess.run([str(release / "bin/numapin"), "export-kubelet-state", "--config", str(settings),
                            "--out", str(out)], env=CLEAN_ENV, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        kubelet_state = import_kubelet_state(out)
        assert kubelet_state.assignments == {"uid-db": {"app": process_cpus(pids["db"]).cpus}}
        assert kubelet_state.default_cpuset == everything - pinned
    finally:
        if service is not None:
            service.stop()

        async def remove() -> None:
            async with CRIClient(lab.socket) as c:
                runner = PodRunner(c, root)
                for p in pods:
                    await runner.delete(p)

        if pods:
            asyncio.run(remove())
        lab.stop()
        for m in cgroup_mounts():
            d = m / root
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                sub.rmdir()
            if d.exists():
                d.rmdir()
    assert lab.leftovers() == []
