"""The static policy: start-up validation, allocation, removal, reuse, reserved CPUs, Crane modes.

Cases named after kubelet's policy_static_test.go tables (TestStaticPolicyStart, TestStaticPolicyAdd,
TestStaticPolicyReuseCPUs, TestStaticPolicyDoNotReuseCPUs) re-express them here. kubelet's own tables
build the policy with no reserved CPU, which numapin refuses (as kubelet's CPU manager does); where that
matters the reserved CPU is chosen so that kubelet's expected results still hold, as noted per case.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from allocator import (
    AllocationError,
    CheckpointError,
    ConfigError,
    CPUSet,
    CPUState,
    PodSpecError,
    SMTAlignmentError,
    TopologyHint,
)
from allocator.pod import PodInfo
from allocator.static_policy import StaticPolicy, require_reserved
from allocator.topology import Topology
from tests import topologies as T
from tests.allocator.podspec import container, make_multi_container_pod, make_pod, pod

S = CPUSet.parse


def state(default: str, assignments: dict[str, dict[str, str]] | None = None) -> CPUState:
    st = CPUState(default_cpuset=S(default))
    for uid, containers in (assignments or {}).items():
        for name, cpus in containers.items():
            st.set(uid, name, S(cpus))
    return st


# -- TestStaticPolicyStart ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartCase:
    """A TestStaticPolicyStart case. ``reserved``: numReservedCPUs, or an explicit reserved list where kubelet runs
    the case with no reserved CPU (numapin refuses that); the CPU chosen changes none of the outcomes."""

    name: str
    reserved: int | str
    default: str
    expect: str | None = None  # the default set after start
    err: str | None = None  # or the CheckpointError
    assign: dict[str, dict[str, str]] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)


def start_case(c: StartCase) -> Any:
    return pytest.param(c, id=c.name)


STRICT = {"strict-cpu-reservation": "true"}
START = [
    start_case(StartCase("non-corrupted state", "1", "1-11", "1-11", assign={"fakePod": {"0": "0"}})),
    start_case(StartCase("empty cpuset", 1, "", "0-11")),
    start_case(StartCase("reserved cores 0 & 6 are not present in available cpuset", 2, "0-1",
                         err='not all reserved cpus: "0,6" are present in defaultCpuSet: "0-1"')),
    start_case(StartCase("some of reserved cores are present in available cpuset (StrictCPUReservationOption)", 2,
                         "0-1", options=STRICT,
                         err='some of strictly reserved cpus: "0" are present in defaultCpuSet: "0-1"')),
    start_case(StartCase("assigned core 2 is still present in available cpuset", "5", "2-11",
                         assign={"fakePod": {"0": "0-2"}},
                         err='pod: fakePod, container: 0 cpuset: "0-2" overlaps with default cpuset "2-11"')),
    start_case(StartCase("assigned core 2 is still present in available cpuset (StrictCPUReservationOption)", "0",
                         "2-11", assign={"fakePod": {"0": "0-2"}}, options=STRICT,
                         err='pod: fakePod, container: 0 cpuset: "0-2" overlaps with default cpuset "2-11"')),
    start_case(StartCase("core 12 is not present in topology but is in state cpuset", "5", "5-12",
                         assign={"fakePod": {"0": "0-2", "1": "3-4"}},
                         err='current set of available CPUs "0-11" doesn\'t match with CPUs in state "0-12"')),
    start_case(StartCase("core 11 is present in topology but is not in state cpuset", "5", "5-10",
                         assign={"fakePod": {"0": "0-2", "1": "3-4"}},
                         err='current set of available CPUs "0-11" doesn\'t match with CPUs in state "0-10"')),
]


@pytest.mark.parametrize("c", START)
def test_start(c: StartCase) -> None:
    if isinstance(c.reserved, int):
        policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=c.reserved, options=c.options)
    else:
        policy = StaticPolicy(T.dual_socket_ht(), reserved_cpus=S(c.reserved), options=c.options)
    st = state(c.default, c.assign)
    if c.err is None:
        policy.start(st)
        assert c.expect is not None and st.default_cpuset == S(c.expect)
    else:
        with pytest.raises(CheckpointError) as exc:
            policy.start(st)
        assert str(exc.value) == c.err


def test_start_strict_reservation_initialises_without_reserved_cpus():
    # KEP-4540: reserved 0,32,1,33,16,48 on 64 CPUs gives defaultCpuSet 2-15,17-31,34-47,49-63
    topo = T.regular(1, 1, 32, 2)
    policy = StaticPolicy(topo, reserved_cpus=S("0,32,1,33,16,48"), options={"strict-cpu-reservation": "true"})
    st = CPUState()
    policy.start(st)
    assert str(st.default_cpuset) == "2-15,17-31,34-47,49-63"
    policy.start(st)  # a valid loaded state passes
    st.default_cpuset = st.default_cpuset | S("16")
    with pytest.raises(CheckpointError, match='strictly reserved cpus: "16"'):
        policy.start(st)


def test_start_default_cpuset_cannot_be_empty_with_assignments():
    policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1)
    with pytest.raises(CheckpointError, match=r"^default cpuset cannot be empty$"):
        policy.start(state("", {"p": {"c": "1-11"}}))


# -- reserved CPUs ---------------------------------------------------------------------------------------------
def test_reserved_cpus_by_count_take_the_lowest_cores():
    # kubelet's NewStaticPolicy comment: 8 CPUs with HT and numReservedCPUs=2 gives reserved={0,4}
    assert StaticPolicy(T.single_socket_ht(), num_reserved_cpus=2).reserved == S("0,4")
    p = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1)
    assert p.reserved == S("0") and p.reserved_physical == S("0,6")


def test_reserved_cpus_explicit_list():
    p = StaticPolicy(T.dual_socket_ht(), reserved_cpus=S("1,6"))
    assert p.reserved == S("1,6") and p.reserved_physical == S("0-1,6-7")
    # numReservedCPUs equal to the list size is fine
    assert StaticPolicy(T.dual_socket_ht(), reserved_cpus=S("1,6"), num_reserved_cpus=2).reserved == S("1,6")


def test_zero_reserved_cpus_accepted_by_the_policy_refused_for_a_node():
    """kubelet's NewStaticPolicy accepts zero reserved CPUs (every CPU is allocatable); kubelet's container manager
    refuses to start a static-policy node without reserved CPUs: ``require_reserved``, used where a node is
    configured (the proxy, ``numapin plan``)."""
    topo = T.dual_socket_ht()
    p = StaticPolicy(topo)
    assert p.reserved == S("") and p.reserved_physical == S("")
    st = state(str(topo.all_cpus), {})
    p.start(st)
    p.allocate(st, make_pod("p", "c", "12", "12"), "c")
    assert st.get("p", "c") == topo.all_cpus  # all 12 CPUs, none held back
    with pytest.raises(ConfigError, match=r"the static policy requires systemreserved\.cpu \+ kubereserved\.cpu to "
                                          r"be greater than zero"):
        require_reserved(None, 0)
    require_reserved(S("0"), 0)
    require_reserved(None, 1)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"reserved_cpus": S("1,6"), "num_reserved_cpus": 3}, "size of 1,6 did not equal 3"),
        ({"num_reserved_cpus": 13}, "unable to reserve the required amount of CPUs"),
        ({"reserved_cpus": S("10-13")}, "reservedCPUs 12-13 are not on this machine"),
        ({"num_reserved_cpus": -1}, "numReservedCPUs must be a non-negative integer"),
    ],
)
def test_bad_reserved_configuration(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        StaticPolicy(T.dual_socket_ht(), **kwargs)


def test_policy_options_are_validated_with_the_topology_manager_policy():
    with pytest.raises(ConfigError, match="single-numa-node policy is incompatible"):
        StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1, options={"align-by-socket": "true"},
                     topology_manager_policy="single-numa-node")
    with pytest.raises(ConfigError, match="can not be used at the same time"):
        StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1,
                     options={"full-pcpus-only": "true", "distribute-cpus-across-cores": "true"})


# -- TestStaticPolicyAdd ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AddCase:
    """A TestStaticPolicyAdd case: the machine, the state before, the container asking, what it gets (or the error).

    ``reserved``: numReservedCPUs, or an explicit list where kubelet runs the case with no reserved CPU (numapin
    refuses that): then a CPU outside the default set is reserved, which changes none of kubelet's outcomes."""

    name: str
    topo: Callable[[], Topology]
    default: str
    request: str | tuple[str, str]  # request = limit, or (request, limit)
    expect: str | None = None  # the CPUs allocated ("" for none)
    err: str | None = None
    assign: dict[str, dict[str, str]] = field(default_factory=dict)
    container: str = "fakeContainer"
    reserved: int | str = 1

    def policy(self, options: dict[str, str] | None = None) -> StaticPolicy:
        if isinstance(self.reserved, int):
            return StaticPolicy(self.topo(), num_reserved_cpus=self.reserved, options=options)
        return StaticPolicy(self.topo(), reserved_cpus=S(self.reserved), options=options)

    def pod(self) -> PodInfo:
        request, limit = self.request if isinstance(self.request, tuple) else (self.request, self.request)
        return make_pod("fakePod", self.container, request, limit)


