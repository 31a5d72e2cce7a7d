"""The node facade: kubelet's admission (static policy + topology manager) with numapin's modes, on generated
topologies of real machines."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import CheckpointError, CheckpointStore, CPUSet, CPUState, NodeAllocator, NodeConfig, Topology
from allocator.errors import ConfigError
from allocator.hints import TopologyHint
from allocator.node import build_node
from tests.fixtures.make_sysfs import MACHINES, build

S = CPUSet.parse
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def xeon(tmp_path_factory) -> Topology:
    return Topology.from_sysfs(build(MACHINES["xeon-6258r"], tmp_path_factory.mktemp("xeon")))


@pytest.fixture(scope="module")
def e5(tmp_path_factory) -> Topology:
    return Topology.from_sysfs(build(MACHINES["e5-2680v3"], tmp_path_factory.mktemp("e5")))


def container(name: str, cpu: str | None, memory: str = "1Gi", request_cpu: str | None = None,
              request_memory: str | None = None, restart: str | None = None) -> dict:
    limits = {"memory": memory}
    if cpu is not None:
        limits["cpu"] = cpu
    c: dict = {"name": name, "image": "pause", "resources": {"limits": limits}}
    requests = {}
    if request_cpu is not None:
        requests["cpu"] = request_cpu
    if request_memory is not None:
        requests["memory"] = request_memory
    if requests:
        c["resources"]["requests"] = requests
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(name: str, *containers: dict, init: tuple[dict, ...] = (), annotations: dict | None = None) -> dict:
    meta: dict = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = annotations
    spec: dict = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def node(topo: Topology, **kw) -> NodeAllocator:
    kw.setdefault("reserved_cpus", S("0,56") if topo.num_cpus == 112 else S("0,24"))
    return NodeAllocator(NodeConfig(topology=topo, **kw))


def test_two_cpus_get_one_core(xeon):
    n = node(xeon)
    d = n.admit_pod(pod("p", container("app", "2")))
    assert d.admitted and d.reason is None
    c = d.container("app")
    assert c.mode == "exclusive" and c.cpus == S("1,57") and c.mems == S("0") and c.affinity is None
    assert n.container_cpus("uid-p", "app") == S("1,57")
    assert n.shared_pool() == xeon.all_cpus - S("1,57")
    assert n.free_cpus_per_numa() == {0: 52, 1: 56}


def test_fractional_guaranteed_pod_runs_on_the_shared_pool(xeon):
    n = node(xeon)
    d = n.admit_pod(pod("p", container("app", "1500m")))
    assert d.admitted
    c = d.container("app")
    assert c.mode == "shared" and c.cpus == xeon.all_cpus and c.mems == S("0-1")
    assert n.state.assignments == {}


def test_whole_socket(xeon):
    n = node(xeon, topology_manager_policy="best-effort")
    c = n.admit_pod(pod("p", container("app", "56"))).container("app")
    assert c.cpus == S("28-55,84-111") and c.affinity == TopologyHint(frozenset({1}), True)
    assert c.hints["cpu"] == (TopologyHint(frozenset({1}), True), TopologyHint(frozenset({0, 1}), False))
    assert c.hints["memory"] is None


def test_hints_and_affinity_reported(xeon):
    n = node(xeon, topology_manager_policy="restricted")
    c = n.admit_pod(pod("p", container("app", "2"))).container("app")
    assert c.hints["cpu"] == (
        TopologyHint(frozenset({0}), True), TopologyHint(frozenset({1}), True), TopologyHint(frozenset({0, 1}), False)
    )
    assert c.affinity == TopologyHint(frozenset({0}), True)


def test_single_numa_node_rejects_and_leaves_no_trace(xeon):
    n = node(xeon, topology_manager_policy="single-numa-node")
    assert n.admit_pod(pod("a", container("app", "30"))).container("app").mems == S("0")
    assert n.admit_pod(pod("b", container("app", "30"))).container("app").mems == S("1")
    before = n.state.copy()
    # the first container would fit; the second cannot: the whole pod is rejected, nothing is kept
    d = n.admit_pod(pod("c", container("small", "2"), container("big", "30")))
    assert not d.admitted and d.reason == "TopologyAffinityError"
    assert d.message.startswith("Resources cannot be allocated with Topology locality")
    assert "'big'" in d.message and "single-numa-node" in d.message
    assert all(c.cpus == CPUSet() for c in d.containers)
    assert n.state == before
    # best-effort admits the same container across both NUMA nodes
    m = NodeAllocator(NodeConfig(topology=xeon, reserved_cpus=S("0,56"), topology_manager_policy="best-effort"),
                      before)
    big = m.admit_pod(pod("c", container("big", "30"))).container("big")
    assert len(big.cpus) == 30 and big.mems == S("0-1")


def test_pod_scope_keeps_the_pod_on_one_numa_node(xeon):
    n = node(xeon, topology_manager_policy="single-numa-node", topology_manager_scope="pod")
    d = n.admit_pod(pod("p", container("a", "20"), container("b", "20")))
    assert d.admitted
    assert d.container("a").affinity == d.container("b").affinity == TopologyHint(frozenset({0}), True)
    assert (d.container("a").cpus | d.container("b").cpus) <= xeon.cpus_in_numa(0)
    # 60 CPUs for the pod cannot fit one NUMA node even though each container could
    d = n.admit_pod(pod("q", container("a", "30"), container("b", "30")))
    assert not d.admitted and d.reason == "TopologyAffinityError"


def test_smt_alignment_error(xeon):
    n = node(xeon, cpu_manager_policy_options={"full-pcpus-only": "true"})
    d = n.admit_pod(pod("p", container("app", "3")))
    assert not d.admitted and d.reason == "SMTAlignmentError"
    assert "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2" in d.message
    assert n.state.assignments == {}


def test_unexpected_admission_error(xeon):
    n = node(xeon)
    d = n.admit_pod(pod("p", container("app", "111")))
    assert not d.admitted and d.reason == "UnexpectedAdmissionError"
    assert d.message.startswith("Allocate failed due to") and "which is unexpected" in d.message


def test_dry_run_and_idempotence(xeon):
    n = node(xeon)
    p = pod("p", container("app", "4"))
    d = n.admit_pod(p, dry_run=True)
    assert d.admitted and d.container("app").cpus == S("1-2,57-58")
    assert n.state.assignments == {}
    first = n.admit_pod(p)
    state = n.state.copy()
    again = n.admit_pod(p)
    assert again == first and n.state == state


def test_release(xeon):
    n = node(xeon)
    n.admit_pod(pod("p", container("a", "2"), container("b", "4")))
    assert n.release_container("uid-p", "a") == S("1,57")
    assert n.container_cpus("uid-p", "a") is None
    assert n.release_pod("uid-p") == S("2-3,58-59")
    assert n.state.default_cpuset == xeon.all_cpus and n.state.assignments == {}
    assert n.release_pod("uid-p") == CPUSet()


def test_init_container_cpus_pass_to_the_app(xeon):
    n = node(xeon)
    d = n.admit_pod(pod("p", container("app", "4"), init=(container("setup", "4"),)))
    assert d.admitted
    assert d.container("setup").cpus == d.container("app").cpus == S("1-2,57-58")


def test_crane_modes(xeon):
    n = node(xeon)
    share = n.admit_pod(pod("s", container("app", "4", request_memory="512Mi"),
                            annotations={"qos.gocrane.io/cpu-manager": "share"})).container("app")
    excl = n.admit_pod(pod("e", container("app", "4", request_memory="512Mi"),
                           annotations={"qos.gocrane.io/cpu-manager": "exclusive"})).container("app")
    assert share.mode == "share" and share.cpus == S("1-2,57-58")
    assert excl.mode == "exclusive" and excl.cpus == S("3-4,59-60")
    assert n.shared_pool() == xeon.all_cpus - excl.cpus
    be = n.admit_pod(pod("b", {"name": "app", "image": "pause"})).container("app")
    assert be.mode == "shared" and be.cpus == xeon.all_cpus - excl.cpus
    none = n.admit_pod(pod("n", container("app", "2"), annotations={"qos.gocrane.io/cpu-manager": "none"}))
    assert none.container("app").mode == "shared"


def test_bypass(xeon):
    n = node(xeon)
    d = n.admit_pod(pod("p", container("app", "2"), annotations={"numapin.io/bypass": "true"}))
    assert d.admitted and d.container("app").mode == "shared" and n.state.assignments == {}


def test_devices_steer_and_reject(xeon):
    n = node(xeon, topology_manager_policy="restricted")
    d = n.admit_pod(pod("p", container("app", "2")), devices={"app": {"example.com/nic": [1]}})
    c = d.container("app")
    assert d.admitted and c.affinity == TopologyHint(frozenset({1}), True) and c.cpus == S("28,84")
    assert c.hints["example.com/nic"][0] == TopologyHint(frozenset({1}), True)
    m = node(xeon, topology_manager_policy="single-numa-node")
    # two devices on different NUMA nodes: no single NUMA node holds the container's resources
    d = m.admit_pod(pod("q", container("app", "2")), devices={"app": {"gpu-a": [0], "gpu-b": [1]}})
    assert not d.admitted and d.reason == "TopologyAffinityError"
    assert m.state.assignments == {}
    # one device attached to both NUMA nodes has affinity with either (kubelet's device hints)
    d = m.admit_pod(pod("r", container("app", "2")), devices={"app": {"gpu-c": [0, 1]}})
    assert d.admitted and d.container("app").mems == S("0")


def test_config_validation(xeon, tmp_path):
    with pytest.raises(ConfigError, match="topologyManagerPolicy"):
        node(xeon, topology_manager_policy="strict")
    with pytest.raises(ConfigError, match="reservedCPUs"):
        node(xeon, reserved_cpus=S("200"))
    sixteen = Topology.from_sysfs(build(MACHINES["numa-16"], tmp_path / "n16"))
    # kubelet's limit applies when it is set; numapin's merge needs none by default
    with pytest.raises(ConfigError, match=r"topologyManagerPolicyOptions: .*more than 8 NUMA Nodes"):
        NodeAllocator(NodeConfig(topology=sixteen, num_reserved_cpus=2, topology_manager_policy="restricted",
                                 topology_manager_policy_options={"max-allowable-numa-nodes": "8"}))
    n = NodeAllocator(NodeConfig(topology=sixteen, num_reserved_cpus=2, topology_manager_policy="restricted"))
    c = n.admit_pod(pod("p", container("app", "4"))).container("app")
    assert c.mems == S("0") and c.affinity == TopologyHint(frozenset({0}), True)
    # 40 CPUs need 5 NUMA nodes of 8 CPUs: the narrowest masks are preferred
    c = n.admit_pod(pod("q", container("app", "40"))).container("app")
    assert len(c.cpus) == 40 and len(c.mems) == 5 and c.affinity.preferred


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"reserved_cpus": None, "require_reserved_cpus": True},
         "numReservedCPUs: the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"),
        ({"reserved_cpus": S(""), "require_reserved_cpus": True}, "reservedCPUs: the static policy requires"),
        ({"reserved_cpus": S("0,200")}, "reservedCPUs: [cpumanager] unable to build the reserved physical CPUs"),
        ({"reserved_cpus": S("0,56"), "num_reserved_cpus": 3},
         "reservedCPUs: [cpumanager] unable to reserve the required amount of CPUs (size of 0,56 did not equal 3)"),
        ({"reserved_cpus": None, "num_reserved_cpus": -1}, "numReservedCPUs: numReservedCPUs must be a non-negative"),
        ({"topology_manager_scope": "node"}, "topologyManagerScope: unknown scope 'node'"),
        ({"cpu_manager_policy_options": {"full-pcpus-only": "maybe"}}, "cpuManagerPolicyOptions: bad value"),
    ],
    ids=["no-reserved", "empty-reserved-list", "reserved-off-machine", "reserved-count-disagrees",
         "negative-count", "scope", "cpu-option"],
)
def test_one_construction_path_names_the_setting(xeon, config, message):
    """build_node and NodeAllocator (which calls it for a bare configuration) raise one ConfigError naming the
    kubelet setting; the reserved-CPU checks are the static policy's."""
    cfg = NodeConfig(topology=xeon, **({"reserved_cpus": S("0,56")} | config))
    for build_it in (lambda: build_node(cfg), lambda: NodeAllocator(cfg)):
        with pytest.raises(ConfigError) as e:
            build_it()
        assert str(e.value).startswith(message), str(e.value)


