"""The proxy on kubeadm's node: systemd as PID 1 on pure cgroup v2, containerd with runc's systemd cgroup driver
(``SystemdCgroup = true``), pods in kubelet's slices (``kubepods-burstable-pod<uid>.slice``), on the containerds of the
2026 node: 2.1 (configuration version 3) with every story, then 1.7 (version 2) with the stories that go through
containerd's own handling of kubelet's calls (its CRI records, the updates runc turns into systemd properties): the
node check, pinning and narrowing, the in-place resize and the mode change under reloads with containerd's records
lagging; the kill -9 of the proxy and the reload loop during a narrowing (numapin's and runc's doing, the same runc for
both) run on 2.1 only. One containerd per version for the boot, from the host's
cache (numapin_lab.cri.containerd_versions; the system's 1.6 runs under systemd in tests/install/test_systemd_host.py,
with its cgroupfs driver). CPU 0 reserved, 1 socket, 2 nodes of one core each (node 0: CPUs 0-1, node 1: CPUs 2-3):

- pinning narrows the shared pool, in the kernel and in systemd's view of the containers' scopes;
- an in-place resize of the pinned container: a shrink, a growth that fits its node granted in that node, one
  that cannot stay in one node refused, with no shared container ever on its CPUs, both views agreeing after each;
- a kill -9 of the proxy and its restart keep both views, and the restarted proxy widens the pool again (2.1);
- ``systemctl daemon-reload`` in a loop (2.1) while an exclusive pod is created and held never puts a shared container
  on an exclusive CPU (systemd re-applies every scope's ``AllowedCPUs``/``AllowedMemoryNodes`` on a reload: a cpuset
  written behind its back comes back wrong);
- the same while containerd's records lag (a mode change with the shared containers' shims stopped).

Judged from the kernel: ``/proc/<pid>/status`` and the scope's ``cpuset.cpus.effective``; systemd's view from
``systemctl show``."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from numapin_lab.cri.containerd_versions import CONTAINERDS
from tests.numa.guest.node import OPLOG_ENV, SETTLE_SECONDS, WORK, GuestNode, NodeConfig

RESERVED = CPUSet([0])
# the proxy's --cgroup-driver (``cgroupfs``: the old way, cpusets written behind systemd's back, to show the hazard)
DRIVER = os.environ.get("NUMAPIN_VM_CGROUP_DRIVER", "auto")
CONFIG = NodeConfig("single-numa-node", str(RESERVED), extra=("--cgroup-driver", DRIVER))
# the shared pods: two on 2.1 (each narrowed and widened on its own), one on 1.7 (a shared pod more would cost a
# pod's run and deletion, 10-20 s of the guest's CPUs, for what 2.1 shows)
SHARED = {"2.x": ("web", "api"), "1.7": ("web",)}
# the containerds of numapin_lab.cri.containerd_versions, in the order they run (tests/numa/shapes.py lists them as
# the shape's ``containerds``: the host fills the cache before the boot); the stories marked ON_2X run on the first
VERSIONS = ("2.x", "1.7")
ON_2X = pytest.mark.parametrize("node", ["2.x"], indirect=True, ids=["containerd2.x"])
# reloads while containerd's records lag: the first may have begun before the pod's CPUs counted as held (it still
# ends after, re-applying what systemd holds), the second begins and ends while they are
LAGGING_RELOADS = 2
SAMPLE_SECONDS = 0.02
RELOAD_PAUSE = 0.3  # between two reloads (a reload is a burst of work for systemd under emulation)


@pytest.fixture(scope="module", params=VERSIONS, ids=lambda v: f"containerd{v}")
def node(request: pytest.FixtureRequest) -> Iterator[GuestNode]:
    """A node of its own per containerd (its cache's binaries, ``SystemdCgroup = true``) for that version's stories,
    stopped before the next version's starts (started beside them, the next one slowed them down: with two
    containerds and their proxies the guest's systemd answered a ``systemctl show`` in 20-40 s instead of 1-5 s)."""
    n = GuestNode(WORK / f"containerd-{request.param}", systemd=True, containerd=request.param).start()
    try:
        yield n
    finally:
        n.stop()


def cgroup_path(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"pid {pid} has no cgroup v2 line in /proc/{pid}/cgroup")


def systemctl(*args: str) -> str:
    """``systemctl ARGS``'s output (CalledProcessError when it fails), its time in the node's operation log."""
    t0 = time.monotonic()
    out = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120, check=True).stdout
    if oplog := os.environ.get(OPLOG_ENV):
        with open(oplog, "a") as f:
            f.write(f"{time.monotonic() - t0:.2f} systemctl {args[0]}\n")
    return out