def add_case(c: AddCase) -> Any:
    return pytest.param(c, id=c.name)


Q = T.quad_socket_four_way_ht
_Q_ALL = Q().all_cpus
_Q_SOCKET_1 = Q().cpus_in_socket(1)


def _q_except(cpus: str | CPUSet) -> str:
    """Every CPU of the quad-socket machine but these."""
    return str(_Q_ALL - (S(cpus) if isinstance(cpus, str) else cpus))


OPTIONS_INSENSITIVE = [
    add_case(AddCase("GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore", T.single_socket_ht, "0-1,4-5",
                     "2000m", "1,5", assign={"fakePod": {"fakeContainer100": "2-3,6-7"}}, container="fakeContainer3")),
    add_case(AddCase("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocket", T.dual_socket_ht, "0-1,3-11",
                     "6000m", "1,3,5,7,9,11", assign={"fakePod": {"fakeContainer100": "2"}},
                     container="fakeContainer3")),
    add_case(AddCase("GuPodMultipleCores, DualSocketHT, ExpectAllocThreeCores", T.dual_socket_ht, "0,2-4,6-11",
                     "6000m", "2-4,8-10", assign={"fakePod": {"fakeContainer100": "1,5"}},
                     container="fakeContainer3")),
    add_case(AddCase("GuPodMultipleCores, DualSocketNoHT, ExpectAllocOneSocket", T.dual_socket_no_ht, "0-1,3-7",
                     "4000m", "4-7", container="fakeContainer1")),
    add_case(AddCase("GuPodMultipleCores, DualSocketNoHT, ExpectAllocFourCores", T.dual_socket_no_ht, "0-1,3,6-7",
                     "4000m", "1,3,6-7", assign={"fakePod": {"fakeContainer100": "4-5"}}, container="fakeContainer1")),
    add_case(AddCase("GuPodMultipleCores, DualSocketHT, ExpectAllocOneSocketOneCore", T.dual_socket_ht, "0-1,3-11",
                     "8000m", "1,3-5,7,9-11", assign={"fakePod": {"fakeContainer100": "2"}},
                     container="fakeContainer3")),
    add_case(AddCase("NonGuPod, SingleSocketHT, NoAlloc", T.single_socket_ht, "0-7", ("1000m", "2000m"), "",
                     container="fakeContainer1")),
    add_case(AddCase("GuPodNonIntegerCore, SingleSocketHT, NoAlloc", T.single_socket_ht, "0-7", "977m", "",
                     container="fakeContainer4")),
    # kubelet's quad-socket four-way-HT machine keeps its own core labels (core ids are only labels)
    add_case(AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocSock0", Q, _q_except("3-7,11"),
                     "72000m", str(Q().cpus_in_socket(0)), assign={"fakePod": {"fakeContainer100": "3-7,11"}},
                     container="fakeContainer5", reserved="3")),
    add_case(AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocAllFullCoresFromThreeSockets", Q,
                     "1-2,9,11-13,23,25,35,38,48,51,53-54,61,113,173,233", "12000m",
                     "1,11,13,23,25,35,38,48,53,113,173,233",
                     assign={"fakePod": {"fakeContainer100": _q_except(
                         "1-2,9,11-13,23,25,35,38,48,51,53-54,61,113,173,233")}},
                     container="fakeCcontainer5", reserved="0")),
    add_case(AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocAllSock1+FullCore", Q,
                     str(_Q_SOCKET_1 | S("10,22,34,47,53,61,108,115,173,181,228,235")), "76000m",
                     str(_Q_SOCKET_1 | S("10,22,34,47")),
                     assign={"fakePod": {"fakeContainer100": _q_except(
                         _Q_SOCKET_1 | S("10,22,34,47,53,61,108,115,173,181,228,235"))}},
                     container="fakeContainer5", reserved="0")),
]


