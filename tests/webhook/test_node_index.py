"""The node index behind /validate: after any sequence of document and label changes it answers exactly what a
scan of every node answers (same shapes, same free-CPU states, same selector matches), and /validate's verdicts
through it equal the verdicts of the scan."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from allocator.nrt import parse_nrt
from allocator.pod import PodInfo
from webhook.admission.simulate import Simulator
from webhook.admission.validate import feasibility
from webhook.cluster.nodes import NodeStore

from .nrt_fixtures import machine, nrt

TOPOLOGIES = {"big": machine(2, 6), "small": machine(4, 2)}
POLICIES = ("single-numa-node", "restricted", "best-effort")


def _random_node(rnd: random.Random, name: str) -> Any:
    kind = rnd.choice(sorted(TOPOLOGIES))
    topo = TOPOLOGIES[kind]
    cpus = sorted(topo.all_cpus)
    busy = rnd.sample(cpus[1:], rnd.randint(0, len(cpus) - 2))
    labels = {"pool": rnd.choice(("a", "b")), "zone": rnd.choice(("z1", "z2", "z3"))}
    return parse_nrt(nrt(name, topo, policy=rnd.choice(POLICIES), reserved="0",
                         busy=",".join(map(str, busy)), labels=labels))


def _scan_groups(store: NodeStore, pod: Mapping[str, Any]) -> tuple[int, set[Any], set[Any]]:
    nodes = store.candidates(pod)
    return len(nodes), {n.shape_key for n in nodes}, {n.state_key for n in nodes}


def _index_groups(store: NodeStore, pod: Mapping[str, Any]) -> tuple[int, set[Any], set[Any]]:
    count, groups = store.candidate_groups(pod)
    states = [n for g in groups for n in g.states()]
    assert len(states) == len({n.state_key for n in states}), "a state listed twice"
    for g in groups:  # most free CPUs first
        free = [n.total_available for n in g.states()]
        assert free == sorted(free, reverse=True)
    candidates = {n.name for n in store.candidates(pod)}
    assert all(n.name in candidates for n in states), "a representative that is not a candidate"
    return count, {g.node.shape_key for g in groups}, {n.state_key for n in states}


def _pod_spec(rnd: random.Random, names: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    r = rnd.random()
    if r < 0.2 and names:
        spec["nodeName"] = rnd.choice([*names, "unknown-node"])
    elif r < 0.7:
        spec["nodeSelector"] = rnd.choice(({"pool": "a"}, {"zone": "z2"}, {"pool": "b", "zone": "z1"},
                                           {"pool": "c"}, {"kubernetes.io/hostname": rnd.choice(names or ["x"])}))
    return {"spec": spec}


@pytest.mark.parametrize("seed", range(6))
def test_index_equals_scan_after_random_changes(seed: int) -> None:
    rnd = random.Random(seed)
    store = NodeStore()
    names = [f"n{i}" for i in range(40)]
    for step in range(400):
        op = rnd.random()
        name = rnd.choice(names)
        if op < 0.45:
            store.put(_random_node(rnd, name))
        elif op < 0.6:
            store.delete(name)
        elif op < 0.75:
            store.put_labels(name, {"pool": rnd.choice(("a", "b")), "zone": rnd.choice(("z1", "z2"))})
        elif op < 0.82:
            store.delete_labels(name)
        elif op < 0.86:
            store.replace_labels({n: {"pool": "a"} for n in rnd.sample(names, 10)})
        elif op < 0.88:
            store.replace([_random_node(rnd, n) for n in rnd.sample(names, 15)], {})
        known = store.names()
        for _ in range(3):
            pod = _pod_spec(rnd, known)
            assert _index_groups(store, pod) == _scan_groups(store, pod), (step, pod)


def _scan_feasibility(store: NodeStore, pod: Mapping[str, Any], info: PodInfo, sim: Simulator) -> tuple[bool, bool]:
    nodes = store.candidates(pod)
    ever = [n for n in nodes if sim.admit(n, info, occupied=False).admitted]
    return bool(ever), any(sim.admit(n, info, occupied=True).admitted for n in ever)


@pytest.mark.parametrize("seed", range(3))
def test_verdicts_through_the_index_equal_a_scan(seed: int) -> None:
    rnd = random.Random(100 + seed)
    store = NodeStore()
    for i in range(30):
        store.put(_random_node(rnd, f"n{i}"))
    sim = Simulator()
    for _ in range(40):
        cpus = rnd.choice((1, 2, 4, 6, 9, 12))
        res = {"cpu": str(cpus), "memory": "1Gi"}
        pod = {"metadata": {"name": "p", "namespace": "d", "uid": "u",
                            "annotations": {"qos.gocrane.io/cpu-manager": "exclusive"}},
               "spec": {**_pod_spec(rnd, store.names())["spec"],
                        "containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]}}
        info = PodInfo.from_pod(pod)
        count, groups = store.candidate_groups(pod)
        f = feasibility(count, groups, info, sim)
        assert f is not None
        assert (f.ever, f.now) == (_scan_feasibility(store, pod, info, sim) if count else (False, False))
        assert f.candidates == len(store.candidates(pod))
        cached = feasibility(count, groups, info, sim, cached_only=True)
        assert cached is not None and (cached.ever, cached.now) == (f.ever, f.now)