def test_zero_reserved_cpus_only_where_a_node_is_configured(xeon):
    """kubelet's policy accepts no reserved CPU; its container manager refuses it at start-up (require_reserved_cpus,
    set by the proxy and numapin plan). A simulated node (the webhook judging an exporter's NRT) is built anyway."""
    n = NodeAllocator(NodeConfig(topology=xeon, reserved_cpus=None))
    assert n.reserved_cpus == S("") and n.shared_pool() == xeon.all_cpus
    with pytest.raises(ConfigError, match="numReservedCPUs: the static policy requires"):
        build_node(NodeConfig(topology=xeon, require_reserved_cpus=True))


def test_built_parts_are_handed_to_the_allocator(xeon):
    parts = build_node(NodeConfig(topology=xeon, reserved_cpus=S("0,56"), topology_manager_policy="restricted"))
    n = NodeAllocator(parts)
    assert n.policy is parts.static_policy and n.topology_manager is parts.topology_manager
    assert n.reserved_cpus == S("0,56") and n.topology_manager.policy.name == "restricted"


def test_a_copy_shares_the_parts_not_the_state(xeon):
    """What the webhook's simulation does for pods bound but not yet published: admit them on a copy, never built
    again, and leave the original as it was."""
    n = NodeAllocator(build_node(NodeConfig(topology=xeon, reserved_cpus=S("0,56"))))
    before = n.state.copy()
    c = n.copy()
    assert c.parts is n.parts and c.policy is n.policy and c.topology_manager is n.topology_manager
    assert c.admit_pod(pod("a", container("app", "4"))).admitted
    assert n.state == before and c.state != before
    assert len(n.shared_pool() - c.shared_pool()) == 4