@pytest.mark.parametrize("opts", [{}, {"full-pcpus-only": "true"}], ids=["default", "full-pcpus-only"])
@pytest.mark.parametrize("c", OPTIONS_INSENSITIVE)
def test_add_options_insensitive(opts: dict[str, str], c: AddCase) -> None:
    policy = c.policy(opts)
    st = state(c.default, c.assign)
    got = policy.allocate(st, c.pod(), c.container)
    assert c.expect is not None and got == S(c.expect)
    if c.expect:
        assert st.get("fakePod", c.container) == S(c.expect)
        assert got.isdisjoint(st.default_cpuset)
    else:
        assert st.get("fakePod", c.container) is None and st.default_cpuset == S(c.default)


DEFAULT_OPTIONS = [
    add_case(AddCase("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", T.single_socket_ht, "0-7", "1000m", "4")),
    add_case(AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocCPUs", Q, "10-11,52-53,67", "5000m",
                     "10-11,52-53,67", assign={"fakePod": {"fakeContainer100": _q_except("10-11,37,52-53,55,67")}},
                     reserved="37")),
    add_case(AddCase("GuPodSingleCore, SingleSocketHT, ExpectError", T.single_socket_ht, "0-7", "8000m",
                     err="not enough cpus available to satisfy request: requested=8, available=7")),
    add_case(AddCase("GuPodMultipleCores, SingleSocketHT, ExpectSameAllocation", T.single_socket_ht, "0,3-4,7",
                     "4000m", "1-2,5-6", assign={"fakePod": {"fakeContainer": "1-2,5-6"}})),
    add_case(AddCase("GuPodMultipleCores, DualSocketHT, NoAllocExpectError", T.dual_socket_ht, "0,4-11", "10000m",
                     assign={"fakePod": {"fakeContainer100": "1-3"}},
                     err="not enough cpus available to satisfy request: requested=10, available=8")),
    add_case(AddCase("GuPodMultipleCores, SingleSocketHT, NoAllocExpectError", T.single_socket_ht, "0,7", "2000m",
                     assign={"fakePod": {"fakeContainer100": "1-6"}},
                     err="not enough cpus available to satisfy request: requested=2, available=1")),
    add_case(AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, NoAlloc", Q, "10-11,37,52-53,55,67", "76000m",
                     assign={"fakePod": {"fakeContainer100": _q_except("10-11,37,52-53,55,67")}}, reserved="0",
                     err="not enough cpus available to satisfy request: requested=76, available=7")),
]


