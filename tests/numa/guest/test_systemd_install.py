"""Inside a VM whose PID 1 is systemd (cgroup v2): numapin's node life as an operator lives it, each step a check.

The host (tests/install/test_systemd_host.py) built the self-contained install twice (two releases) into a directory
shared with this guest ($NUMAPIN_VM_RELEASES). Here: containerd is the node's (Debian's containerd.service, its
configuration in /etc/containerd), the proxy is installed with the install's own ``install.sh`` and the guest's
real ``systemctl``, an emulated kubelet (numapin_lab's PodRunner) runs pods through the proxy's socket, and:

1. install: systemd starts containerd (the unit wants it) and the proxy from the release; pods get their CPUs;
2. upgrade to the second release while the pods run: systemd restarts the proxy from it, the kernel's cpusets and
   the state are unchanged, the proxy adopted both containers;
3. kill -9 of the proxy: systemd starts it again (Restart=always), it reconciles, nothing changed;
4. reboot-equivalent: the proxy, containerd, the shims and the containers all stopped or killed, then the proxy's
   unit started alone (it pulls containerd in); kubelet removes the dead pods and runs them again: CPUs given out
   again from the state the proxy kept, none leaked;
5. back to kubelet: the proxy stopped, ``numapin export-kubelet-state`` (docs/node.md's command) writes kubelet's
   checkpoint, read back with kubelet's checksum and policy rules: the pins the kernel shows;
6. uninstall (docs/node.md's command): nothing of numapin left (unit, drop-in, releases, link, settings, state,
   sockets, processes), the containers still run.

The checks share one story (one boot): each continues where the one before left the node.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from allocator import CheckpointStore, CPUState
from allocator.checkpoint import import_kubelet_state
from allocator.cpuset import CPUSet
from allocator.topology import Topology
from numapin.proc_cpus import process_cpus
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab, _busybox, build_image_archive, containerd_version
from numapin_lab.demo.pod_runner import PodRunner, RunningPod
from tests.numa.shapes import SHARED_ENV
from webhook.admission.mutate import mutate_pod

RELEASES_ENV = "NUMAPIN_VM_RELEASES"  # "<first release>:<second release>", install directories the host built
UNIT = "numapin-criproxy.service"
PROXY_SOCKET = "/var/run/numapin/criproxy.sock"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
STATE = Path("/var/lib/numapin/cpu_manager_state")
PROXY_LOG = Path("/run/numapin-vm-proxy.log")
LOG_DROPIN = Path(f"/etc/systemd/system/{UNIT}.d/50-vm-log.conf")
CGROUP_ROOT = "numapin-systemd"
SETTINGS = """listen: /var/run/numapin/criproxy.sock
runtimeEndpoint: unix:///run/containerd/containerd.sock
stateDir: /var/lib/numapin
reservedCpus: "0"
topologyManagerPolicy: single-numa-node
topologyManagerScope: container
metricsAddress: ""
controlSocket: /var/run/numapin/control.sock
"""
WAIT = 240.0  # seconds for systemd to bring the proxy back (a start imports the whole stack, under emulation)

pytestmark = pytest.mark.skipif(RELEASES_ENV not in os.environ, reason="run by tests/install/test_systemd_host.py")


def run(*argv: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def systemctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("systemctl", *args, check=check)


def prop(name: str, unit: str = UNIT) -> str:
    return systemctl("show", "-p", name, "--value", unit).stdout.strip()


def proxy_log() -> str:
    try:
        return PROXY_LOG.read_text(errors="replace")
    except OSError:
        return ""


def wait_for_log(pattern: str, after: int) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if pattern in proxy_log()[after:]:
            return
        time.sleep(0.5)
    raise AssertionError(f"the proxy never logged {pattern!r}:\n{proxy_log()[after:][-3000:]}")


def wait_restarted(old_pid: int) -> int:
    """The proxy's new main process, once systemd has it active and its socket answers."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        pid = int(prop("MainPID") or 0)
        if pid and pid != old_pid and prop("ActiveState") == "active":
            run("/opt/numapin/bin/numapin", "wait-socket", PROXY_SOCKET, "--timeout", "60")
            return pid
        time.sleep(0.5)
    raise AssertionError(f"systemd did not bring the proxy back: {prop('ActiveState')}/{prop('SubState')}\n"
                         f"{proxy_log()[-3000:]}")


