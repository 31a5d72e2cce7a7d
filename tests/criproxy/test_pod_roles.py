"""Init containers as the proxy learns them from CRI (nodeagent.decisions.pod_roles), driving NodeAllocator alone: only
init containers' CPUs pass to later containers; a crashed app container keeps its CPUs while it is down."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from allocator.node import NodeAllocator, NodeConfig
from allocator.pod import ContainerInfo, PodInfo
from allocator.topology import Topology
from nodeagent.decisions.pod_roles import Instance, PodRoles, replay
from tests.criproxy.conftest import make_sysfs


@pytest.fixture
def allocator(tmp_path: Path) -> NodeAllocator:
    topo = Topology.from_sysfs(make_sysfs(tmp_path / "sys", {0: [0, 1, 2, 3]}))
    return NodeAllocator(NodeConfig(topology=topo, reserved_cpus=CPUSet([0])))


def pod_model(roles: PodRoles, names: list[str], cpus: int = 1) -> PodInfo:
    """What cri_intent.pod_from_cri hands the allocator: known containers with their learned roles, init first."""
    cs = [ContainerInfo(n, roles.role(n), cpus * 1000, cpus * 1000, 1 << 20, 1 << 20) for n in names]
    cs.sort(key=lambda c: c.role != "init")
    return PodInfo("uid-p", "default", "p", "Guaranteed", None, False, tuple(cs))


def app_cpus(a: NodeAllocator, roles: PodRoles) -> dict[str, CPUSet]:
    return {n: c for n, c in a.state.assignments.get("uid-p", {}).items() if not roles.is_init(n)}


def assert_no_cpu_twice(held: dict[str, CPUSet]) -> None:
    seen = CPUSet()
    for name, cpus in held.items():
        assert seen.isdisjoint(cpus), f"{name} shares {cpus & seen} with a sibling: {held}"
        seen |= cpus


def exited(name: str, code: int, kind: str | None = None) -> Instance:
    return Instance(name, 0, 1, True, code, 2, kind)


def running(name: str, kind: str | None = None) -> Instance:
    return Instance(name, 0, 1, False, None, 0, kind)


def test_the_old_rule_every_exited_container_is_init_puts_two_app_containers_on_one_cpu(
        allocator: NodeAllocator) -> None:
    """The bug (issue 9 item 1) with NodeAllocator alone: app1 crashed, app2 created meanwhile took its CPU for an
    init container's, app1 re-created keeps it."""
    a = allocator
    a.admit_pod(PodInfo("uid-p", "default", "p", "Guaranteed", None, False,
                        (ContainerInfo("app1", "app", 1000, 1000, 1, 1),)))
    crashed_as_init = ContainerInfo("app1", "init", 1000, 1000, 1, 1)
    a.admit_pod(PodInfo("uid-p", "default", "p", "Guaranteed", None, False,
                        (crashed_as_init, ContainerInfo("app2", "app", 1000, 1000, 1, 1))))
    held = a.state.assignments["uid-p"]
    assert held["app1"] == held["app2"]  # what the old pod model did


@pytest.mark.parametrize("code", [1, 137, 255])
def test_an_app_container_that_crashed_before_its_sibling_was_created_keeps_its_cpus(
        allocator: NodeAllocator, code: int) -> None:
    roles = PodRoles()
    roles.on_create("app1", None, {})
    allocator.admit_pod(pod_model(roles, ["app1"]))
    mine = allocator.container_cpus("uid-p", "app1")
    # app1 crashes (non-zero exit); kubelet creates app2 (its image pull took a while)
    roles.on_create("app2", None, {"app1": exited("app1", code)})
    assert roles.role("app1") == "app"
    d = allocator.admit_pod(pod_model(roles, ["app1", "app2"]))
    assert d.admitted
    assert_no_cpu_twice(allocator.state.assignments["uid-p"])
    # app1 re-created (attempt 1): its own CPU back
    assert roles.on_create("app1", None, {"app2": running("app2")}) is False
    allocator.admit_pod(pod_model(roles, ["app1", "app2"]))
    assert allocator.container_cpus("uid-p", "app1") == mine
    assert_no_cpu_twice(allocator.state.assignments["uid-p"])


def test_an_app_container_that_exited_0_before_its_sibling_was_created_gets_new_cpus_when_recreated(
        allocator: NodeAllocator) -> None:
    """The one case CRI cannot tell from an init container (older kubelets): app1 exited 0 before app2's first
    create, so app2 reused its CPU; when kubelet re-creates app1, it gets CPUs of its own."""
    roles = PodRoles()
    roles.on_create("app1", None, {})
    allocator.admit_pod(pod_model(roles, ["app1"]))
    roles.on_create("app2", None, {"app1": exited("app1", 0)})
    assert roles.role("app1") == "init"
    allocator.admit_pod(pod_model(roles, ["app1", "app2"]))
    assert allocator.container_cpus("uid-p", "app2") == allocator.container_cpus("uid-p", "app1")
    assert roles.on_create("app1", None, {"app2": running("app2")}) is True
    assert roles.role("app1") == "app"
    d = allocator.admit_pod(pod_model(roles, ["app1", "app2"]), reallocate=["app1"])
    assert d.admitted
    assert_no_cpu_twice(allocator.state.assignments["uid-p"])
    assert allocator.shared_pool() == CPUSet([0, 3])