def systemd_views(units: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(AllowedCPUs, AllowedMemoryNodes) systemd holds for each unit (their text, "" when unset), in one
    ``systemctl show`` (a call costs a second or more of the guest's CPUs under emulation)."""
    out = systemctl("show", "-p", "Id", "-p", "AllowedCPUs", "-p", "AllowedMemoryNodes", *units)
    views = {}
    for block in out.split("\n\n"):  # one block per unit
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if "Id" in props:  # systemd separates ranges with spaces ("0 2-3")
            views[props["Id"]] = (props.get("AllowedCPUs", "").replace(" ", ","),
                                  props.get("AllowedMemoryNodes", "").replace(" ", ","))
    return views


def agreed(node: GuestNode, want: Mapping[str, tuple[CPUSet, CPUSet]]) -> str | None:
    """None once the kernel and systemd's view of each named container's scope say its (cpus, mems) of ``want``
    (waited for up to SETTLE_SECONDS); else what both say of those that differ."""
    kernel = {name: node.settled(name, cpus, mems) for name, (cpus, mems) in want.items()}
    units = {name: cgroup_path(k.pid).rsplit("/", 1)[-1] for name, k in kernel.items()}
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        views = systemd_views(list(units.values()))
        wrong = []
        for name, (cpus, mems) in want.items():
            k, (sd_cpus, sd_mems) = kernel[name], views.get(units[name], ("?", "?"))
            if (k.cpus, k.mems, k.cgroup_cpus, k.cgroup_mems) != (cpus, mems, cpus, mems) or \
                    "?" in (sd_cpus, sd_mems) or (CPUSet.parse(sd_cpus), CPUSet.parse(sd_mems)) != (cpus, mems):
                wrong.append(f"{name} (expected {cpus}, memory nodes {mems}): kernel {k}; systemd {units[name]}: "
                             f"AllowedCPUs={sd_cpus!r} AllowedMemoryNodes={sd_mems!r}")
        if not wrong:
            return None
        if time.monotonic() > deadline:
            return "\n".join(wrong)
        time.sleep(0.3)
        kernel = {name: node.kernel(name) for name in want}


def shared_pods(node: GuestNode) -> tuple[str, ...]:
    """The shared pods of this node's stories."""
    assert node.containerd is not None
    return SHARED[node.containerd]


def on(node: GuestNode, pinned: str, pinned_mems: str, shared: str, shared_mems: str, name: str = "db") -> None:
    """The pinned container ``name`` and every shared container where expected, in the kernel and in systemd."""
    S = CPUSet.parse
    want = {name: (S(pinned), S(pinned_mems)), **{n: (S(shared), S(shared_mems)) for n in shared_pods(node)}}
    assert (why := agreed(node, want)) is None, why


def everywhere(machine: Topology, *names: str) -> dict[str, tuple[CPUSet, CPUSet]]:
    """Every CPU and memory node for each of ``names``."""
    return {name: (machine.all_cpus, CPUSet(machine.numa_nodes)) for name in names}


def test_node_is_systemd_on_cgroup_v2_with_pods_in_kubelets_slices(node: GuestNode, machine: Topology) -> None:
    assert Path("/proc/1/comm").read_text().strip() == "systemd"
    kinds = {line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()
             if line.split()[2] in ("cgroup", "cgroup2")}
    assert kinds == {"cgroup2"}, f"cgroup mounts: {kinds}"
    assert node.systemd and node.containerd is not None
    assert node.lab.version.startswith(CONTAINERDS[node.containerd].prefix), node.lab.version
    config = node.lab.config.read_text()
    assert "SystemdCgroup = true" in config and f"version = {3 if node.lab.major >= 2 else 2}" in config
    node.configure(CONFIG)
    for name in shared_pods(node):
        pod = node.run(name, "250m")
        pid = node.pids[(name, "app")]
        uid = pod.uid.replace("-", "_")
        want = (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                f"cri-containerd-{pod.containers['app']}.scope")
        assert cgroup_path(pid) == want
    assert (why := agreed(node, everywhere(machine, *shared_pods(node)))) is None, why


def test_pinning_narrows_the_shared_pool_in_the_kernel_and_in_systemd(node: GuestNode, machine: Topology) -> None:
    node.prepare_proxy()  # the proxy that follows the kill -9 imports meanwhile
    node.run("db", "2", limit="2")
    assert machine.cpus_in_numa(1) == CPUSet.parse("2-3")
    on(node, "2-3", "1", "0-1", "0")  # node 1 whole; the shared pool on node 0


def test_resize_in_place_grows_within_its_node_or_is_refused_and_both_views_follow(node: GuestNode) -> None:
    """kubelet's in-place resize of the pinned pod (node 1 whole): shrunk to one CPU, it keeps CPU 2 and the pool
    widens; grown back to two, it takes its core's sibling on node 1 (CPU 1, the lowest free, is on node 0), no
    shared container ever on its CPUs meanwhile; to three, refused (no node holds 3 CPUs beside the reserved one),
    nothing changed. systemd's AllowedCPUs/AllowedMemoryNodes equal the kernel's after each."""
    node.resize("db", "1")
    on(node, "2", "1", "0-1,3", "0-1")
    with Watch(node, follow="db", reloading=False) as w:
        node.resize("db", "2")
    w.check()
    assert w.samples, "no sample taken during the growth"
    on(node, "2-3", "1", "0-1", "0")
    refusal = node.refuse_resize("db", "3")
    assert refusal.code == "FAILED_PRECONDITION", refusal
    assert "resize refused (TopologyAffinityError)" in refusal.message, refusal
    assert "keeps running as it was" in refusal.message, refusal
    on(node, "2-3", "1", "0-1", "0")


@ON_2X
def test_kill_9_of_the_proxy_and_restart_keep_both_views(node: GuestNode, machine: Topology) -> None:
    """The pinned pod of the checks before (node 1 whole) through a kill -9 of the proxy and its restart on the
    state it left: both views unchanged; its deletion through the restarted proxy widens the pool (that a reload
    keeps a widening is the next check's end)."""
    if "db" not in node.pods:  # the pinning check before failed
        node.run("db", "2", limit="2")
    node.kill_proxy()
    on(node, "2-3", "1", "0-1", "0")
    node.delete("db")  # through the restarted proxy: widening
    assert (why := agreed(node, everywhere(machine, *shared_pods(node)))) is None, why


@dataclass
class Watch:
    """Samples every shared container's cgroup and processes while exclusive CPUs are held (set by ``pinned``, or
    whatever container ``follow`` runs on at each sample); reloads systemd in a loop unless ``reloading`` is off,
    from the start or, with ``after_narrowing``, from the moment every shared container is off those CPUs (which
    then count as held)."""
    node: GuestNode
    follow: str | None = None
    reloading: bool = True
    after_narrowing: CPUSet | None = None
    max_reloads: int | None = None  # the loop's end after this many (else ``quiet`` or the end of the watch)
    exclusive: CPUSet = field(default_factory=CPUSet)
    samples: int = 0
    reloads: int = 0
    reloads_while_pinned: int = 0
    reload_ends: list[float] = field(default_factory=list)  # time.monotonic() at each reload's end
    violations: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    stop_reloads: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def sample(self) -> None:
        names = shared_pods(self.node)
        paths = {name: cgroup_path(self.node.pids[(name, "app")]) for name in names}
        while not self.stop.is_set():
            with self.lock:
                held = self.node.kernel(self.follow).cpus if self.follow else self.exclusive
                for name in names:
                    if not held:
                        break
                    k = self.node.kernel(name)
                    effective = CPUSet.parse(Path(f"/sys/fs/cgroup{paths[name]}/cpuset.cpus.effective").read_text())
                    bad = (k.cpus | effective) & held
                    if bad:
                        self.violations.append(f"{name} on exclusive CPUs {bad}: {k}, cpuset.cpus.effective "
                                               f"{effective} (exclusive {held}; reload #{self.reloads})")
                self.samples += 1
            time.sleep(SAMPLE_SECONDS)

    def reload(self) -> None:
        if self.after_narrowing is not None:
            names = shared_pods(self.node)
            while any(self.node.kernel(name).cpus & self.after_narrowing for name in names):
                if self.stop.is_set():
                    return
                time.sleep(SAMPLE_SECONDS)
            self.pinned(self.after_narrowing)
        while True:  # once begun, at least one
            systemctl("daemon-reload")
            self.count_reload()
            if self.max_reloads is not None and self.reloads >= self.max_reloads:
                return
            if self.stop.is_set() or self.stop_reloads.wait(RELOAD_PAUSE):
                return

    def quiet(self) -> None:
        """The reload loop ends (the reload under way runs to its end first); the sampling goes on."""
        self.stop_reloads.set()
        for t in self.threads[1:]:
            t.join(timeout=150)

    def count_reload(self) -> None:
        with self.lock:  # a reload re-applies the units' properties as it ends
            self.reloads += 1
            self.reloads_while_pinned += bool(self.exclusive)
            self.reload_ends.append(time.monotonic())

    def __enter__(self) -> Watch:
        self.threads = [threading.Thread(target=self.sample, daemon=True)]
        if self.reloading:
            self.threads.append(threading.Thread(target=self.reload, daemon=True))
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=150)
        print(f"samples {self.samples}, reloads {self.reloads} ({self.reloads_while_pinned} while pinned), "
              f"violations {len(self.violations)}")

    def check(self) -> None:
        assert not self.violations, "\n".join(self.violations[:20]) + f"\n({len(self.violations)} samples " \
                                                                        f"of {self.samples})"

    def pinned(self, cpus: CPUSet) -> None:
        with self.lock:
            self.exclusive = cpus


@ON_2X
def test_daemon_reload_during_narrowing_never_puts_a_shared_container_on_an_exclusive_cpu(
        node: GuestNode, machine: Topology) -> None:
    """An exclusive pod is created, and ``systemctl daemon-reload`` runs in a loop from the moment its narrowing of
    the shared pool shows in the kernel (the hazard's window: from there until containerd's records of the narrowing
    land, a reload puts back whatever systemd last heard) until the pod runs, and one reload ends while it runs (the
    loop's last, or one more; a reload's end is where systemd re-applies its properties): from the narrowing on, the
    kernel never shows a shared container on its CPUs (sampled every 20 ms). Its deletion widens the pool, which a
    reload then keeps."""
    if "db" in node.pods:  # left by a failed check before
        node.delete("db")
    node_1 = machine.cpus_in_numa(1)  # where the pod goes: the shared pool leaves it first
    with Watch(node, after_narrowing=node_1) as w:
        node.run("x", "2", limit="2")
        assert node.kernel("x").cpus == node_1, node.kernel("x")
        ran = time.monotonic()
        w.quiet()  # the loop's reload under way, if any, ends while the pod runs
        if not any(end > ran for end in w.reload_ends):  # none was: one more, alone (the costliest step here)
            systemctl("daemon-reload")
            w.count_reload()
    w.check()
    assert w.reloads_while_pinned >= 1 and any(end > ran for end in w.reload_ends), w.reload_ends
    # the widening, out of the loop: with no exclusive CPU left there is nothing to sample, and every D-Bus call of
    # the deletion would wait for a reload to end (systemd answers none during one)
    node.delete("x")
    systemctl("daemon-reload")
    assert (why := agreed(node, everywhere(machine, *shared_pods(node)))) is None, why


def shim_of(pid: int) -> int:
    """The containerd shim a container's main process runs under (its parent)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid in /proc/{pid}/status")


def test_daemon_reload_while_containerds_record_lags_keeps_a_mode_change(node: GuestNode, machine: Topology) -> None:
    """A pod's mode changes to exclusive while containerd cannot bring the shared containers' records up to date
    (their shims stopped: each ``UpdateContainerResources`` of theirs hangs, as on a busy node or during an upgrade),
    and ``systemctl daemon-reload`` runs meanwhile: systemd must not put the shared containers back on the pod's
    CPU. Then the pod goes back to the shared pool."""
    if "db" in node.pods:  # the pinned pod of the pinning and resize checks (1.7 runs no kill -9 check to delete it)
        node.delete("db")
    node.run("app", "1", limit="1", mode="none")
    assert (why := agreed(node, everywhere(machine, "app"))) is None, why
    shared = shared_pods(node)
    shims = {shim_of(node.pids[(name, "app")]) for name in shared}
    assert shim_of(node.pids[("app", "app")]) not in shims
    for pid in shims:
        os.kill(pid, signal.SIGSTOP)
    try:
        answer = node.set_mode("app", "exclusive")
        assert answer.get("outcome") == "changed", answer
        one = node.kernel("app").cpus
        assert len(one) == 1 and not one & RESERVED, one
        rest = machine.all_cpus - one
        for name in shared:  # narrowed in the kernel before any reload
            k = node.settled(name, rest, machine.numa_of(rest))
            assert k.cpus == rest and k.cgroup_cpus == rest, f"{name} not narrowed: {k}"
        with Watch(node, max_reloads=LAGGING_RELOADS) as w:
            w.pinned(one)
            deadline = time.monotonic() + 90
            while w.reloads < LAGGING_RELOADS and time.monotonic() < deadline:
                time.sleep(0.5)
        w.check()
        assert w.reloads >= LAGGING_RELOADS, f"only {w.reloads} reloads in 90 s"
        kernel = {name: node.kernel(name) for name in shared}
        units = {name: cgroup_path(k.pid).rsplit("/", 1)[-1] for name, k in kernel.items()}
        views = systemd_views(list(units.values()))
        for name, k in kernel.items():
            assert not (k.cpus | (k.cgroup_cpus or CPUSet())) & one, f"after daemon-reload: {name}: {k}"
            sd_cpus = views[units[name]][0]
            assert CPUSet.parse(sd_cpus) == rest, f"{name}: systemd holds AllowedCPUs={sd_cpus!r}, not {rest}"
    finally:
        for pid in shims:
            os.kill(pid, signal.SIGCONT)
    answer = node.set_mode("app", "none")
    assert answer.get("outcome") == "changed", answer
    assert (why := agreed(node, everywhere(machine, *shared_pods(node), "app"))) is None, why
    node.delete("app")