@pytest.mark.parametrize("c", DEFAULT_OPTIONS)
def test_add_default_options(c: AddCase) -> None:
    policy = c.policy()
    st = state(c.default, c.assign)
    before = st.copy()
    if c.err:
        with pytest.raises(AllocationError) as exc:
            policy.allocate(st, c.pod(), c.container)
        assert str(exc.value) == c.err and exc.value.reason == "UnexpectedAdmissionError"
        assert st == before
    else:
        assert c.expect is not None and policy.allocate(st, c.pod(), c.container) == S(c.expect)
        assert st.get("fakePod", c.container) == S(c.expect)


SMT_ALIGN = [
    add_case(AddCase("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", T.single_socket_ht, "0-7", "1000m",
                     err="SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2")),
    # SMT level 4, not x86's usual 2
    add_case(AddCase("GuPodMultipleCores, topoQuadSocketFourWayHT, ExpectAllocOneCPUs", Q, str(_Q_ALL), "15000m",
                     reserved=8, err="SMT Alignment Error: requested 15 cpus not multiple cpus per core = 4")),
    add_case(AddCase("GuPodManyCores, topoDualSocketHT, ExpectDoNotAllocPartialCPU", T.dual_socket_ht, "0,2-5,7-11",
                     "10000m", reserved="1,6",
                     err="SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 8, "
                         "requested CPUs = 10, CPUs per core = 2")),
    add_case(AddCase("GuPodManyCores, topoDualSocketHT, AutoReserve, ExpectAllocAllCPUs", T.dual_socket_ht,
                     "1-5,7-11", "10000m", "1-5,7-11", reserved=2)),
    add_case(AddCase("GuPodManyCores, topoDualSocketHT, ExpectAllocAllCPUs", T.dual_socket_ht, "1-5,7-11", "10000m",
                     "1-5,7-11", reserved="0,6")),
]


