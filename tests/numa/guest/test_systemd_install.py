"""Inside a VM whose PID 1 is systemd (cgroup v2): numapin's node life as docs/node.md's runbooks tell an operator
to live it, their commands run as written (``numapin`` is /opt/numapin/bin/numapin), each step a check.

The host (tests/install/test_systemd_host.py) built the self-contained install (scripts/build-node.sh) and shares
its tarball (``$NUMAPIN_VM_TARBALL``). Here containerd is the node's (Debian's containerd.service, its configuration
in /etc/containerd), kubelet is a stand-in unit (``kubelet.service`` that only sleeps, so that systemd orders it
and applies numapin's drop-in) and an emulated kubelet (numapin_lab's PodRunner) runs pods through the proxy's
socket. The story:

1. install (the tarball way) and the checks after it; kubelet restarted: systemd starts containerd and the proxy
   (the unit wants containerd, kubelet's drop-in wants the proxy); pods get their CPUs;
2. upgrade to a second build while the pods run (the extracted install named as the next release, as a new build
   is), ``numapin status``: the proxy restarted from it, the kernel's cpusets and the state unchanged, both
   containers adopted; then the rollback, the same;
3. kill -9 of the proxy: systemd starts it again (Restart=always), it reconciles, nothing changed;
4. reboot-equivalent: kubelet, the proxy, containerd, the shims and the containers all stopped or killed, then
   kubelet's unit started alone (it pulls in the proxy, which pulls in containerd); the emulated kubelet removes the
   dead pods and runs them again: CPUs given out from the state the proxy kept, none leaked;
5. back to kubelet's static policy (its runbook): kubelet's checkpoint written and read back with kubelet's
   checksum and policy rules (the pins the kernel shows), numapin removed, kubelet started without the proxy;
6. the removal's ``--uninstall --purge``: nothing of numapin left, the containers still run.

The checks share one story (one boot): each continues where the one before left the node.
"""

from __future__ import annotations

import asyncio
import os
import re
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

TARBALL_ENV = "NUMAPIN_VM_TARBALL"  # the built install's numapin-node.tar.gz (a host path the guest sees)
NODE_MD = Path(__file__).resolve().parents[3] / "docs/node.md"
UNIT = "numapin-criproxy.service"
PROXY_SOCKET = "/var/run/numapin/criproxy.sock"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
STATE = Path("/var/lib/numapin/cpu_manager_state")
KUBELET_CONFIG = Path("/var/lib/kubelet/config.yaml")
PROXY_LOG = Path("/run/numapin-vm-proxy.log")
LOG_DROPIN = Path(f"/etc/systemd/system/{UNIT}.d/50-vm-log.conf")
CGROUP_ROOT = "numapin-systemd"
SETTINGS = """listen: /var/run/numapin/criproxy.sock
runtimeEndpoint: unix:///run/containerd/containerd.sock
stateDir: /var/lib/numapin
reservedCpus: "0"
topologyManagerPolicy: single-numa-node
topologyManagerScope: container
metricsAddress: 127.0.0.1:9464
controlSocket: /var/run/numapin/control.sock
"""
WAIT = 240.0  # seconds for systemd to bring the proxy back (a start imports the whole stack, under emulation)

# the node-side commands of docs/node.md's runbooks this story plays, by section (tests/install/test_runbooks.py
# checks every command of the runbooks is played here or by a host test)
PLAYED: dict[str, list[str]] = {}

pytestmark = pytest.mark.skipif(TARBALL_ENV not in os.environ, reason="run by tests/install/test_systemd_host.py")


