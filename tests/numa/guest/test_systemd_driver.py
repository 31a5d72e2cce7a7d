"""The proxy on kubeadm's node: systemd as PID 1 on pure cgroup v2, containerd with runc's systemd cgroup driver,
pods in kubelet's slices (``kubepods-burstable-pod<uid>.slice``), one story (CPU 0 reserved, 1 socket, 2 nodes
of one core each): pinning narrows the shared pool, in the kernel and in systemd's view of the containers' scopes;
``systemctl daemon-reload`` in a loop while exclusive pods come and go never puts a shared container on an
exclusive CPU (systemd re-applies every scope's ``AllowedCPUs``/``AllowedMemoryNodes`` on a reload: a cpuset
written behind its back comes back wrong), also while containerd's records lag (a mode change with the shared
containers' shims stopped); a kill -9 of the proxy and its restart keep both views right.

Judged from the kernel: ``/proc/<pid>/status`` and the scope's ``cpuset.cpus.effective``; systemd's view from
``systemctl show``."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.guest.node import SETTLE_SECONDS, GuestNode, NodeConfig

RESERVED = CPUSet([0])
# the proxy's --cgroup-driver (``cgroupfs``: the old way, cpusets written behind systemd's back, to show the hazard)
DRIVER = os.environ.get("NUMAPIN_VM_CGROUP_DRIVER", "auto")
CONFIG = NodeConfig("single-numa-node", str(RESERVED), extra=("--cgroup-driver", DRIVER))
SHARED = ("web", "api")
ROUNDS = 1          # exclusive pods made and deleted while systemd reloads (each costs ~60 s of VM time)
PINNED_RELOADS = 2  # reloads run to their end while each holds its CPUs (the loop's come on top)
SAMPLE_SECONDS = 0.02
RELOAD_PAUSE = 0.3  # between two reloads (a reload is a burst of work for systemd under emulation)


def cgroup_path(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise AssertionError(f"pid {pid} has no cgroup v2 line in /proc/{pid}/cgroup")


def systemd_view(unit: str) -> tuple[str, str]:
    """(AllowedCPUs, AllowedMemoryNodes) systemd holds for ``unit`` (its text, "" when unset)."""
    out = subprocess.run(["systemctl", "show", "-p", "AllowedCPUs", "-p", "AllowedMemoryNodes", unit],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    # systemd separates ranges with spaces ("0 2-3")
    return props.get("AllowedCPUs", "").replace(" ", ","), props.get("AllowedMemoryNodes", "").replace(" ", ",")


def agreed(node: GuestNode, name: str, cpus: CPUSet, mems: CPUSet) -> str | None:
    """None once systemd's view of the container's scope and the kernel both say ``cpus``/``mems`` (waited for up
    to SETTLE_SECONDS); else what each says."""
    k = node.settled(name, cpus, mems)
    unit = cgroup_path(k.pid).rsplit("/", 1)[-1]
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        sd_cpus, sd_mems = systemd_view(unit)
        if CPUSet.parse(sd_cpus) == cpus and CPUSet.parse(sd_mems) == mems and k.cgroup_cpus == cpus \
                and k.cpus == cpus and k.mems == mems:
            return None
        if time.monotonic() > deadline:
            return f"{name}: kernel {k}; systemd {unit}: AllowedCPUs={sd_cpus!r} AllowedMemoryNodes={sd_mems!r}"
        time.sleep(0.3)
        k = node.kernel(name)


def test_node_is_systemd_on_cgroup_v2_with_pods_in_kubelets_slices(node: GuestNode, machine: Topology) -> None:
    assert Path("/proc/1/comm").read_text().strip() == "systemd"
    kinds = {line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()
             if line.split()[2] in ("cgroup", "cgroup2")}
    assert kinds == {"cgroup2"}, f"cgroup mounts: {kinds}"
    assert node.systemd
    node.configure(CONFIG)
    everything, all_nodes = machine.all_cpus, CPUSet(machine.numa_nodes)
    for name in SHARED:
        pod = node.run(name, "250m")
        pid = node.pids[(name, "app")]
        uid = pod.uid.replace("-", "_")
        want = (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                f"cri-containerd-{pod.containers['app']}.scope")
        assert cgroup_path(pid) == want
        assert (why := agreed(node, name, everything, all_nodes)) is None, why


def test_pinning_narrows_the_shared_pool_in_the_kernel_and_in_systemd(node: GuestNode, machine: Topology) -> None:
    node.run("db", "2", limit="2")
    pinned = machine.cpus_in_numa(1)
    assert (why := agreed(node, "db", pinned, CPUSet([1]))) is None, why
    rest = machine.all_cpus - pinned
    for name in SHARED:
        assert (why := agreed(node, name, rest, CPUSet([0]))) is None, why


@dataclass
class Watch:
    """Samples every shared container's cgroup and processes while exclusive CPUs are held; reloads systemd."""
    node: GuestNode
    exclusive: CPUSet = field(default_factory=CPUSet)
    samples: int = 0
    reloads: int = 0
    reloads_while_pinned: int = 0
    violations: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def sample(self) -> None:
        paths = {name: cgroup_path(self.node.pids[(name, "app")]) for name in SHARED}
        while not self.stop.is_set():
            with self.lock:
                held = self.exclusive
                for name in SHARED:
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
        while not self.stop.is_set():
            subprocess.run(["systemctl", "daemon-reload"], timeout=120, check=True)
            self.count_reload()
            self.stop.wait(RELOAD_PAUSE)

    def count_reload(self) -> None:
        with self.lock:  # a reload re-applies the units' properties as it ends
            self.reloads += 1
            self.reloads_while_pinned += bool(self.exclusive)

    def __enter__(self) -> Watch:
        self.threads = [threading.Thread(target=self.sample, daemon=True),
                        threading.Thread(target=self.reload, daemon=True)]
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


