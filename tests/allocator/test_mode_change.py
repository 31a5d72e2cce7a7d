"""Changing a running pod's CPU mode (allocator.mode_change through NodeAllocator.change_mode): every transition,
topology-manager refusals that change nothing, the new mode surviving a container restart and the checkpoint."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import CheckpointStore, CPUSet, NodeAllocator, NodeConfig, Topology
from allocator.checkpoint import parse_checkpoint, serialize_checkpoint
from allocator.errors import CheckpointError, PodSpecError
from allocator.mode_change import parse_target, with_pod_mode
from allocator.pod import PodInfo, container_mode, guaranteed_cpus
from tests.fixtures.make_sysfs import MACHINES, build

S = CPUSet.parse


@pytest.fixture(scope="module")
def e5(tmp_path_factory) -> Topology:
    return Topology.from_sysfs(build(MACHINES["e5-2680v3"], tmp_path_factory.mktemp("e5")))


def node(topo: Topology, policy: str = "none", scope: str = "container") -> NodeAllocator:
    return NodeAllocator(NodeConfig(topology=topo, reserved_cpus=S("0,24"), topology_manager_policy=policy,
                                    topology_manager_scope=scope))


def ctr(name: str, cpu: str, request: str | None = None, restart: str | None = None) -> dict:
    c: dict = {"name": name, "resources": {"limits": {"cpu": cpu, "memory": "1Gi"},
                                           "requests": {"cpu": request or cpu, "memory": "1Gi"}}}
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(name: str, *containers: dict, mode: str | None = None, init: tuple[dict, ...] = ()) -> PodInfo:
    meta: dict = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if mode is not None:
        meta["annotations"] = {"qos.gocrane.io/cpu-manager": mode}
    spec: dict = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return PodInfo.from_pod({"metadata": meta, "spec": spec})


def check_invariants(alloc: NodeAllocator) -> None:
    """The state is one kubelet would load; exclusive CPUs are in no shared pool; share CPUs are."""
    probe = alloc.state.copy()
    alloc.policy.start(probe)
    pool = alloc.shared_pool()
    for uid, containers in alloc.state.assignments.items():
        for name, cpus in containers.items():
            if alloc.state.mode(uid, name) == "exclusive":
                assert not cpus & pool, (uid, name, cpus, pool)
            else:
                assert cpus <= pool
    for uid_a, ca in alloc.state.assignments.items():
        for uid_b, cb in alloc.state.assignments.items():
            if uid_a < uid_b:
                for x in ca.values():
                    for y in cb.values():
                        assert not x & y


def test_targets_are_parsed() -> None:
    assert parse_target(" Share ") == "share"
    assert parse_target(None) == parse_target("") == parse_target("default") == "kubelet"
    with pytest.raises(PodSpecError, match="allowed values are none, exclusive, share"):
        parse_target("shared")


def test_every_transition_between_the_modes(e5: Topology) -> None:
    alloc = node(e5)
    p = pod("db", ctr("a", "2"), ctr("b", "3"), mode="none")
    assert alloc.admit_pod(p).admitted
    full = alloc.shared_pool()
    assert alloc.state.assignments == {}

    ch = alloc.change_mode(p, "exclusive")  # none -> exclusive
    assert (ch.admitted, ch.old, ch.new, ch.narrows_pool) == (True, "none", "exclusive", True)
    a, b = alloc.container_cpus(p.uid, "a"), alloc.container_cpus(p.uid, "b")
    assert a is not None and b is not None and (len(a), len(b)) == (2, 3)
    assert alloc.shared_pool() == full - a - b
    assert {m.name: (m.old_mode, m.new_mode) for m in ch.moves} == {"a": ("shared", "exclusive"),
                                                                    "b": ("shared", "exclusive")}
    check_invariants(alloc)

    ch = alloc.change_mode(p, "share")  # exclusive -> share: the same CPUs, back in the pool
    assert (ch.admitted, ch.old, ch.new, ch.narrows_pool) == (True, "exclusive", "share", False)
    assert (alloc.container_cpus(p.uid, "a"), alloc.container_cpus(p.uid, "b")) == (a, b)
    assert alloc.shared_pool() == full
    check_invariants(alloc)

    ch = alloc.change_mode(p, "exclusive")  # share -> exclusive: the same CPUs, out of the pool
    assert ch.narrows_pool and (alloc.container_cpus(p.uid, "a"), alloc.container_cpus(p.uid, "b")) == (a, b)
    assert alloc.shared_pool() == full - a - b

    ch = alloc.change_mode(p, "none")  # exclusive -> none: released
    assert ch.admitted and alloc.state.assignments == {} and alloc.shared_pool() == full
    assert alloc.pod_mode(p.uid) == "none"

    ch = alloc.change_mode(p, "share")  # none -> share
    assert ch.admitted and len(alloc.container_cpus(p.uid, "a") or ()) == 2
    assert alloc.shared_pool() == full
    ch = alloc.change_mode(p, "none")  # share -> none
    assert ch.admitted and alloc.state.assignments == {}
    check_invariants(alloc)


def test_removing_the_annotation_goes_back_to_kubelets_rule(e5: Topology) -> None:
    alloc = node(e5)
    guaranteed = pod("g", ctr("app", "4"))           # kubelet pins it
    burstable = pod("b", ctr("app", "4", request="2"), mode="exclusive")  # not eligible anywhere
    assert alloc.admit_pod(guaranteed).admitted
    own = alloc.container_cpus(guaranteed.uid, "app")
    assert own is not None and len(own) == 4
    assert alloc.change_mode(guaranteed, "none").admitted and alloc.container_cpus(guaranteed.uid, "app") is None
    ch = alloc.change_mode(guaranteed, None)
    assert (ch.old, ch.new) == ("none", "kubelet")
    assert len(alloc.container_cpus(guaranteed.uid, "app") or ()) == 4
    assert alloc.state.mode(guaranteed.uid, "app") == "exclusive"
    ch = alloc.change_mode(burstable, "kubelet")
    assert ch.admitted and ch.changed and not any(m.moved for m in ch.moves)
    assert alloc.state.get(burstable.uid, "app") is None


def test_a_transition_to_the_current_mode_changes_no_cpu(e5: Topology) -> None:
    alloc = node(e5)
    p = pod("same", ctr("app", "2"), mode="exclusive")
    alloc.admit_pod(p)
    before = alloc.state.copy()
    ch = alloc.change_mode(p, "exclusive")
    assert ch.admitted and not any(m.moved for m in ch.moves)
    assert alloc.state.assignments == before.assignments and alloc.state.default_cpuset == before.default_cpuset


def test_refused_under_single_numa_node_changes_nothing(e5: Topology) -> None:
    alloc = node(e5, policy="single-numa-node")
    # each NUMA node has 24 CPUs, 1 of them reserved: 23 allocatable; leave 10 free on each
    for i, n in enumerate((13, 13)):
        assert alloc.admit_pod(pod(f"fill{i}", ctr("app", str(n)), mode="exclusive")).admitted
    assert max(alloc.free_cpus_per_numa().values()) < 12
    p = pod("big", ctr("app", "12"), mode="none")
    assert alloc.admit_pod(p).admitted
    before = alloc.state.copy()
    ch = alloc.change_mode(p, "exclusive")
    assert not ch.admitted and ch.reason == "TopologyAffinityError"
    assert "Resources cannot be allocated with Topology locality" in ch.message
    assert "policy single-numa-node" in ch.message and "mode none -> exclusive" in ch.message
    assert "keeps running as it was" in ch.message
    assert alloc.state == before and alloc.pod_mode(p.uid) is None
    # a smaller one fits
    small = pod("small", ctr("app", "8"), mode="none")
    alloc.admit_pod(small)
    assert alloc.change_mode(small, "exclusive").admitted
    check_invariants(alloc)


def test_refused_when_cpus_run_out(e5: Topology) -> None:
    alloc = node(e5)
    assert alloc.admit_pod(pod("fill", ctr("app", "44"), mode="exclusive")).admitted
    p = pod("late", ctr("app", "4"), mode="none")
    before = alloc.state.copy()
    ch = alloc.change_mode(p, "share")
    assert not ch.admitted and ch.reason == "UnexpectedAdmissionError"
    assert alloc.state == before


def test_smt_alignment_is_applied(e5: Topology) -> None:
    alloc = NodeAllocator(NodeConfig(topology=e5, reserved_cpus=S("0,24"),
                                     cpu_manager_policy_options={"full-pcpus-only": "true"}))
    p = pod("odd", ctr("app", "3"), mode="none")
    ch = alloc.change_mode(p, "exclusive")
    assert not ch.admitted and ch.reason == "SMTAlignmentError"


def test_a_restarted_container_gets_the_new_mode(e5: Topology) -> None:
    alloc = node(e5)
    created = pod("web", ctr("app", "2"), mode="exclusive")  # what the sandbox says forever
    alloc.admit_pod(created)
    assert alloc.change_mode(created, "none").admitted
    alloc.release_container(created.uid, "app")  # the container exits and is removed
    d = alloc.admit_pod(created)                   # kubelet creates it again from the sandbox's intent
    assert d.admitted and d.container("app").mode == "shared" and alloc.state.assignments == {}
    assert with_pod_mode(created, alloc.state).cpu_manager == "none"
    assert alloc.change_mode(created, "share").admitted
    alloc.release_container(created.uid, "app")
    assert alloc.admit_pod(created).container("app").mode == "share"


def test_released_pod_forgets_its_mode(e5: Topology) -> None:
    alloc = node(e5)
    p = pod("gone", ctr("app", "2"), mode="none")
    alloc.change_mode(p, "exclusive")
    alloc.release_pod(p.uid)
    assert alloc.pod_mode(p.uid) is None and alloc.state.assignments == {}


def test_init_containers_are_not_admitted_again(e5: Topology) -> None:
    alloc = node(e5)
    p = pod("init", ctr("app", "2"), mode="none", init=(ctr("setup", "4"), ctr("side", "1", restart="Always")))
    ch = alloc.change_mode(p, "exclusive")
    assert ch.admitted
    assert alloc.state.get(p.uid, "setup") is None  # completed: nothing allocated for it
    assert len(alloc.state.get(p.uid, "side") or ()) == 1 and len(alloc.state.get(p.uid, "app") or ()) == 2
    # a pod admitted with its init container keeps the init container's CPUs under share, gives them back under none
    q = pod("init2", ctr("app", "2"), mode="exclusive", init=(ctr("setup", "4"),))
    alloc.admit_pod(q)
    setup = alloc.state.get(q.uid, "setup")
    assert setup is not None
    assert alloc.change_mode(q, "share").admitted and alloc.state.mode(q.uid, "setup") == "share"
    assert alloc.change_mode(q, "none").admitted and q.uid not in alloc.state.assignments
    check_invariants(alloc)


def test_bypassed_pods_are_refused(e5: Topology) -> None:
    alloc = node(e5)
    p = PodInfo.from_pod({"metadata": {"name": "x", "namespace": "d", "uid": "u-x",
                                       "annotations": {"numapin.io/bypass": "true"}},
                          "spec": {"containers": [ctr("app", "2")]}})
    ch = alloc.change_mode(p, "exclusive")
    assert not ch.admitted and ch.reason == "Bypassed" and alloc.state.assignments == {}


def test_dry_run_changes_nothing(e5: Topology) -> None:
    alloc = node(e5)
    p = pod("dry", ctr("app", "2"), mode="none")
    before = alloc.state.copy()
    assert alloc.change_mode(p, "exclusive", dry_run=True).admitted
    assert alloc.state == before


# -- checkpoint -------------------------------------------------------------------------------------------------


def test_checkpoint_keeps_pod_modes_and_stays_kubelet_readable(e5: Topology, tmp_path) -> None:
    alloc = node(e5)
    p = pod("keep", ctr("app", "2"), mode="none")
    q = pod("plain", ctr("app", "2"), mode="exclusive")
    alloc.admit_pod(q)
    untouched = serialize_checkpoint(alloc.state, "numapin")
    assert b"podModes" not in untouched  # no transition: the file earlier numapin versions wrote
    alloc.change_mode(p, "share")
    store = CheckpointStore(tmp_path / "state", "numapin")
    store.save(alloc.state)
    doc = json.loads((tmp_path / "state").read_bytes())
    assert doc["numapin"]["podModes"] == {p.uid: "share"}
    # kubelet's part (and its checksum) is unchanged by numapin's extra keys
    kubelet_only = {k: v for k, v in doc.items() if k != "numapin"}
    cp = parse_checkpoint(json.dumps(kubelet_only))
    assert cp.entries[p.uid]["app"] == alloc.container_cpus(p.uid, "app")
    loaded = store.load()
    assert loaded is not None and loaded.pod_modes == {p.uid: "share"} and loaded == alloc.state
    again = NodeAllocator(alloc.config, loaded)
    assert again.pod_mode(p.uid) == "share"
    assert again.admit_pod(p).container("app").mode == "share"


@pytest.mark.parametrize("edit", ["value", "checksum", "mode"])
def test_a_tampered_pod_mode_is_refused(e5: Topology, tmp_path, edit: str) -> None:
    alloc = node(e5)
    p = pod("t", ctr("app", "2"), mode="none")
    alloc.change_mode(p, "exclusive")
    path = tmp_path / "state"
    CheckpointStore(path, "numapin").save(alloc.state)
    doc = json.loads(path.read_bytes())
    if edit == "value":
        doc["numapin"]["podModes"][p.uid] = "share"
    elif edit == "checksum":
        doc["numapin"]["podModesChecksum"] += 1
    else:
        doc["numapin"]["podModes"][p.uid] = "turbo"
        from allocator.checkpoint import _extra_checksum
        doc["numapin"]["podModesChecksum"] = _extra_checksum(doc["numapin"]["podModes"])
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="podModes"):
        CheckpointStore(path, "numapin").load()


# -- property: random admissions, transitions and releases keep the state valid -------------------------------

_MODES = ("none", "exclusive", "share", "kubelet")


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_random_transitions_keep_the_state_valid(e5: Topology, data: st.DataObject) -> None:
    policy = data.draw(st.sampled_from(("none", "best-effort", "restricted", "single-numa-node")))
    scope = data.draw(st.sampled_from(("container", "pod")))
    alloc = node(e5, policy=policy, scope=scope)
    pods: dict[str, PodInfo] = {}
    for step in range(data.draw(st.integers(1, 25))):
        action = data.draw(st.sampled_from(("admit", "change", "change", "release")))
        if action == "admit" or not pods:
            n = len(pods)
            cpus = data.draw(st.lists(st.integers(1, 8), min_size=1, max_size=3))
            mode = data.draw(st.sampled_from((None, "none", "exclusive", "share")))
            p = pod(f"p{step}", *(ctr(f"c{i}", str(c)) for i, c in enumerate(cpus)), mode=mode)
            if alloc.admit_pod(p).admitted:
                pods[p.uid] = p
            assert len(pods) >= n
        elif action == "change":
            p = pods[data.draw(st.sampled_from(sorted(pods)))]
            target = data.draw(st.sampled_from(_MODES))
            before = alloc.state.copy()
            ch = alloc.change_mode(p, target)
            if not ch.admitted:
                assert alloc.state == before
                assert ch.reason in ("TopologyAffinityError", "SMTAlignmentError", "UnexpectedAdmissionError")
            else:
                assert alloc.pod_mode(p.uid) == target
        else:
            uid = data.draw(st.sampled_from(sorted(pods)))
            alloc.release_pod(uid)
            del pods[uid]
        check_invariants(alloc)
        for p in pods.values():  # every pinned container has what its effective mode asks
            eff = with_pod_mode(p, alloc.state)
            for c in eff.containers:
                own = alloc.state.get(p.uid, c.name)
                if own is not None:
                    assert len(own) == guaranteed_cpus(eff, c)
                    assert alloc.state.mode(p.uid, c.name) == container_mode(eff, c)
                else:
                    assert guaranteed_cpus(eff, c) == 0