def section_commands(title: str) -> list[str]:
    """The ``sh`` commands of a docs/node.md section, as written (continuations joined, comments dropped)."""
    text = NODE_MD.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    out = []
    for block in re.findall(r"^\s*```sh\n(.*?)^\s*```", text[start:end if end != -1 else len(text)], re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def doc(title: str, startswith: str) -> str:
    """The one command of section ``title`` that starts with ``startswith``."""
    [command] = [c for c in section_commands(title) if c.startswith(startswith)]
    return command


def play(title: str, startswith: str, *, cwd: str = "/", check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a runbook command as written, as root on the node (``numapin`` found on the PATH in /opt/numapin/bin)."""
    command = doc(title, startswith)
    PLAYED.setdefault(title, []).append(command)
    r = subprocess.run(["sh", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": f"/opt/numapin/bin:{os.environ['PATH']}"})
    if check:
        assert r.returncode == 0, f"{command}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def prop(name: str, unit: str = UNIT) -> str:
    return run("systemctl", "show", "-p", name, "--value", unit).stdout.strip()


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


def release_of(pid: int) -> str:
    """The release the process runs from (its interpreter is the release's)."""
    m = re.match(r"/opt/numapin-releases/([^/]+)/", os.readlink(f"/proc/{pid}/exe"))
    assert m, os.readlink(f"/proc/{pid}/exe")
    return m.group(1)


def pod(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    """A pod as the API server stores it: numapin's webhook stamped its intent."""
    doc_ = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "app", "image": "localhost/busybox:latest", "resources": resources}]}}
    mutated, _ = mutate_pod(doc_)
    return mutated


PODS = (pod("db", {"limits": {"cpu": "1", "memory": "32Mi"}, "requests": {"cpu": "1", "memory": "32Mi"}}),
        pod("web", {"requests": {"cpu": "100m"}}))


@dataclass
class Story:
    tarball: Path
    all_cpus: CPUSet
    running: list[RunningPod] = field(default_factory=list)
    pids: dict[str, int] = field(default_factory=dict)
    pinned: CPUSet = field(default_factory=CPUSet)
    state: CPUState | None = None
    proxy_pid: int = 0
    first_release: str = ""

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

    def unchanged(self, what: str, mark: int) -> None:
        wait_for_log("adopted 2", mark)
        before = self.pinned
        self.check_pins(what)
        assert self.pinned == before, what
        assert self.saved() == self.state, what


@pytest.fixture(scope="module")
def story() -> Iterator[Story]:
    s = Story(Path(os.environ[TARBALL_ENV]), Topology.from_sysfs("/sys").all_cpus)
    # the early boot the guest's run-once unit skipped (a node's services run after it): the first service started
    # with default dependencies would pull it in and systemd-tmpfiles would empty /tmp under the runbook's feet
    run("systemctl", "start", "sysinit.target")
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
    # kubelet: a unit that only sleeps (the emulated kubelet is this test), configured for the proxy
    Path("/etc/systemd/system/kubelet.service").write_text(
        "[Unit]\nDescription=kubelet (a stand-in)\n[Service]\nExecStart=/bin/sleep infinity\n"
        "[Install]\nWantedBy=multi-user.target\n")
    KUBELET_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    KUBELET_CONFIG.write_text(f"containerRuntimeEndpoint: unix://{PROXY_SOCKET}\ncpuManagerPolicy: none\n")
    # the proxy's output to a file (the guest runs no journald)
    LOG_DROPIN.parent.mkdir(parents=True, exist_ok=True)
    LOG_DROPIN.write_text(f"[Service]\nStandardOutput=append:{PROXY_LOG}\nStandardError=append:{PROXY_LOG}\n")
    Path("/root").mkdir(exist_ok=True)
    Path("/root/criproxy.yaml").write_text(SETTINGS)
    run("systemctl", "daemon-reload")
    try:
        yield s
    finally:
        shared = os.environ.get(SHARED_ENV)
        if shared:
            Path(shared, "proxy.log").write_text(proxy_log())
            Path(shared, "played.txt").write_text(
                "".join(f"{t}\t{c}\n" for t, commands in PLAYED.items() for c in commands))
        if s.running:  # the pods the story leaves running (they outlive numapin): deleted as kubelet would
            async def delete(runner: PodRunner) -> None:
                for r in s.running:
                    await runner.delete(r)

            async def go() -> None:
                async with CRIClient(CONTAINERD_SOCKET, timeout=120) as client:
                    await delete(PodRunner(client, CGROUP_ROOT))
            asyncio.run(go())