def test_daemon_reload_during_narrowing_never_puts_a_shared_container_on_an_exclusive_cpu(
        node: GuestNode, machine: Topology) -> None:
    """Exclusive pods come and go while ``systemctl daemon-reload`` runs in a loop; from each one's start to its
    deletion the kernel never shows a shared container on its CPUs (sampled every 20 ms)."""
    node.delete("db")
    with Watch(node) as w:
        for i in range(ROUNDS):
            node.run(f"x{i}", "2", limit="2")
            w.pinned(node.kernel(f"x{i}").cpus)  # from here until its deletion no shared container may be there
            for _ in range(PINNED_RELOADS):  # besides the loop's: these surely end while the CPUs are held
                subprocess.run(["systemctl", "daemon-reload"], timeout=120, check=True)
                w.count_reload()
            w.pinned(CPUSet())
            node.delete(f"x{i}")
    w.check()
    assert w.reloads_while_pinned >= ROUNDS * PINNED_RELOADS, w.reloads_while_pinned
    everything, all_nodes = machine.all_cpus, CPUSet(machine.numa_nodes)
    for name in SHARED:
        assert (why := agreed(node, name, everything, all_nodes)) is None, why


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
    node.run("app", "1", limit="1", mode="none")
    everything, all_nodes = machine.all_cpus, CPUSet(machine.numa_nodes)
    assert (why := agreed(node, "app", everything, all_nodes)) is None, why
    shims = {shim_of(node.pids[(name, "app")]) for name in SHARED}
    assert shim_of(node.pids[("app", "app")]) not in shims
    for pid in shims:
        os.kill(pid, signal.SIGSTOP)
    try:
        answer = node.set_mode("app", "exclusive")
        assert answer.get("outcome") == "changed", answer
        one = node.kernel("app").cpus
        assert len(one) == 1 and not one & RESERVED, one
        rest = machine.all_cpus - one
        for name in SHARED:  # narrowed in the kernel before any reload
            k = node.settled(name, rest, machine.numa_of(rest))
            assert k.cpus == rest and k.cgroup_cpus == rest, f"{name} not narrowed: {k}"
        with Watch(node) as w:
            w.pinned(one)
            deadline = time.monotonic() + 90
            while w.reloads < 3 and time.monotonic() < deadline:
                time.sleep(0.5)
        w.check()
        assert w.reloads >= 3, f"only {w.reloads} reloads in 90 s"
        for name in SHARED:
            k = node.kernel(name)
            assert not (k.cpus | (k.cgroup_cpus or CPUSet())) & one, f"after daemon-reload: {name}: {k}"
            sd_cpus, _ = systemd_view(cgroup_path(k.pid).rsplit("/", 1)[-1])
            assert CPUSet.parse(sd_cpus) == rest, f"{name}: systemd holds AllowedCPUs={sd_cpus!r}, not {rest}"
    finally:
        for pid in shims:
            os.kill(pid, signal.SIGCONT)
    answer = node.set_mode("app", "none")
    assert answer.get("outcome") == "changed", answer
    for name in (*SHARED, "app"):
        assert (why := agreed(node, name, everything, all_nodes)) is None, why
    node.delete("app")


def test_kill_9_of_the_proxy_and_restart_keep_both_views(node: GuestNode, machine: Topology) -> None:
    if "app" in node.pods:  # left by a failed check before
        node.delete("app")
    node.run("db", "2", limit="2")
    pinned = machine.cpus_in_numa(1)
    rest = machine.all_cpus - pinned
    node.kill_proxy()
    assert (why := agreed(node, "db", pinned, CPUSet([1]))) is None, why
    for name in SHARED:
        assert (why := agreed(node, name, rest, CPUSet([0]))) is None, f"after the restart: {why}"
    node.delete("db")  # through the restarted proxy: widening
    subprocess.run(["systemctl", "daemon-reload"], timeout=120, check=True)
    everything, all_nodes = machine.all_cpus, CPUSet(machine.numa_nodes)
    for name in SHARED:
        assert (why := agreed(node, name, everything, all_nodes)) is None, why