def exe_of(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/exe")


def pod(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    """A pod as the API server stores it: numapin's webhook stamped its intent."""
    doc = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
           "spec": {"containers": [{"name": "app", "image": "localhost/busybox:latest", "resources": resources}]}}
    mutated, _ = mutate_pod(doc)
    return mutated


PODS = (pod("db", {"limits": {"cpu": "1", "memory": "32Mi"}, "requests": {"cpu": "1", "memory": "32Mi"}}),
        pod("web", {"requests": {"cpu": "100m"}}))


@dataclass
class Story:
    first: Path
    second: Path
    all_cpus: CPUSet
    running: list[RunningPod] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    pinned: CPUSet = field(default_factory=CPUSet)
    state: CPUState | None = None
    proxy_pid: int = 0

    def kubelet(self, coro_fn: Any) -> Any:
        async def go() -> Any:
            async with CRIClient(PROXY_SOCKET, timeout=120) as client:
                return await coro_fn(PodRunner(client, CGROUP_ROOT))
        return asyncio.run(go())

    def run_pods(self) -> None:
        async def go(runner: PodRunner) -> None:
            self.running = [await runner.run(p) for p in PODS]
            self.pids = {r.name: await runner.pid_of(r.containers["app"]) for r in self.running}
        self.kubelet(go)

    def check_pins(self, what: str) -> None:
        """db alone on one CPU (not the reserved 0), web on every other CPU, as the kernel shows them."""
        db, web = (process_cpus(self.pids[n]).cpus for n in ("db", "web"))
        assert len(db) == 1 and 0 not in db, (what, str(db))
        assert web == self.all_cpus - db, (what, str(web))
        self.pinned = db

    def saved(self) -> CPUState:
        state = CheckpointStore(STATE).load()
        assert state is not None, f"no state at {STATE}"
        return state


@pytest.fixture(scope="module")
def story() -> Iterator[Story]:
    first, second = (Path(p) for p in os.environ[RELEASES_ENV].split(":"))
    s = Story(first, second, Topology.from_sysfs("/sys").all_cpus)
    # the node's containerd, as Debian's unit runs it: its configuration in /etc/containerd (the lab's settings: a
    # local pause image, no CNI), its state under /run (containerd's overlayfs snapshots need a tmpfs)
    lab = ContainerdLab("/run/numapin-vm-containerd")
    lab.dir.mkdir(parents=True, exist_ok=True)
    lab.version = containerd_version()
    lab._write_config()
    config = lab.config.read_text().replace(f'address = "{lab.socket}"', f'address = "{CONTAINERD_SOCKET}"')
    assert CONTAINERD_SOCKET in config
    Path("/etc/containerd").mkdir(exist_ok=True)
    Path("/etc/containerd/config.toml").write_text(config)
    build_image_archive(lab.dir / "images.tar", _busybox())
    # the proxy's output to a file (the guest runs no journald)
    LOG_DROPIN.parent.mkdir(parents=True, exist_ok=True)
    LOG_DROPIN.write_text(f"[Service]\nStandardOutput=append:{PROXY_LOG}\nStandardError=append:{PROXY_LOG}\n")
    Path("/run/numapin-vm-settings.yaml").write_text(SETTINGS)
    try:
        yield s
    finally:
        shared = os.environ.get(SHARED_ENV)
        if shared:
            Path(shared, "proxy.log").write_text(proxy_log())


def test_install_from_the_artifact_and_run_pods(story: Story) -> None:
    assert prop("ActiveState", "containerd.service") == "inactive"
    r = run("sh", str(story.first / "share/numapin/install.sh"), "--from", str(story.first),
            "--config", "/run/numapin-vm-settings.yaml")
    assert "installed" in r.stderr, r.stderr
    release = (story.first / "share/numapin/RELEASE").read_text().strip()
    assert os.readlink("/opt/numapin") == f"/opt/numapin-releases/{release}"
    assert prop("ActiveState") == "active" and prop("UnitFileState") == "enabled"
    assert prop("ActiveState", "containerd.service") == "active", "the proxy's unit did not pull containerd in"
    story.proxy_pid = int(prop("MainPID"))
    assert exe_of(story.proxy_pid).startswith(f"/opt/numapin-releases/{release}/"), exe_of(story.proxy_pid)
    run("ctr", "--address", CONTAINERD_SOCKET, "-n", "k8s.io", "images", "import",
        "/run/numapin-vm-containerd/images.tar")
    story.run_pods()
    story.check_pins("after the install")
    story.state = story.saved()
    assert story.state.get("uid-db", "app") == story.pinned


def test_upgrade_while_pods_run(story: Story) -> None:
    mark = len(proxy_log())
    r = run("sh", str(story.second / "share/numapin/install.sh"), "--from", str(story.second))
    assert f"restarting {UNIT}" in r.stderr, r.stderr
    release = (story.second / "share/numapin/RELEASE").read_text().strip()
    assert os.readlink("/opt/numapin") == f"/opt/numapin-releases/{release}"
    pid = int(prop("MainPID"))
    assert pid != story.proxy_pid and exe_of(pid).startswith(f"/opt/numapin-releases/{release}/")
    story.proxy_pid = pid
    wait_for_log("adopted 2", mark)
    story.check_pins("after the upgrade")
    assert story.saved() == story.state


def test_kill_9_systemd_restarts_the_proxy(story: Story) -> None:
    mark = len(proxy_log())
    restarts = int(prop("NRestarts"))
    os.kill(story.proxy_pid, signal.SIGKILL)
    story.proxy_pid = wait_restarted(story.proxy_pid)
    assert int(prop("NRestarts")) == restarts + 1
    wait_for_log("adopted 2", mark)
    story.check_pins("after kill -9")
    assert story.saved() == story.state


def test_reboot_equivalent(story: Story) -> None:
    """Everything stops as at a reboot (the containers too); the proxy's unit is started alone."""
    systemctl("stop", UNIT)
    shims = prop("ControlGroup", "containerd.service")
    assert shims, "containerd.service has no cgroup"
    systemctl("stop", "containerd.service")  # KillMode=process: containerd goes, its shims stay
    Path(f"/sys/fs/cgroup{shims}/cgroup.kill").write_text("1")  # the shims
    Path(f"/sys/fs/cgroup/{CGROUP_ROOT}/cgroup.kill").write_text("1")  # every container
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() for pid in story.pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in story.pids.values())
    assert story.saved() == story.state, "the state changed while everything was down"
    mark = len(proxy_log())
    systemctl("start", UNIT)
    assert prop("ActiveState", "containerd.service") == "active"
    story.proxy_pid = int(prop("MainPID"))
    wait_for_log("reconcile", mark)

    async def again(runner: PodRunner) -> None:  # kubelet: the dead pods removed, then run again
        for r in story.running:
            await runner.delete(r)
        story.running = [await runner.run(p) for p in PODS]
        story.pids = {r.name: await runner.pid_of(r.containers["app"]) for r in story.running}
    story.kubelet(again)
    story.check_pins("after the reboot")
    state = story.saved()
    assert set(state.assignments) == {"uid-db"} and state.get("uid-db", "app") == story.pinned, state.assignments
    story.state = state