INSTALL, SWITCH, UPGRADE, CHECK = ("Installing the proxy on a node", "Switching kubelet to the proxy",
                                   "Upgrading numapin on a node", "Checking a node")
BACK, REMOVE = "Back to kubelet's static policy, without a drain", "Removing numapin"


def test_install_by_the_runbook_and_run_pods(story: Story) -> None:
    assert prop("ActiveState", "containerd.service") == "inactive"
    play(INSTALL, "mkdir -p /tmp/numapin-node && tar", cwd=str(story.tarball.parent))
    r = play(INSTALL, "/tmp/numapin-node/share/numapin/install.sh")
    assert "installed" in r.stderr, r.stderr
    story.first_release = run("cat", "/tmp/numapin-node/share/numapin/RELEASE").stdout.strip()
    assert story.first_release and os.readlink("/opt/numapin") == f"/opt/numapin-releases/{story.first_release}"
    assert prop("ActiveState") == "active" and prop("UnitFileState") == "enabled"
    assert prop("ActiveState", "containerd.service") == "active", "the proxy's unit did not pull containerd in"
    play(INSTALL, "numapin wait-socket")
    assert "active (running)" in play(INSTALL, "systemctl status").stdout
    story.proxy_pid = int(prop("MainPID"))
    play(INSTALL, "systemctl restart")
    story.proxy_pid = wait_restarted(story.proxy_pid)
    assert release_of(story.proxy_pid) == story.first_release
    play(SWITCH, "systemctl restart kubelet")
    assert prop("ActiveState", "kubelet.service") == "active"
    run("ctr", "--address", CONTAINERD_SOCKET, "-n", "k8s.io", "images", "import",
        "/run/numapin-vm-containerd/images.tar")
    story.run_pods()
    story.check_pins("after the install")
    story.state = story.saved()
    assert story.state.get("uid-db", "app") == story.pinned


def test_upgrade_while_pods_run_and_roll_back(story: Story) -> None:
    # a second build, as the new tarball extracted over /tmp/numapin-node would be: the same install, the next release
    second = story.first_release.replace("0.1.0-", "0.1.1-", 1)
    assert second != story.first_release
    run("sh", "-c", f"echo {second} > /tmp/numapin-node/share/numapin/RELEASE")
    mark = len(proxy_log())
    r = play(UPGRADE, "/tmp/numapin-node/share/numapin/install.sh")
    assert f"restarting {UNIT}" in r.stderr, r.stderr
    assert os.readlink("/opt/numapin") == f"/opt/numapin-releases/{second}"
    pid = int(prop("MainPID"))
    assert pid != story.proxy_pid and release_of(pid) == second
    story.proxy_pid = pid
    story.unchanged("after the upgrade", mark)
    play(UPGRADE, "numapin status")  # exit 0: every container agrees with the state
    for startswith in ("numapin status --status-url", "numapin status --state-dir /var/lib/numapin --reserved-cpus",
                       "numapin status --state-dir /var/lib/numapin --no-runtime"):
        play(CHECK, startswith)
    mark = len(proxy_log())
    play(UPGRADE, "/opt/numapin/share/numapin/install.sh --rollback")
    story.proxy_pid = wait_restarted(pid)
    assert release_of(story.proxy_pid) == story.first_release
    story.unchanged("after the rollback", mark)


def test_kill_9_systemd_restarts_the_proxy(story: Story) -> None:
    mark = len(proxy_log())
    restarts = int(prop("NRestarts"))
    os.kill(story.proxy_pid, signal.SIGKILL)
    story.proxy_pid = wait_restarted(story.proxy_pid)
    assert int(prop("NRestarts")) == restarts + 1
    story.unchanged("after kill -9", mark)