def test_kubelets_container_type_annotation_decides(allocator: NodeAllocator) -> None:
    roles = PodRoles()
    roles.on_create("app1", "container", {})
    roles.on_create("app2", "container", {"app1": exited("app1", 0, "container")})
    assert roles.role("app1") == "app"  # exited 0, but kubelet said it is an app container
    roles2 = PodRoles()
    roles2.on_create("side", "init", {})
    roles2.on_create("init", "init", {"side": running("side", "init")})
    roles2.on_create("app", "container", {"side": running("side", "init"), "init": exited("init", 0, "init")})
    assert (roles2.role("side"), roles2.role("init"), roles2.role("app")) == ("sidecar", "init", "app")


def test_init_containers_pass_their_cpus_to_app_containers(allocator: NodeAllocator) -> None:
    roles = PodRoles()
    roles.on_create("init", None, {})
    allocator.admit_pod(pod_model(roles, ["init"], cpus=2))
    init_cpus = allocator.container_cpus("uid-p", "init")
    roles.on_create("app", None, {"init": exited("init", 0)})
    allocator.admit_pod(pod_model(roles, ["init", "app"], cpus=2))
    assert allocator.container_cpus("uid-p", "app") == init_cpus
    # a second app container created right after: it gets its own CPUs, the first app is running
    roles.on_create("app2", None, {"init": exited("init", 0), "app": running("app")})
    d = allocator.admit_pod(_two_then_one(roles))
    assert d.admitted
    assert_no_cpu_twice(app_cpus(allocator, roles))


def _two_then_one(roles: PodRoles) -> PodInfo:
    p = pod_model(roles, ["init", "app", "app2"], cpus=2)
    return replace(p, containers=tuple(replace(c, cpu_request_milli=1000, cpu_limit_milli=1000)
                                       if c.name == "app2" else c for c in p.containers))


def test_replay_after_a_restart_learns_the_same_roles() -> None:
    inst = [
        Instance("init1", 0, 10, True, 1, 11),      # failed once
        Instance("init1", 1, 12, True, 0, 13),      # retried, succeeded
        Instance("init2", 0, 14, True, 0, 15, "init"),
        Instance("side", 0, 13, False, kind="init"),  # a sidecar started between them
        Instance("app1", 0, 16, True, 0, 30),       # ran, exited 0 after app2 was created: an app
        Instance("app2", 0, 17, False),
        Instance("app3", 0, 40, False),
    ]
    roles = replay(inst)
    assert roles.order == ["init1", "side", "init2", "app1", "app2", "app3"]
    assert {n: roles.role(n) for n in roles.order} == {
        "init1": "init", "side": "sidecar", "init2": "init", "app1": "app", "app2": "app", "app3": "app"}
    # an app container that exited 0 before its sibling's first create, then re-created after it
    again = replay([Instance("a", 0, 1, True, 0, 2), Instance("b", 0, 3, False), Instance("a", 1, 4, False)])
    assert again.role("a") == "app"


@pytest.mark.parametrize("seed", range(20))
def test_random_crashes_never_put_two_live_app_containers_on_one_cpu(tmp_path: Path, seed: int) -> None:
    """Seeded: app containers of one pod crash (any exit code) and are re-created while siblings are created for
    the first time; no two app containers ever hold the same CPU, and every re-created one keeps its CPUs unless
    it had to be taken for an init container."""
    rng = random.Random(seed)
    topo = Topology.from_sysfs(make_sysfs(tmp_path / "sys", {0: list(range(8))}))
    a = NodeAllocator(NodeConfig(topology=topo, reserved_cpus=CPUSet([0])))
    roles = PodRoles()
    names = [f"app{i}" for i in range(rng.randint(2, 5))]
    state: dict[str, Instance] = {}
    for _ in range(40):
        n = rng.choice(names)
        if n in state and not state[n].exited and rng.random() < 0.5:
            state[n] = exited(n, rng.choice([0, 1, 137]))
            continue
        if n in state and not state[n].exited:
            continue
        mine_before = a.container_cpus("uid-p", n)
        flipped = roles.on_create(n, None, {k: v for k, v in state.items() if k != n})
        known = [k for k in roles.order if k in state or k == n]
        d = a.admit_pod(pod_model(roles, known), reallocate=[n] if flipped else [])
        if not d.admitted:
            continue
        state[n] = running(n)
        live = {k: a.container_cpus("uid-p", k) for k, v in state.items() if not v.exited}
        assert_no_cpu_twice({k: c for k, c in live.items() if c is not None})
        if mine_before is not None and not flipped:
            assert a.container_cpus("uid-p", n) == mine_before