@pytest.mark.parametrize("c", SMT_ALIGN)
def test_add_full_pcpus_only(c: AddCase) -> None:
    policy = c.policy({"full-pcpus-only": "true"})
    st = state(c.default)
    if c.err:
        with pytest.raises(SMTAlignmentError) as exc:
            policy.allocate(st, c.pod(), c.container)
        assert str(exc.value) == c.err and exc.value.reason == "SMTAlignmentError"
        assert st.get("fakePod", c.container) is None
    else:
        assert c.expect is not None and policy.allocate(st, c.pod(), c.container) == S(c.expect)


@pytest.mark.parametrize(
    ("name", "align", "expect"),
    [
        ("Align by socket: true, cpu's within same socket of numa in hint are part of allocation", "true", "2,11"),
        ("Align by socket: false, cpu's are taken strictly from NUMA nodes in hint", "false", "2,21"),
    ],
)
def test_add_align_by_socket(name, align, expect):
    policy = StaticPolicy(T.dual_socket_multi_numa_per_socket_ht(), num_reserved_cpus=1,
                          options={"align-by-socket": align})
    st = state("2,11,21-22")
    hint = TopologyHint(frozenset({0, 2}), True)
    assert policy.allocate(st, make_pod("fakePod", "c", "2000m", "2000m"), "c", hint) == S(expect)


def test_affinity_is_a_preference_and_overflow_spills_outside():
    policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1)
    st = state("0-11")
    # 8 CPUs with affinity NUMA 1 (6 CPUs): all of NUMA 1, then 2 more from NUMA 0
    got = policy.allocate(st, make_pod("p", "c", "8", "8"), "c", TopologyHint(frozenset({1}), True))
    assert got == S("1-3,5,7-9,11")
    # no affinity (None numa) behaves like no hint
    st2 = state("0-11")
    assert policy.allocate(st2, make_pod("q", "c", "2", "2"), "c", TopologyHint(None, True)) == S("2,8")


def test_allocate_is_idempotent_and_full_pcpus_only_keeps_existing():
    policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1, options={"full-pcpus-only": "true"})
    st = state("0-11")
    p = make_pod("p", "c", "10", "10")
    first = policy.allocate(st, p, "c")
    snapshot = st.copy()
    assert policy.allocate(st, p, "c") == first  # no physical CPUs left, yet the existing container is kept
    assert st == snapshot


# -- TestStaticPolicyReuseCPUs / TestStaticPolicyDoNotReuseCPUs ------------------------------------------------------
def test_reuse_cpus_single_socket_ht_dealloc_one_init_container():
    # kubelet case "SingleSocketHT, DeAllocOneInitContainer" (run there without reserved CPUs; CPU 3 is
    # reserved here, which leaves kubelet's expected sets unchanged).
    policy = StaticPolicy(T.single_socket_ht(), reserved_cpus=S("3"))
    st = state("0-7")
    p = PodInfo.from_pod(make_multi_container_pod([("4000m", "4000m")], [("2000m", "2000m")]))
    for c in p.containers:
        policy.allocate(st, p, c.name)
    assert st.default_cpuset == S("2-3,6-7")
    assert st.get("fakePod", "initContainer-0") == S("0-1,4-5")
    assert st.get("fakePod", "appContainer-0") == S("0,4")
    assert policy.remove(st, "fakePod", "initContainer-0") == S("1,5")
    assert st.default_cpuset == S("1-3,5-7")
    assert st.get("fakePod", "initContainer-0") is None


def test_do_not_reuse_cpus_of_a_restartable_init_container():
    # kubelet case "SingleSocketHT, Don't reuse CPUs of a restartable init container" (reserved CPU 3 as above)
    policy = StaticPolicy(T.single_socket_ht(), reserved_cpus=S("3"))
    st = state("0-7")
    p = make_multi_container_pod([("4000m", "4000m", "Always")], [("2000m", "2000m")])
    for name in ("initContainer-0", "appContainer-0"):
        policy.allocate(st, p, name)
    assert st.default_cpuset == S("3,7")
    assert st.get("fakePod", "appContainer-0") == S("2,6")