def test_bad_state_refused(xeon):
    bad = CPUState(default_cpuset=xeon.all_cpus)
    bad.set("x", "app", S("1"))
    with pytest.raises(CheckpointError, match="overlaps"):
        NodeAllocator(NodeConfig(topology=xeon, reserved_cpus=S("0,56")), bad)


def test_state_survives_the_state_file(xeon, tmp_path):
    n = node(xeon, topology_manager_policy="best-effort")
    n.admit_pod(pod("a", container("app", "6")))
    n.admit_pod(pod("s", container("app", "2", request_memory="1Mi"), annotations={"qos.gocrane.io/cpu-manager":
                                                                                      "share"}))
    store = CheckpointStore(tmp_path / "state")
    store.save(n.state)
    loaded = store.load()
    assert loaded == n.state
    again = NodeAllocator(n.config, loaded)
    assert again.shared_pool() == n.shared_pool()
    assert again.admit_pod(pod("a", container("app", "6"))).container("app").cpus == n.container_cpus("uid-a", "app")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "admit", "release"]), st.integers(0, 7),
                          st.sampled_from(["1", "2", "3", "4", "8", "13", "500m", "30"]),
                          st.sampled_from(["none", "exclusive", "share", None])), max_size=12),
       st.sampled_from(["none", "best-effort", "restricted", "single-numa-node"]))