def test_reboot_equivalent(story: Story) -> None:
    """Everything stops as at a reboot (the containers too); kubelet's unit is started alone."""
    run("systemctl", "stop", "kubelet.service", UNIT)
    shims = prop("ControlGroup", "containerd.service")
    assert shims, "containerd.service has no cgroup"
    run("systemctl", "stop", "containerd.service")  # KillMode=process: containerd goes, its shims stay
    Path(f"/sys/fs/cgroup{shims}/cgroup.kill").write_text("1")  # the shims
    Path(f"/sys/fs/cgroup/{CGROUP_ROOT}/cgroup.kill").write_text("1")  # every container
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() for pid in story.pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in story.pids.values())
    assert story.saved() == story.state, "the state changed while everything was down"
    mark = len(proxy_log())
    run("systemctl", "start", "kubelet.service")  # as at boot: kubelet wants the proxy, the proxy containerd
    assert [prop("ActiveState", u) for u in ("containerd.service", UNIT, "kubelet.service")] == ["active"] * 3
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


def test_back_to_kubelets_static_policy_by_the_runbook(story: Story) -> None:
    play(BACK, "numapin mode --list")
    play(BACK, "systemctl stop kubelet")
    play(BACK, "systemctl stop numapin-criproxy.service")
    r = play(BACK, "numapin export-kubelet-state")
    assert 'cpuManagerPolicy: "static"' in r.stdout, r.stdout
    # step 3: kubelet's configuration back to containerd with the static policy
    KUBELET_CONFIG.write_text(f"containerRuntimeEndpoint: unix://{CONTAINERD_SOCKET}\ncpuManagerPolicy: static\n"
                              'reservedSystemCPUs: "0"\n')
    play(BACK, "/opt/numapin/share/numapin/install.sh --uninstall")
    play(BACK, "systemctl start kubelet")
    assert prop("ActiveState", "kubelet.service") == "active"
    assert prop("ActiveState") == "inactive", "starting kubelet started numapin's proxy again"
    written = play(BACK, "cat /var/lib/kubelet/cpu_manager_state").stdout
    assert '"policyName":"static"' in written
    kubelet = import_kubelet_state("/var/lib/kubelet/cpu_manager_state")  # kubelet's checksum and policy rules
    assert kubelet.assignments == {"uid-db": {"app": process_cpus(story.pids["db"]).cpus}}
    assert kubelet.default_cpuset == story.all_cpus - story.pinned
    # the way back keeps the settings and the state (the removal's --purge takes them)
    assert Path("/etc/numapin/criproxy.yaml").exists() and STATE.exists()


def test_removal_leaves_nothing(story: Story) -> None:
    LOG_DROPIN.unlink()
    LOG_DROPIN.parent.rmdir()
    play(REMOVE, "systemctl restart kubelet")
    # the node's copy of install.sh went with the way back's --uninstall: the removal's command, from the install
    # the runbook extracted
    command = doc(REMOVE, "/opt/numapin/share/numapin/install.sh --uninstall --purge")
    PLAYED.setdefault(REMOVE, []).append(command)
    run("sh", "-c", command.replace("/opt/numapin/", "/tmp/numapin-node/", 1))
    left = [p for p in ("/opt/numapin", "/opt/numapin-releases", f"/etc/systemd/system/{UNIT}",
                        "/etc/systemd/system/kubelet.service.d", "/etc/numapin", "/var/lib/numapin",
                        "/var/run/numapin") if os.path.lexists(p)]
    assert left == []
    assert prop("LoadState") == "not-found" and prop("ActiveState") == "inactive"
    # no unit, drop-in or enablement link of numapin's left for systemd (listing every unit file over D-Bus takes
    # longer than its call timeout under emulation: the directories are read instead)
    assert [str(p) for p in Path("/etc/systemd/system").rglob("*numapin*")] == []
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