def test_reuse_is_tracked_for_one_pod_at_a_time():
    policy = StaticPolicy(T.single_socket_ht(), reserved_cpus=S("3"))
    st = state("0-7")
    a = make_multi_container_pod([("2", "2")], [("2", "2")], uid="a")
    policy.allocate(st, a, "initContainer-0")
    assert (st.reuse_pod, st.reuse) == ("a", S("0,4"))
    b = make_pod("b", "c", "1", "1")
    policy.allocate(st, b, "c")
    assert st.reuse_pod == "b"
    # pod a's init CPUs are no longer offered to its app container
    got = policy.allocate(st, a, "appContainer-0")
    assert got.isdisjoint(S("0,4"))


# -- remove ----------------------------------------------------------------------------------------------------------
def test_remove_returns_cpus_and_ignores_unknown_containers():
    policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1)
    st = state("0-11")
    got = policy.allocate(st, make_pod("p", "c", "2", "2"), "c")
    assert policy.remove(st, "p", "c") == got
    assert st.default_cpuset == S("0-11") and st.assignments == {}
    assert policy.remove(st, "p", "c") == CPUSet()
    assert policy.remove(st, "nope", "x") == CPUSet()


# -- Crane modes and bypass -------------------------------------------------------------------------------------------
def crane_pod(uid: str, mode: str, request: str, limit: str) -> dict:
    # Burstable overall (the sidecar has no limits), yet the app container qualifies under Crane's rule.
    return pod(uid, [container("app", request, limit), container("side", "100m", None)],
               annotations={"qos.gocrane.io/cpu-manager": mode})


def test_crane_exclusive_and_share_modes():
    policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1)
    st = state("0-11")
    ex = policy.allocate(st, crane_pod("ex", "exclusive", "2", "2"), "app")
    sh = policy.allocate(st, crane_pod("sh", "share", "2", "2"), "app")
    assert len(ex) == 2 and len(sh) == 2 and ex.isdisjoint(sh)
    assert st.mode("ex", "app") == "exclusive" and st.mode("sh", "app") == "share"
    assert st.default_cpuset == S("0-11") - ex - sh
    assert st.shared_pool() == S("0-11") - ex
    # the unpinned sidecar gets nothing of its own
    assert policy.allocate(st, crane_pod("ex", "exclusive", "2", "2"), "side") == CPUSet()
    # releasing a share container gives its CPUs back to the default set
    policy.remove(st, "sh", "app")
    assert st.default_cpuset == S("0-11") - ex


@pytest.mark.parametrize(("mode", "request_", "limit"), [("none", "2", "2"), ("exclusive", "2", "3"),
                                                          ("share", "1500m", "1500m")])
def test_crane_modes_that_do_not_pin(mode, request_, limit):
    policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1)
    st = state("0-11")
    p = crane_pod("p", mode, request_, limit)
    assert policy.allocate(st, p, "app") == CPUSet()
    assert policy.topology_hints(st, p, "app") is None
    assert st.default_cpuset == S("0-11")


def test_bypass_pods_are_left_alone():
    policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1)
    st = state("0-11")
    p = pod("p", [container("c", "2", "2")], annotations={"numapin.io/bypass": "true"})
    assert policy.allocate(st, p, "c") == CPUSet()
    assert policy.topology_hints(st, p, "c") is None
    assert policy.pod_topology_hints(st, p) is None


def test_unknown_container_is_a_pod_spec_error():
    policy = StaticPolicy(T.dual_socket_ht(), num_reserved_cpus=1)
    with pytest.raises(PodSpecError, match="no container 'ghost'"):
        policy.allocate(state("0-11"), make_pod("p", "c", "1", "1"), "ghost")


def test_xeon_gold_6258r_write_up_scenarios():
    t = T.xeon_gold_6258r()
    policy = StaticPolicy(t, reserved_cpus=S("0"))
    st = CPUState()
    policy.start(st)
    # a 2-CPU Guaranteed pod gets one core's two threads
    assert policy.allocate(st, make_pod("a", "c", "2", "2"), "c") == S("1,57")
    # a 1.5-CPU Guaranteed pod stays on the shared pool
    assert policy.allocate(st, make_pod("b", "c", "1500m", "1500m"), "c") == CPUSet()
    # a 56-CPU pod takes one socket's threads
    assert policy.allocate(st, make_pod("c", "c", "56", "56"), "c") == S("28-55,84-111")