def test_random_admissions_keep_the_state_sound(e5, ops, policy):
    n = node(e5, topology_manager_policy=policy)
    reserved = S("0,24")
    for op, i, cpu, mode in ops:
        name = f"p{i}"
        if op == "release":
            n.release_pod(f"uid-{name}")
        else:
            before = n.state.copy()
            ann = {"qos.gocrane.io/cpu-manager": mode} if mode else None
            d = n.admit_pod(pod(name, container("app", cpu), annotations=ann))
            if not d.admitted:
                assert n.state == before
        seen = 0
        for containers in n.state.assignments.values():
            for cpus in containers.values():
                assert cpus.mask & seen == 0  # no CPU given twice
                assert not cpus & reserved  # reserved CPUs are never given away
                seen |= cpus.mask
        assert CPUSet.from_mask(seen) | n.state.default_cpuset == e5.all_cpus
        assert not CPUSet.from_mask(seen) & n.state.default_cpuset


def test_rejected_and_dry_run_admissions_leave_the_reuse_bookkeeping(xeon):
    n = node(xeon, topology_manager_policy="single-numa-node")
    saved = (n.state.reuse_pod, n.state.reuse)
    # the init container is allocated (its CPUs become reusable), then the app container is rejected
    d = n.admit_pod(pod("p", container("app", "60"), init=(container("setup", "4"),)))
    assert not d.admitted and (n.state.reuse_pod, n.state.reuse) == saved and n.state.assignments == {}
    d = n.admit_pod(pod("q", container("app", "2"), init=(container("setup", "4"),)), dry_run=True)
    assert d.admitted and (n.state.reuse_pod, n.state.reuse) == saved and n.state.assignments == {}


def test_several_devices_of_one_resource(xeon):
    n = node(xeon, topology_manager_policy="single-numa-node")
    d = n.admit_pod(pod("p", container("app", "2")), devices={"app": {"example.com/gpu": [[0], [1]]}})
    assert not d.admitted and d.reason == "TopologyAffinityError"
