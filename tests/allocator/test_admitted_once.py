"""kubelet admits a pod once: a later create of one of its containers (``admit_pod(only=name)``) gives CPUs to that
container alone. Another container without CPUs (an init container that completed and was removed, a container on
the shared pool) gets none behind its back, and no container holding CPUs ever gets others, in either scope."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from allocator import CPUSet, NodeAllocator, NodeConfig, Topology
from allocator.pod import ContainerInfo, PodInfo, Role
from tests.fixtures.make_sysfs import MACHINES, build

M = 1 << 20
SCOPES = ("pod", "container")


@pytest.fixture(scope="module")
def xeon(tmp_path_factory: pytest.TempPathFactory) -> Topology:
    return Topology.from_sysfs(build(MACHINES["xeon-6258r"], tmp_path_factory.mktemp("xeon")))


def node(topo: Topology, scope: str, policy: str = "best-effort") -> NodeAllocator:
    return NodeAllocator(NodeConfig(topology=topo, reserved_cpus=CPUSet([0]), topology_manager_policy=policy,
                                    topology_manager_scope=scope))


def guaranteed(*containers: tuple[str, Role, int], uid: str = "u") -> PodInfo:
    return PodInfo(uid, "default", "p", "Guaranteed", None, False,
                   tuple(ContainerInfo(n, role, milli, milli, M, M) for n, role, milli in containers))


@pytest.mark.parametrize("scope", SCOPES)
def test_a_completed_and_removed_init_container_gets_no_cpus_when_its_sibling_restarts(
        tmp_path: Path, scope: str) -> None:
    """Two CPUs, CPU 0 reserved: the init container's CPU passed to the app. The init container removed (its CPU
    stays with the app), the app's restart used to allocate the init container again: no CPU left, the restart
    refused (UnexpectedAdmissionError); with CPUs left, one taken from the shared pool for a finished container."""
    from tests.criproxy.conftest import make_sysfs
    for cpus in (2, 4):
        topo = Topology.from_sysfs(make_sysfs(tmp_path / f"sys{cpus}-{scope}", {0: list(range(cpus))}))
        a = node(topo, scope)
        pod = guaranteed(("init", "init", 1000), ("app", "app", 1000))
        assert a.admit_pod(pod).admitted
        app = a.container_cpus("u", "app")
        a.release_container("u", "init")   # RemoveContainer of the completed init container
        pool = a.shared_pool()
        again = a.admit_pod(pod, only="app")  # the app container crashed and is created again (attempt+1)
        assert again.admitted, again.message
        assert a.container_cpus("u", "app") == app and a.container_cpus("u", "init") is None
        assert a.shared_pool() == pool


@pytest.mark.parametrize("scope", SCOPES)
def test_a_running_sibling_without_cpus_is_not_given_any(xeon: Topology, scope: str) -> None:
    a = node(xeon, scope)
    pod = guaranteed(("a", "app", 2000), ("b", "app", 2000), ("c", "app", 4000))
    assert a.admit_pod(pod).admitted
    a.release_container("u", "c")  # c runs on the shared pool now (its CPUs were given back)
    held = {n: a.container_cpus("u", n) for n in ("a", "b")}
    d = a.admit_pod(pod, only="a")  # a re-created
    assert d.admitted and a.container_cpus("u", "c") is None
    assert {n: a.container_cpus("u", n) for n in ("a", "b")} == held
    assert [c.name for c in d.containers] == ["a", "b"]
    # c itself, when kubelet creates it again, gets CPUs of its own
    assert a.admit_pod(pod, only="c").admitted and len(a.container_cpus("u", "c") or ()) == 4
    assert {n: a.container_cpus("u", n) for n in ("a", "b")} == held


@pytest.mark.parametrize("scope", SCOPES)
def test_the_first_admission_still_allocates_the_whole_pod(xeon: Topology, scope: str) -> None:
    a = node(xeon, scope, "single-numa-node")
    pod = guaranteed(("init", "init", 4000), ("a", "app", 2000), ("b", "app", 2000))
    assert a.admit_pod(pod).admitted
    assert {n for n in a.state.assignments["u"]} == {"init", "a", "b"}
    assert a.container_cpus("u", "init") == a.container_cpus("u", "a") | a.container_cpus("u", "b")  # reused


@pytest.mark.parametrize("seed", range(16))
def test_random_later_admissions_change_no_other_containers_cpus(xeon: Topology, seed: int) -> None:
    """Seeded: pods admitted, containers released (removed) and created again in any order, in both scopes and
    every policy; a later admission changes nobody's CPUs but the created container's."""
    rng = random.Random(seed)
    a = node(xeon, rng.choice(SCOPES), rng.choice(["none", "best-effort", "restricted", "single-numa-node"]))
    pods = []
    for k in range(rng.randint(2, 5)):
        cs: list[tuple[str, Role, int]] = []
        if rng.random() < 0.5:
            cs.append(("init", "init", rng.choice([1000, 2000, 4000, 500])))
        cs += [(f"c{i}", "app", rng.choice([1000, 2000, 3000, 500])) for i in range(rng.randint(1, 3))]
        pods.append(guaranteed(*cs, uid=f"u{k}"))
    admitted = set()
    for _ in range(60):
        pod = rng.choice(pods)
        if pod.uid not in admitted:
            if a.admit_pod(pod).admitted:
                admitted.add(pod.uid)
            continue
        c = rng.choice(pod.containers)
        if rng.random() < 0.4:
            a.release_container(pod.uid, c.name)
            continue
        before = {(p.uid, x.name): a.container_cpus(p.uid, x.name) for p in pods for x in p.containers}
        d = a.admit_pod(pod, only=c.name)
        after = {(p.uid, x.name): a.container_cpus(p.uid, x.name) for p in pods for x in p.containers}
        changed = {k for k in before if before[k] != after[k]}
        assert changed <= {(pod.uid, c.name)}, (changed, d.message)
        if before[(pod.uid, c.name)] is not None:
            assert not changed