def test_strict_reservation_accepts_a_fully_assigned_node():
    # numapin departs from kubelet here: with strict-cpu-reservation every CPU but the reserved ones can be
    # assigned, leaving an empty default set; kubelet's validateState would refuse to restart on it.
    policy = StaticPolicy(T.dual_socket_ht(), reserved_cpus=S("0"), options={"strict-cpu-reservation": "true"})
    st = CPUState()
    policy.start(st)
    policy.allocate(st, make_pod("p", "c", "11", "11"), "c")
    assert st.default_cpuset == CPUSet()
    policy.start(st)
    st.delete("p", "c")
    st.set("p", "c", S("1-10"))
    with pytest.raises(CheckpointError, match="doesn't match with CPUs in state"):
        policy.start(st)


# -- TestStaticPolicyRemove ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "cname", "assign", "default", "expect"),
    [
        ("SingleSocketHT, DeAllocOneContainer", "fakeContainer1", {"fakeContainer1": "1-3"}, "4-7", "1-7"),
        ("SingleSocketHT, DeAllocOneContainer, BeginEmpty", "fakeContainer1",
         {"fakeContainer1": "1-3", "fakeContainer2": "4-7"}, "", "1-3"),
        ("SingleSocketHT, DeAllocTwoContainer", "fakeContainer1", {"fakeContainer1": "1,3,5", "fakeContainer2": "2,4"},
         "6-7", "1,3,5-7"),
        ("SingleSocketHT, NoDeAlloc", "fakeContainer2", {"fakeContainer1": "1,3,5"}, "2,4,6-7", "2,4,6-7"),
    ],
)
def test_remove(name, cname, assign, default, expect):
    policy = StaticPolicy(T.single_socket_ht(), reserved_cpus=S("0"))
    st = state(default, {"fakePod": assign})
    policy.remove(st, "fakePod", cname)
    assert st.default_cpuset == S(expect)
    assert st.get("fakePod", cname) is None


# -- TestTopologyAwareAllocateCPUs --------------------------------------------------------------------------------
# kubelet runs these with no reserved CPU; the reserved CPU chosen per case keeps kubelet's expected result
# (it sits where it changes no ordering decision of that case).
@pytest.mark.parametrize(
    ("name", "n", "numa", "reserved", "expect"),
    [
        ("Request 2 CPUs, No BitMask", 2, None, "10", "0,6"),
        ("Request 2 CPUs, BitMask on Socket 0", 2, {0}, "10", "0,6"),
        ("Request 2 CPUs, BitMask on Socket 1", 2, {1}, "10", "1,7"),
        ("Request 8 CPUs, BitMask on Socket 0", 8, {0}, "11", "0,6,2,8,4,10,1,7"),
        ("Request 8 CPUs, BitMask on Socket 1", 8, {1}, "10", "1,7,3,9,5,11,0,6"),
    ],
)
def test_topology_aware_allocate_cpus(name, n, numa, reserved, expect):
    policy = StaticPolicy(T.dual_socket_ht(), reserved_cpus=S(reserved))
    st = CPUState()
    policy.start(st)
    hint = TopologyHint(frozenset(numa), True) if numa is not None else None
    assert policy.allocate(st, make_pod("p", "c", str(n), str(n)), "c", hint) == S(expect)


# -- TestStaticPolicyStartWithResvList / TestStaticPolicyAddWithResvList --------------------------------------------
@pytest.mark.parametrize(
    ("name", "opts", "default", "expect", "err"),
    [
        ("empty cpuset", {}, "", "0-11", None),
        ("empty cpuset with StrictCPUReservationOption enabled", {"strict-cpu-reservation": "true"}, "", "2-11", None),
        ("reserved cores 0 & 1 are not present in available cpuset", {}, "2-5", None,
         'not all reserved cpus: "0-1" are present in defaultCpuSet: "2-5"'),
        ("reserved cores 0 & 1 are present in available cpuset with StrictCPUReservationOption enabled",
         {"strict-cpu-reservation": "true"}, "0-5", None,
         'some of strictly reserved cpus: "0-1" are present in defaultCpuSet: "0-5"'),
    ],
)
def test_start_with_reserved_list(name, opts, default, expect, err):
    policy = StaticPolicy(T.dual_socket_ht(), reserved_cpus=S("0-1"), num_reserved_cpus=2, options=opts)
    st = state(default)
    if err:
        with pytest.raises(CheckpointError) as exc:
            policy.start(st)
        assert str(exc.value) == err
    else:
        policy.start(st)
        assert st.default_cpuset == S(expect)


