"""The proxy on kubeadm's node: systemd as PID 1 on pure cgroup v2, containerd with runc's systemd cgroup driver,
pods in kubelet's slices (``kubepods-burstable-pod<uid>.slice``), one story (CPU 0 reserved, 1 socket, 2 nodes
of one core each): pinning narrows the shared pool, in the kernel and in systemd's view of the containers' scopes;
``systemctl daemon-reload`` in a loop while exclusive pods come and go never puts a shared container on an
exclusive CPU (systemd re-applies every scope's ``AllowedCPUs``/``AllowedMemoryNodes`` on a reload: a cpuset
written behind its back comes back wrong); a mode change and a kill -9 of the proxy keep both views right.

Judged from the kernel: ``/proc/<pid>/status`` and the scope's ``cpuset.cpus.effective``; systemd's view from
``systemctl show``."""

from __future__ import annotations

import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from allocator.cpuset import CPUSet
from allocator.topology import Topology
from tests.numa.guest.node import SETTLE_SECONDS, GuestNode, NodeConfig

RESERVED = CPUSet([0])
CONFIG = NodeConfig("single-numa-node", str(RESERVED))
SHARED = ("web", "api")
ROUNDS = 4          # exclusive pods made and deleted while systemd reloads
HOLD_SECONDS = 4.0  # each stays this long (several reloads)
SAMPLE_SECONDS = 0.02


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
    return props.get("AllowedCPUs", ""), props.get("AllowedMemoryNodes", "")


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

    def sample(self) -> None:
        paths = {name: cgroup_path(self.node.pids[(name, "app")]) for name in SHARED}
        while not self.stop.is_set():
            with self.lock:
                held = self.exclusive
                for name in SHARED:
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
            with self.lock:
                self.reloads += 1
                self.reloads_while_pinned += bool(self.exclusive)

    def pinned(self, cpus: CPUSet) -> None:
        with self.lock:
            self.exclusive = cpus


def test_daemon_reload_during_narrowing_never_puts_a_shared_container_on_an_exclusive_cpu(
        node: GuestNode, machine: Topology) -> None:
    node.delete("db")
    w = Watch(node)
    threads = [threading.Thread(target=w.sample, daemon=True), threading.Thread(target=w.reload, daemon=True)]
    for t in threads:
        t.start()
    try:
        for i in range(ROUNDS):
            node.run(f"x{i}", "2", limit="2")
            w.pinned(node.kernel(f"x{i}").cpus)  # from here until its deletion no shared container may be there
            time.sleep(HOLD_SECONDS)
            w.pinned(CPUSet())
            node.delete(f"x{i}")
            time.sleep(HOLD_SECONDS / 2)
    finally:
        w.stop.set()
        for t in threads:
            t.join(timeout=150)
    print(f"samples {w.samples}, reloads {w.reloads} ({w.reloads_while_pinned} while pinned), violations "
          f"{len(w.violations)}")
    assert not w.violations, "\n".join(w.violations[:20]) + f"\n({len(w.violations)} samples of {w.samples})"
    assert w.reloads_while_pinned >= ROUNDS, f"only {w.reloads_while_pinned} reloads while exclusive CPUs were held"
    everything, all_nodes = machine.all_cpus, CPUSet(machine.numa_nodes)
    for name in SHARED:
        assert (why := agreed(node, name, everything, all_nodes)) is None, why


def test_mode_change_moves_the_pod_in_the_kernel_and_in_systemd(node: GuestNode, machine: Topology) -> None:
    node.run("app", "1", limit="1", mode="none")
    everything, all_nodes = machine.all_cpus, CPUSet(machine.numa_nodes)
    assert (why := agreed(node, "app", everything, all_nodes)) is None, why
    answer = node.set_mode("app", "exclusive")
    assert answer.get("outcome") == "ok", answer
    one = node.kernel("app").cpus
    assert len(one) == 1 and not one & RESERVED, one
    rest = machine.all_cpus - one
    assert (why := agreed(node, "app", one, machine.numa_of(one))) is None, why
    for name in SHARED:
        assert (why := agreed(node, name, rest, machine.numa_of(rest))) is None, why
    subprocess.run(["systemctl", "daemon-reload"], timeout=120, check=True)
    for name in SHARED:
        assert (why := agreed(node, name, rest, machine.numa_of(rest))) is None, f"after daemon-reload: {why}"
    answer = node.set_mode("app", "none")
    assert answer.get("outcome") == "ok", answer
    for name in (*SHARED, "app"):
        assert (why := agreed(node, name, everything, all_nodes)) is None, why
    node.delete("app")


def test_kill_9_of_the_proxy_and_restart_keep_both_views(node: GuestNode, machine: Topology) -> None:
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