def test_export_to_kubelets_checkpoint(story: Story) -> None:
    systemctl("stop", UNIT)  # kubelet is stopped too on a real node: the state no longer changes
    out = Path("/var/lib/kubelet/cpu_manager_state")
    r = run("/opt/numapin/bin/numapin", "export-kubelet-state", "--config", "/etc/numapin/criproxy.yaml",
            "--out", str(out))
    assert 'cpuManagerPolicy: "static"' in r.stdout, r.stdout
    doc = json.loads(out.read_text())
    assert doc["policyName"] == "static"
    kubelet = import_kubelet_state(out)  # kubelet's checksum and policy rules
    assert kubelet.assignments == {"uid-db": {"app": process_cpus(story.pids["db"]).cpus}}
    assert kubelet.default_cpuset == story.all_cpus - story.pinned


def test_uninstall_leaves_nothing(story: Story) -> None:
    LOG_DROPIN.unlink()
    LOG_DROPIN.parent.rmdir()
    run("sh", "/opt/numapin/share/numapin/install.sh", "--uninstall", "--purge")
    left = [p for p in ("/opt/numapin", "/opt/numapin-releases", f"/etc/systemd/system/{UNIT}",
                        "/etc/systemd/system/kubelet.service.d/90-numapin.conf", "/etc/numapin", "/var/lib/numapin",
                        "/var/run/numapin") if os.path.lexists(p)]
    assert left == []
    assert prop("LoadState") == "not-found" and prop("ActiveState") == "inactive"
    assert "numapin" not in systemctl("list-unit-files", "--no-legend").stdout
    procs = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmdline = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "numapin criproxy" in cmdline or "/opt/numapin" in cmdline:
                procs.append(cmdline)
    assert procs == []
    for name, pid in story.pids.items():  # the containers outlive numapin
        assert Path(f"/proc/{pid}").exists(), name