def test_inconsistency_between_num_reserved_cpus_and_reserved():
    with pytest.raises(ConfigError) as exc:
        StaticPolicy(T.dual_socket_ht(), reserved_cpus=S("0-1"), num_reserved_cpus=1)
    assert str(exc.value) == "[cpumanager] unable to reserve the required amount of CPUs (size of 0-1 did not equal 1)"


@pytest.mark.parametrize(
    ("name", "reserved", "assign", "default", "req", "expect", "err"),
    [
        ("GuPodSingleCore, SingleSocketHT, ExpectError", "0", {}, "0-7", "8000m", None,
         "not enough cpus available to satisfy request: requested=8, available=7"),
        ("GuPodSingleCore, SingleSocketHT, ExpectAllocOneCPU", "0-1", {}, "0-7", "1000m", "4", None),
        ("GuPodMultipleCores, SingleSocketHT, ExpectAllocOneCore", "0-1", {"fakeContainer100": "2-3,6-7"}, "0-1,4-5",
         "2000m", "4-5", None),
    ],
)
def test_add_with_reserved_list(name, reserved, assign, default, req, expect, err):
    policy = StaticPolicy(T.single_socket_ht(), reserved_cpus=S(reserved))
    st = state(default, {"fakePod": assign} if assign else None)
    p = make_pod("fakePod", "fakeContainer2", req, req)
    if err:
        with pytest.raises(AllocationError, match=err):
            policy.allocate(st, p, "fakeContainer2")
    else:
        assert policy.allocate(st, p, "fakeContainer2") == S(expect)


# -- TestStaticPolicyAddWithUncoreAlignment -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "apps"),
    [
        ("GuPodSingleContainerSaturating, DualSocketHTUncore, ExpectAllocOneUncore, FullUncoreAvail", ["16"]),
        ("GuPodMainAndSidecarContainer, DualSocketHTUncore, ExpectAllocOneUncore, FullUncoreAvail", ["12", "2"]),
        ("GuPodSidecarAndMainContainer, DualSocketHTUncore, ExpectAllocOneUncore, FullUncoreAvail", ["2", "12"]),
    ],
)
def test_add_with_uncore_alignment(name, apps):
    t = T.dual_socket_single_numa_per_socket_smt_uncore()
    policy = StaticPolicy(t, reserved_cpus=S("0-1,96-97,192-193,288-289"),
                          options={"full-pcpus-only": "true", "prefer-align-cpus-by-uncorecache": "true"})
    # partly reserved L3 groups 0 and 12 are taken out of the available CPUs, as in kubelet's case
    st = CPUState(default_cpuset=t.all_cpus - t.cpus_in_uncore(0) - t.cpus_in_uncore(12))
    p = make_multi_container_pod([], [(n, n) for n in apps], uid="uncore-pod")
    got = CPUSet()
    for i in range(len(apps)):
        got = got | policy.allocate(st, p, f"appContainer-{i}")
    assert {t.cpu(c).uncore for c in got} == {1}


def test_reuse_bookkeeping_rolls_back_with_the_state():
    policy = StaticPolicy(T.single_socket_ht(), reserved_cpus=S("3"))
    st = state("0-7")
    p = make_multi_container_pod([("4000m", "4000m")], [("2000m", "2000m")])
    saved_state = st.copy()
    policy.allocate(st, p, "initContainer-0")
    assert (st.reuse_pod, st.reuse) == ("fakePod", S("0-1,4-5"))
    st = saved_state  # the working copy is dropped: its reuse goes with it
    assert (st.reuse_pod, st.reuse) == (None, CPUSet())
    # replaying the admission gives the same answer as the first time
    assert policy.allocate(st, p, "initContainer-0") == S("0-1,4-5")
    assert policy.allocate(st, p, "appContainer-0") == S("0,4")
