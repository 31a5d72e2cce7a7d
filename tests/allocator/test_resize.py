"""In-place CPU resize of a running container (allocator.resize through NodeAllocator.resize_container): growth
under each topology-manager policy and full-pcpus-only, shrink order and baselines, fractional <-> integer moves,
Crane's modes, pod scope, refusals that change nothing, baselines in the checkpoint and across re-creation, and a
seeded random sequence of creates, resizes and removals against the allocator's invariants."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import pytest
from hypothesis import event, given, seed, settings
from hypothesis import strategies as st

from allocator import CheckpointStore, CPUSet, NodeAllocator, NodeConfig, ResizeOutcome, Topology
from allocator.checkpoint import _extra_checksum, checksum_ok, parse_checkpoint, serialize_checkpoint
from allocator.errors import CheckpointError, PodSpecError
from allocator.mode_change import with_pod_mode
from allocator.pod import PodInfo, guaranteed_cpus
from tests.topologies import build, sixteen_numa

S = CPUSet.parse
RESERVED = S("7,15")


def four_numa() -> Topology:
    """4 NUMA nodes (2 per socket) x 2 cores x 2 threads: node n holds CPUs 2n, 2n+1, 2n+8, 2n+9 (core c = CPUs c
    and c+8). NUMA node 0 is close to node 3 (12) and far from 1 and 2 (30); node 1 is close to node 2."""
    distances = {0: (10, 30, 30, 12), 1: (30, 10, 12, 30), 2: (30, 12, 10, 30), 3: (12, 30, 30, 10)}
    rows = [(t * 8 + c, c, c // 4, c // 2, 0) for t in range(2) for c in range(8)]
    return build(rows, numa_nodes=range(4), distances=distances)


TOPO = four_numa()


def node(policy: str = "none", scope: str = "container", *, full: bool = False, closest: bool = False,
         topology: Topology = TOPO, reserved: CPUSet = RESERVED) -> NodeAllocator:
    """The four-NUMA machine with CPUs 7 and 15 (core 7, NUMA node 3) reserved, unless told otherwise."""
    return NodeAllocator(NodeConfig(
        topology=topology, reserved_cpus=reserved, topology_manager_policy=policy, topology_manager_scope=scope,
        cpu_manager_policy_options={"full-pcpus-only": "true"} if full else {},
        topology_manager_policy_options={"prefer-closest-numa-nodes": "true"} if closest else {},
    ))


def pod(name: str, *containers: tuple[str, str] | tuple[str, str, str], mode: str | None = None,
        bypass: bool = False) -> PodInfo:
    """A pod of ``(name, cpu limit[, cpu request])`` containers (1Gi of memory each): Guaranteed unless a request
    differs from its limit."""
    meta: dict = {"name": name, "namespace": "default", "uid": f"uid-{name}", "annotations": {}}
    if mode is not None:
        meta["annotations"]["qos.gocrane.io/cpu-manager"] = mode
    if bypass:
        meta["annotations"]["numapin.io/bypass"] = "true"
    spec = [{"name": c[0], "resources": {"limits": {"cpu": c[1], "memory": "1Gi"},
                                          "requests": {"cpu": c[2] if len(c) > 2 else c[1], "memory": "1Gi"}}}
            for c in containers]
    return PodInfo.from_pod({"metadata": meta, "spec": {"containers": spec}})


def exclusive_cpus(alloc: NodeAllocator) -> CPUSet:
    m = 0
    for uid, containers in alloc.state.assignments.items():
        for name, cpus in containers.items():
            if alloc.state.mode(uid, name) == "exclusive":
                m |= cpus.mask
    return CPUSet.from_mask(m)


def check_invariants(alloc: NodeAllocator) -> None:
    """A state kubelet would load (pool and assignments cover the machine, nothing assigned twice across pods,
    baselines inside their containers' CPUs), exclusive CPUs out of the pool and the reserved ones, the pool and
    the exclusive CPUs together every non-reserved CPU."""
    probe = alloc.state.copy()
    alloc.policy.start(probe)
    pool = alloc.shared_pool()
    excl = exclusive_cpus(alloc)
    assert not excl & pool
    assert not alloc.state.assigned_cpus() & alloc.reserved_cpus
    assert (pool | excl) >= alloc.topology.all_cpus - alloc.reserved_cpus
    pods = list(alloc.state.assignments.items())
    for i, (_, a) in enumerate(pods):
        for _, b in pods[i + 1:]:
            assert not CPUSet.from_mask(_mask(a.values())) & CPUSet.from_mask(_mask(b.values()))
    for uid, containers in alloc.state.assignments.items():
        for name, cpus in containers.items():
            base = alloc.baseline_cpus(uid, name)
            assert base is not None and base <= cpus
            if alloc.policy.options.full_pcpus_only:
                assert alloc.topology.core_siblings(cpus) == cpus, (name, cpus)


def _mask(sets: Iterable[CPUSet]) -> int:
    m = 0
    for s in sets:
        m |= s.mask
    return m


def saved(alloc: NodeAllocator) -> bytes:
    return serialize_checkpoint(alloc.state, "numapin")


def resize(alloc: NodeAllocator, p: PodInfo, name: str) -> ResizeOutcome:
    """Resize and check what every resize must keep: a refusal changes nothing (the state file byte for byte),
    an admitted growth keeps every CPU, a shrink keeps only CPUs it had, and the invariants hold."""
    before, held = saved(alloc), alloc.container_cpus(p.uid, name)
    out = alloc.resize_container(p, name)
    if not out.admitted:
        assert saved(alloc) == before
        assert (out.cpus_after, out.pool_after, out.mode_after) == (out.cpus_before, out.pool_before, out.mode_before)
        assert out.reason in ("TopologyAffinityError", "SMTAlignmentError", "UnexpectedAdmissionError")
    else:
        now = alloc.container_cpus(p.uid, name)
        eff = with_pod_mode(p, alloc.state)
        n = guaranteed_cpus(eff, eff.container(name)) if not p.bypass else len(held or ())
        assert len(now or ()) == n
        if held is not None and now is not None:
            assert held <= now or now <= held
        assert out.pool_after == alloc.shared_pool()
        assert out.mems_after == alloc.topology.numa_of(out.cpus_after)
    check_invariants(alloc)
    return out


# -- growth ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grow:
    """Admit ``others`` pods first, then pod p with container c of ``start`` CPUs, then resize c to ``to``."""

    id: str
    policy: str
    start: str
    to: str
    admitted_with: str  # c's CPUs after admission (checks the scene)
    after: str | None  # c's CPUs after the resize; None: refused
    reason: str | None = None
    others: tuple[str, ...] = ()
    full: bool = False
    closest: bool = False
    words: tuple[str, ...] = ()  # in the message


GROW = [
    # the container's own cores, then its NUMA node: same under every policy
    *(Grow(f"{pol}-within-its-node", pol, "2", "4", "0,8", "0-1,8-9") for pol in
      ("best-effort", "restricted", "single-numa-node")),
    Grow("none-within-its-node", "none", "2", "4", "6,14", "4,6,12,14"),  # kubelet's policy none packs node 3 first
    Grow("best-effort-sibling-first", "best-effort", "1", "2", "0", "0,8"),
    Grow("restricted-sibling-first", "restricted", "3", "4", "0-1,8", "0-1,8-9"),
    # beyond one node: the lowest node pair that holds its node, or by distance
    Grow("best-effort-two-nodes", "best-effort", "2", "6", "0,8", "0-2,8-10"),
    Grow("restricted-two-nodes-preferred", "restricted", "2", "6", "0,8", "0-2,8-10"),
    Grow("best-effort-closest", "best-effort", "2", "6", "0,8", "0-1,6,8-9,14", closest=True),
    Grow("restricted-closest", "restricted", "2", "6", "0,8", "0-1,6,8-9,14", closest=True),
    Grow("single-numa-node-cannot-leave-its-node", "single-numa-node", "2", "6", "0,8", None,
         "TopologyAffinityError", words=("Resources cannot be allocated with Topology locality",
                                         "single-numa-node", "from 2 to 6", "its CPUs 0,8 on NUMA node(s) 0",
                                         "{0: 2, 1: 4, 2: 4, 3: 2}", "keeps running as it was")),
    Grow("single-numa-node-refused-when-its-node-is-full", "single-numa-node", "2", "3", "3,11", None,
         "TopologyAffinityError", others=("4", "2")),
    # restricted refuses a non-preferred result (3 nodes where 2 would do on an empty machine); best-effort takes it
    Grow("restricted-non-preferred-refused", "restricted", "4", "8", "4-5,12-13", None, "TopologyAffinityError",
         others=("4", "2"), words=("restricted", "from 4 to 8", "{0: 0, 1: 2, 2: 0, 3: 2}")),
    Grow("best-effort-non-preferred-admitted", "best-effort", "4", "8", "4-5,12-13", "3-6,11-14",
         others=("4", "2")),
    # full-pcpus-only: whole cores, kubelet's SMT wording
    Grow("full-pcpus-whole-cores", "restricted", "2", "4", "0,8", "0-1,8-9", full=True),
    Grow("full-pcpus-odd-size", "best-effort", "2", "3", "0,8", None, "SMTAlignmentError", full=True,
         words=("SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2",
                "cpuManagerPolicyOptions full-pcpus-only")),
    Grow("full-pcpus-no-free-cores", "best-effort", "2", "6", "5,13", None, "SMTAlignmentError",
         others=("4", "4", "2"), full=True,
         words=("not enough free physical CPUs: available physical CPUs = 4, requested CPUs = 6",)),
    Grow("full-pcpus-single-numa-node", "single-numa-node", "2", "6", "0,8", None, "TopologyAffinityError",
         full=True),
    Grow("none-anywhere-when-its-node-is-full", "none", "2", "4", "6,14", "4,6,12,14"),
    Grow("not-enough-cpus", "best-effort", "2", "16", "0,8", None, "UnexpectedAdmissionError",
         words=("Allocate failed due to", "which is unexpected")),
]


@pytest.mark.parametrize("case", GROW, ids=[c.id for c in GROW])
def test_growth(case: Grow) -> None:
    alloc = node(case.policy, full=case.full, closest=case.closest)
    for i, size in enumerate(case.others):
        assert alloc.admit_pod(pod(f"o{i}", ("c", size))).admitted
    assert alloc.admit_pod(pod("p", ("c", case.start))).container("c").cpus == S(case.admitted_with)
    out = resize(alloc, pod("p", ("c", case.to)), "c")
    assert (out.admitted, out.reason) == (case.after is not None, case.reason), out.message
    assert alloc.container_cpus("uid-p", "c") == S(case.after or case.admitted_with)
    assert alloc.baseline_cpus("uid-p", "c") == S(case.admitted_with)  # the admitted-with set, either way
    for w in case.words:
        assert w in out.message, (w, out.message)
    if out.admitted:
        assert out.changed and out.mode_before == out.mode_after == "exclusive"
        assert out.pool_after == out.pool_before - (S(case.after or "") - S(case.admitted_with))


def test_growth_keeps_its_cpus_and_its_numa_node_first_on_a_busy_machine() -> None:
    alloc = node("best-effort")
    assert alloc.admit_pod(pod("p", ("c", "1"))).container("c").cpus == S("0")
    assert alloc.admit_pod(pod("q", ("c", "1"))).container("c").cpus == S("8")  # takes c's sibling
    out = resize(alloc, pod("p", ("c", "3")), "c")
    assert out.cpus_after == S("0-1,9")  # its node before any other


def test_growth_under_distribute_cpus_across_cores_spreads_over_cores() -> None:
    alloc = NodeAllocator(NodeConfig(topology=TOPO, reserved_cpus=RESERVED, topology_manager_policy="best-effort",
                                     cpu_manager_policy_options={"distribute-cpus-across-cores": "true"}))
    assert alloc.admit_pod(pod("p", ("c", "1"))).container("c").cpus == S("0")
    out = resize(alloc, pod("p", ("c", "2")), "c")
    assert out.cpus_after == S("0-1")  # not 0's sibling 8: the option spreads over cores


# -- shrink ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shrink:
    """Admit p's container c with ``start`` CPUs, apply the resizes ``steps`` (sizes), check its CPUs after each."""

    id: str
    policy: str
    start: str
    steps: tuple[tuple[str, str, str], ...]  # (size, CPUs after, baseline after)
    full: bool = False


SHRINK = [
    *(Shrink(f"{pol}-grown-cpus-go-first", pol, "2",
             (("6", "0-2,8-10", "0,8"), ("4", "0-1,8-9", "0,8"), ("3", "0-1,8", "0,8"), ("2", "0,8", "0,8")))
      for pol in ("best-effort", "restricted")),
    Shrink("single-numa-node-grown-cpus-go-first", "single-numa-node", "1",
           (("4", "0-1,8-9", "0"), ("1", "0", "0"))),
    # below the baseline: numapin allows it (KEP-5554 refuses): a partly held core goes first, then whole cores
    Shrink("below-baseline", "restricted", "4", (("3", "0-1,8", "0-1,8"), ("2", "0,8", "0,8"), ("1", "0", "0"))),
    Shrink("below-baseline-after-growth", "best-effort", "4",
           (("6", "0-2,8-10", "0-1,8-9"), ("2", "0,8", "0,8"))),
    Shrink("none-policy", "none", "2", (("4", "4,6,12,14", "6,14"), ("2", "6,14", "6,14"))),
    Shrink("full-pcpus-only-whole-cores", "restricted", "2",
           (("6", "0-2,8-10", "0,8"), ("4", "0-1,8-9", "0,8"), ("2", "0,8", "0,8")), full=True),
]


@pytest.mark.parametrize("case", SHRINK, ids=[c.id for c in SHRINK])
def test_shrink(case: Shrink) -> None:
    alloc = node(case.policy, full=case.full)
    alloc.admit_pod(pod("p", ("c", case.start)))
    for size, cpus, base in case.steps:
        out = resize(alloc, pod("p", ("c", size)), "c")
        assert out.admitted, out.message
        assert (alloc.container_cpus("uid-p", "c"), alloc.baseline_cpus("uid-p", "c")) == (S(cpus), S(base)), size


def test_shrink_under_full_pcpus_only_keeps_whole_cores() -> None:
    alloc = node("best-effort", full=True)
    alloc.admit_pod(pod("p", ("c", "4")))
    out = resize(alloc, pod("p", ("c", "3")), "c")
    assert (out.admitted, out.reason) == (False, "SMTAlignmentError")
    assert "requested 3 cpus not multiple cpus per core = 2" in out.message


def test_a_shrink_is_never_refused_for_topology() -> None:
    """A smaller set never widens the NUMA affinity: single-numa-node and restricted admit every shrink."""
    for pol in ("restricted", "single-numa-node"):
        alloc = node(pol)
        alloc.admit_pod(pod("p", ("c", "4")))
        for i, size in enumerate(("4", "4", "2")):
            alloc.admit_pod(pod(f"o{i}", ("c", size)))  # fill the machine
        for size in ("3", "1"):
            assert resize(alloc, pod("p", ("c", size)), "c").admitted


def test_released_cpus_a_sibling_still_holds_stay_out_of_the_pool() -> None:
    """An app container reusing its init container's CPUs (kubelet's reuse) gives back only CPUs no sibling holds."""
    alloc = node("best-effort")
    spec = {"metadata": {"name": "p", "namespace": "default", "uid": "uid-p"}, "spec": {
        "initContainers": [{"name": "init", "resources": {"limits": {"cpu": "4", "memory": "1Gi"}}}],
        "containers": [{"name": "app", "resources": {"limits": {"cpu": "4", "memory": "1Gi"}}}]}}
    p = PodInfo.from_pod(spec)
    d = alloc.admit_pod(p)
    assert d.container("init").cpus == d.container("app").cpus == S("0-1,8-9")
    pool = alloc.shared_pool()
    spec["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2"
    out = resize(alloc, PodInfo.from_pod(spec), "app")
    assert out.admitted and out.cpus_after == S("0,8")
    assert alloc.shared_pool() == pool  # 1 and 9 are still the init container's


# -- fractional <-> integer, Crane's modes, bypass -----------------------------------------------------------------


@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
@pytest.mark.parametrize("full", [False, True], ids=["any-cpus", "full-pcpus-only"])
def test_fractional_to_integer_and_back(policy: str, full: bool) -> None:
    alloc = node(policy, full=full)
    full_pool = alloc.shared_pool()
    alloc.admit_pod(pod("p", ("c", "1500m")))
    assert alloc.container_cpus("uid-p", "c") is None
    out = resize(alloc, pod("p", ("c", "2")), "c")
    assert out.admitted and (out.mode_before, out.mode_after) == ("shared", "exclusive")
    assert out.cpus_before == out.pool_before == full_pool
    assert len(out.cpus_after) == 2 and out.pool_after == full_pool - out.cpus_after
    assert alloc.baseline_cpus("uid-p", "c") == out.cpus_after
    back = resize(alloc, pod("p", ("c", "500m")), "c")
    assert back.admitted and (back.mode_before, back.mode_after) == ("exclusive", "shared")
    assert back.cpus_after == back.pool_after == full_pool
    assert "uid-p" not in alloc.state.baselines


def test_fractional_to_integer_refused_under_single_numa_node() -> None:
    alloc = node("single-numa-node")
    alloc.admit_pod(pod("p", ("c", "500m")))
    out = resize(alloc, pod("p", ("c", "5")), "c")
    assert (out.admitted, out.reason) == (False, "TopologyAffinityError")
    assert "it runs on the shared pool" in out.message and "from 0 to 5" in out.message


def test_burstable_container_stays_on_the_pool() -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2", "1")))
    out = resize(alloc, pod("p", ("c", "4", "2")), "c")
    assert out.admitted and not out.changed and out.mode_after == "shared"


@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
@pytest.mark.parametrize("full", [False, True], ids=["any-cpus", "full-pcpus-only"])
def test_share_mode_grows_and_shrinks_inside_the_pool(policy: str, full: bool) -> None:
    alloc = node(policy, full=full)
    full_pool = alloc.shared_pool()
    alloc.admit_pod(pod("p", ("c", "2"), mode="share"))
    out = resize(alloc, pod("p", ("c", "4"), mode="share"), "c")
    assert out.admitted and out.mode_after == "share" and len(out.cpus_after) == 4
    assert out.pool_before == out.pool_after == full_pool  # share CPUs stay usable by the shared containers
    assert alloc.state.default_cpuset.isdisjoint(out.cpus_after)  # and no other container gets them
    out = resize(alloc, pod("p", ("c", "2"), mode="share"), "c")
    assert out.admitted and len(out.cpus_after) == 2 and out.pool_after == full_pool
    out = resize(alloc, pod("p", ("c", "1500m"), mode="share"), "c")  # not an integer: no CPUs of its own
    assert out.admitted and out.mode_after == "shared" and out.pool_after == full_pool


def test_none_mode_never_gets_cpus() -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2"), mode="none"))
    out = resize(alloc, pod("p", ("c", "4"), mode="none"), "c")
    assert out.admitted and not out.changed and out.mode_after == "shared"


def test_a_mode_given_while_running_is_the_one_resized() -> None:
    alloc = node("restricted")
    p = pod("p", ("c", "2"), mode="none")
    alloc.admit_pod(p)
    assert alloc.change_mode(p, "exclusive").admitted
    out = resize(alloc, pod("p", ("c", "4"), mode="none"), "c")  # the sandbox still says none
    assert out.admitted and out.mode_after == "exclusive" and len(out.cpus_after) == 4


def test_bypassed_pod_is_left_alone() -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2"), bypass=True))
    out = resize(alloc, pod("p", ("c", "4"), bypass=True), "c")
    assert out.admitted and not out.changed and "bypass" in out.message


def test_unknown_container_is_a_clear_error() -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2")))
    with pytest.raises(PodSpecError, match="has no container 'x'"):
        alloc.resize_container(pod("p", ("c", "2")), "x")


def test_same_size_changes_nothing() -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2")))
    before = saved(alloc)
    out = resize(alloc, pod("p", ("c", "2")), "c")
    assert out.admitted and not out.changed and "nothing to change" in out.message
    assert saved(alloc) == before


def test_dry_run_changes_nothing() -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2")))
    before = saved(alloc)
    out = alloc.resize_container(pod("p", ("c", "4")), "c", dry_run=True)
    assert out.admitted and out.changed and len(out.cpus_after) == 4
    assert saved(alloc) == before


def test_outcome_to_dict() -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2")))
    d = resize(alloc, pod("p", ("c", "4")), "c").to_dict()
    assert d["podUID"] == "uid-p" and d["container"] == "c" and d["admitted"] and d["changed"]
    assert (d["cpusBefore"], d["cpusAfter"], d["memsAfter"]) == ("0,8", "0-1,8-9", "0")
    assert d["poolBefore"] == "1-7,9-15" and d["poolAfter"] == "2-7,10-15" and d["reason"] is None
    json.dumps(d)


# -- pod scope ---------------------------------------------------------------------------------------------------


def test_pod_scope_resizes_the_pods_set() -> None:
    """Pod a+b (2+2) fills NUMA node 0. Growing a by one: under scope container a's own 3 CPUs could fit one node,
    so two nodes are not preferred and restricted refuses; under scope pod the pod's 5 CPUs need two nodes, so the
    growth is preferred."""
    results = {}
    for scope in ("container", "pod"):
        alloc = node("restricted", scope)
        d = alloc.admit_pod(pod("p", ("a", "2"), ("b", "2")))
        assert (d.container("a").cpus, d.container("b").cpus) == (S("0,8"), S("1,9"))
        results[scope] = resize(alloc, pod("p", ("a", "3"), ("b", "2")), "a")
    assert (results["container"].admitted, results["container"].reason) == (False, "TopologyAffinityError")
    assert "scope container" in results["container"].message
    assert results["pod"].admitted and results["pod"].cpus_after == S("0,2,8")


def test_pod_scope_single_numa_node_keeps_the_pod_in_one_node() -> None:
    alloc = node("single-numa-node", "pod")
    d = alloc.admit_pod(pod("p", ("a", "1"), ("b", "1")))
    assert TOPO.numa_of(d.container("a").cpus | d.container("b").cpus) == S("0")
    assert resize(alloc, pod("p", ("a", "3"), ("b", "1")), "a").admitted  # the pod's 4: node 0 exactly
    out = resize(alloc, pod("p", ("a", "3"), ("b", "2")), "b")
    assert (out.admitted, out.reason) == (False, "TopologyAffinityError")
    assert "scope pod" in out.message


# -- state: the checkpoint, restarts and re-created containers -------------------------------------------------


def test_checkpoint_keeps_the_baseline(tmp_path) -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2")))
    path = tmp_path / "cpu_manager_state"
    store = CheckpointStore(path, "numapin")
    store.save(alloc.state)
    assert "baselines" not in json.loads(path.read_bytes())["numapin"]  # no resize: the file earlier versions wrote
    resize(alloc, pod("p", ("c", "4")), "c")
    store.save(alloc.state)
    doc = json.loads(path.read_bytes())
    assert doc["entries"] == {"uid-p": {"c": "0-1,8-9"}}
    assert doc["numapin"]["baselines"] == {"uid-p": {"c": "0,8"}}
    # kubelet's own checksum covers its fields only: still valid for kubelet's parser
    assert checksum_ok(doc["policyName"], doc["defaultCpuSet"], doc["entries"], doc["checksum"], v1=False)
    restarted = NodeAllocator(alloc.config, store.load())
    assert restarted.state == alloc.state
    assert restarted.baseline_cpus("uid-p", "c") == S("0,8")
    out = resize(restarted, pod("p", ("c", "2")), "c")  # the grown CPUs go first after a restart too
    assert out.cpus_after == S("0,8") and "uid-p" not in restarted.state.baselines
    assert parse_checkpoint(serialize_checkpoint(restarted.state, "numapin")).baselines == {}


@pytest.mark.parametrize("edit", ["checksum", "not-a-subset", "no-entry", "bad-cpus"])
def test_a_tampered_baseline_is_refused(tmp_path, edit: str) -> None:
    alloc = node("restricted")
    alloc.admit_pod(pod("p", ("c", "2")))
    resize(alloc, pod("p", ("c", "4")), "c")
    path = tmp_path / "state"
    CheckpointStore(path, "numapin").save(alloc.state)
    doc = json.loads(path.read_bytes())
    base = doc["numapin"]["baselines"]
    if edit == "checksum":
        doc["numapin"]["baselinesChecksum"] += 1
    else:
        if edit == "not-a-subset":
            base["uid-p"]["c"] = "0,2"
        elif edit == "no-entry":
            base["uid-q"] = {"c": "3"}
        else:
            base["uid-p"]["c"] = "zero"
        doc["numapin"]["baselinesChecksum"] = _extra_checksum(base)
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="baseline"):
        CheckpointStore(path, "numapin").load()


@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
@pytest.mark.parametrize("scope", ["container", "pod"])
def test_a_re_created_container_keeps_its_resized_set(policy: str, scope: str) -> None:
    """A restart (attempt+1) of a resized container looks its CPUs up: the resized set, the baseline kept."""
    alloc = node(policy, scope)
    alloc.admit_pod(pod("p", ("a", "2"), ("b", "1")))
    grown = pod("p", ("a", "3"), ("b", "1"))
    out = resize(alloc, grown, "a")
    assert out.admitted, out.message
    before = saved(alloc)
    d = alloc.admit_pod(grown, only="a")
    assert d.admitted, d.message
    assert d.container("a").cpus == out.cpus_after
    assert saved(alloc) == before


@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
@pytest.mark.parametrize("scope", ["container", "pod"])
def test_restart_container_policy_re_creation_with_a_new_size_is_resized(policy: str, scope: str) -> None:
    """resizePolicy RestartContainer: kubelet creates the container again with the new resources; it is resized
    (the same rules: its CPUs kept, the baseline known) rather than looked up with its old size."""
    alloc = node(policy, scope)
    alloc.admit_pod(pod("p", ("a", "2"), ("b", "1")))
    old = alloc.container_cpus("uid-p", "a")
    assert old is not None
    d = alloc.admit_pod(pod("p", ("a", "3"), ("b", "1")), only="a")
    assert d.admitted, d.message
    now = alloc.container_cpus("uid-p", "a")
    assert now is not None and len(now) == 3 and old <= now and d.container("a").cpus == now
    assert alloc.baseline_cpus("uid-p", "a") == old
    check_invariants(alloc)
    d = alloc.admit_pod(pod("p", ("a", "500m"), ("b", "1")), only="a")  # integer -> fractional
    assert d.admitted and d.container("a").mode == "shared" and alloc.container_cpus("uid-p", "a") is None
    check_invariants(alloc)


def test_restart_container_re_creation_refused_changes_nothing() -> None:
    alloc = node("single-numa-node")
    alloc.admit_pod(pod("p", ("a", "2")))
    before = saved(alloc)
    d = alloc.admit_pod(pod("p", ("a", "6")), only="a")
    assert (d.admitted, d.reason) == (False, "TopologyAffinityError")
    assert "from 2 to 6" in d.message
    assert saved(alloc) == before


# -- property: random creates, resizes and removals ------------------------------------------------------------

# (machine, its reserved CPUs, the sizes drawn): the small machine, and one of 16 NUMA nodes where the CPU hints
# are hint families (allocator.compact_hints)
_MACHINES = {
    "four-numa": (TOPO, RESERVED, ("500m", "1", "2", "3", "4", "6")),
    "sixteen-numa": (sixteen_numa(), S("0,64"), ("500m", "1", "2", "4", "6", "8", "12", "20")),
}


@pytest.mark.parametrize("machine", sorted(_MACHINES))
@seed(20261126)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_random_creates_resizes_and_removals_keep_the_invariants(machine: str, data: st.DataObject) -> None:
    topology, reserved, sizes_drawn = _MACHINES[machine]
    policy = data.draw(st.sampled_from(("none", "best-effort", "restricted", "single-numa-node")))
    scope = data.draw(st.sampled_from(("container", "pod")))
    full = data.draw(st.booleans())
    closest = policy in ("best-effort", "restricted") and bool(topology.numa_distances) and data.draw(st.booleans())
    alloc = node(policy, scope, full=full, closest=closest, topology=topology, reserved=reserved)
    pods: dict[str, PodInfo] = {}
    for step in range(data.draw(st.integers(1, 30))):
        action = data.draw(st.sampled_from(("create", "resize", "resize", "resize", "remove")))
        if action == "create" or not pods:
            sizes = data.draw(st.lists(st.sampled_from(sizes_drawn), min_size=1, max_size=2))
            mode = data.draw(st.sampled_from((None, None, "share")))
            p = pod(f"p{step}", *((f"c{i}", s) for i, s in enumerate(sizes)), mode=mode)
            before = saved(alloc)
            if alloc.admit_pod(p).admitted:
                pods[p.uid] = p
            else:
                assert saved(alloc) == before
        elif action == "resize":
            p = pods[data.draw(st.sampled_from(sorted(pods)))]
            i = data.draw(st.integers(0, len(p.containers) - 1))
            size = data.draw(st.sampled_from(sizes_drawn))
            sizes = [(c.name, size if j == i else f"{c.cpu_limit_milli}m") for j, c in enumerate(p.containers)]
            new = pod(p.name, *sizes, mode=p.cpu_manager)
            name = p.containers[i].name
            held, base = alloc.container_cpus(p.uid, name), alloc.baseline_cpus(p.uid, name)
            out = resize(alloc, new, name)  # checks: refusal changes nothing, sizes, invariants
            event(f"resize {out.reason or ('changed' if out.changed else 'unchanged')}")
            if out.admitted:
                pods[p.uid] = new
                now = alloc.container_cpus(p.uid, name)
                if held is not None and now is not None and len(now) >= len(held):
                    assert held <= now and base == alloc.baseline_cpus(p.uid, name)
                if held is not None and now is not None and len(now) < len(held) and base is not None:
                    # the grown CPUs go first: the baseline is kept while the new size can hold it
                    assert (base <= now) == (len(now) >= len(base))
                if policy == "single-numa-node" and scope == "container" and now is not None and held is not None:
                    assert len(topology.numa_of(now)) <= max(1, len(topology.numa_of(held)))
        else:
            uid = data.draw(st.sampled_from(sorted(pods)))
            alloc.release_pod(uid)
            del pods[uid]
        check_invariants(alloc)


def test_a_container_given_other_cpus_keeps_a_baseline_inside_them() -> None:
    alloc = node("best-effort")
    alloc.admit_pod(pod("p", ("c", "2")))
    resize(alloc, pod("p", ("c", "4")), "c")
    assert alloc.baseline_cpus("uid-p", "c") == S("0,8")
    alloc.state.set("uid-p", "c", S("0-1,8-9"))  # the same CPUs: the baseline stays
    assert alloc.baseline_cpus("uid-p", "c") == S("0,8")
    alloc.state.set("uid-p", "c", S("0-1,9"))  # other CPUs: only those of the baseline among them
    assert alloc.baseline_cpus("uid-p", "c") == S("0")
    alloc.state.delete("uid-p", "c")
    assert alloc.state.baselines == {}
