"""take-by-topology, against kubelet's behaviour tables.

The cases re-express kubelet's pkg/kubelet/cm/cpumanager/cpu_assignment_test.go tables (the case names
are kubelet's descriptions) on the machines of tests/topologies.py.
"""

from __future__ import annotations

import pytest

from allocator import AllocationError, ConfigError, CPUSet, take_by_topology
from allocator.cpu_assignment import CPUTaker, _stddev
from tests import topologies as T

S = CPUSet.parse


# -- TestCPUAccumulatorFreeSockets -------------------------------------------------------------------------
FREE_SOCKETS = [
    ("single socket HT, 1 socket free", T.single_socket_ht, "0-7", [0]),
    ("single socket HT, 0 sockets free", T.single_socket_ht, "1-7", []),
    ("dual socket HT, 2 sockets free", T.dual_socket_ht, "0-11", [0, 1]),
    ("dual socket HT, 1 socket free", T.dual_socket_ht, "0-9,11", [1]),
    ("dual socket HT, 0 sockets free", T.dual_socket_ht, "0,2-9,11", []),
    ("dual socket, multi numa per socket, HT, 2 sockets free", T.dual_socket_multi_numa_per_socket_ht, "0-79", [0, 1]),
    ("dual socket, multi numa per socket, HT, 1 sockets free", T.dual_socket_multi_numa_per_socket_ht, "1-79", [1]),
    ("dual socket, multi numa per socket, HT, 0 sockets free", T.dual_socket_multi_numa_per_socket_ht, "1-78", []),
    ("dual numa, multi socket per per socket, HT, 4 sockets free", T.fake_multi_socket_dual_socket_per_numa_ht,
     "0-79", [0, 1, 2, 3]),
    ("dual numa, multi socket per per socket, HT, 3 sockets free", T.fake_multi_socket_dual_socket_per_numa_ht,
     "0-19,21-79", [0, 1, 3]),
    ("dual numa, multi socket per per socket, HT, 2 sockets free", T.fake_multi_socket_dual_socket_per_numa_ht,
     "0-59,61-78", [0, 1]),
    ("dual numa, multi socket per per socket, HT, 1 sockets free", T.fake_multi_socket_dual_socket_per_numa_ht,
     "1-19,21-38,41-60,61-78", [1]),
    ("dual numa, multi socket per per socket, HT, 0 sockets free", T.fake_multi_socket_dual_socket_per_numa_ht,
     "0-40,42-49,51-68,71-79", []),
]


@pytest.mark.parametrize(("name", "topo", "avail", "expect"), FREE_SOCKETS, ids=[c[0] for c in FREE_SOCKETS])
def test_free_sockets(name, topo, avail, expect):
    assert sorted(CPUTaker(topo()).accumulator(S(avail)).free_sockets()) == expect


# -- TestCPUAccumulatorFreeNUMANodes (order matters) ----------------------------------------------------------
FREE_NUMA = [
    ("single socket HT, 1 NUMA node free", T.single_socket_ht, "0-7", [0]),
    ("single socket HT, 0 NUMA Node free", T.single_socket_ht, "1-7", []),
    ("dual socket HT, 2 NUMA Node free", T.dual_socket_ht, "0-11", [0, 1]),
    ("dual socket HT, 1 NUMA Node free", T.dual_socket_ht, "0-9,11", [1]),
    ("dual socket HT, 0 NUMA node free", T.dual_socket_ht, "0,2-9,11", []),
    ("dual socket, multi numa per socket, HT, 4 NUMA Node free", T.dual_socket_multi_numa_per_socket_ht, "0-79",
     [0, 1, 2, 3]),
    ("dual socket, multi numa per socket, HT, 3 NUMA node free", T.dual_socket_multi_numa_per_socket_ht, "1-79",
     [1, 2, 3]),
    ("dual socket, multi numa per socket, HT, 2 NUMA node free", T.dual_socket_multi_numa_per_socket_ht,
     "1-9,11-79", [2, 3]),
    ("dual socket, multi numa per socket, HT, 1 NUMA node free", T.dual_socket_multi_numa_per_socket_ht,
     "1-9,11-59,61-79", [3]),
    ("dual socket, multi numa per socket, HT, 0 NUMA node free", T.dual_socket_multi_numa_per_socket_ht,
     "1-9,11-59,61-78", []),
    ("dual numa, multi socket per per socket, HT, 2 NUMA node free", T.fake_multi_socket_dual_socket_per_numa_ht,
     "0-79", [0, 1]),
    ("dual numa, multi socket per per socket, HT, 1 NUMA node free", T.fake_multi_socket_dual_socket_per_numa_ht,
     "0-9,11-79", [1]),
    ("dual numa, multi socket per per socket, HT, 0 sockets free", T.fake_multi_socket_dual_socket_per_numa_ht,
     "0-9,11-59,61-79", []),
]


@pytest.mark.parametrize(("name", "topo", "avail", "expect"), FREE_NUMA, ids=[c[0] for c in FREE_NUMA])
def test_free_numa_nodes(name, topo, avail, expect):
    assert CPUTaker(topo()).accumulator(S(avail)).free_numa_nodes() == expect


# -- TestCPUAccumulatorFreeSocketsAndNUMANodes ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "avail", "sockets", "numas"),
    [
        ("dual socket, multi numa per socket, HT, 2 Socket/4 NUMA Node free", "0-79", [0, 1], [0, 1, 2, 3]),
        ("dual socket, multi numa per socket, HT, 1 Socket/3 NUMA node free", "1-79", [1], [1, 2, 3]),
        ("dual socket, multi numa per socket, HT, 1 Socket/ 2 NUMA node free", "1-9,11-79", [1], [2, 3]),
        ("dual socket, multi numa per socket, HT, 0 Socket/ 2 NUMA node free", "1-59,61-79", [], [1, 3]),
    ],
)
def test_free_sockets_and_numa_nodes(name, avail, sockets, numas):
    acc = CPUTaker(T.dual_socket_multi_numa_per_socket_ht()).accumulator(S(avail))
    assert acc.free_numa_nodes() == numas
    assert acc.free_sockets() == sockets


# -- TestCPUAccumulatorFreeCores --------------------------------------------------------------------------------
FREE_CORES = [
    ("single socket HT, 4 cores free", T.single_socket_ht, "0-7", [0, 1, 2, 3]),
    ("single socket HT, 3 cores free", T.single_socket_ht, "0-2,4-6", [0, 1, 2]),
    ("single socket HT, 3 cores free (1 partially consumed)", T.single_socket_ht, "0-6", [0, 1, 2]),
    ("single socket HT, 0 cores free", T.single_socket_ht, "", []),
    ("single socket HT, 0 cores free (4 partially consumed)", T.single_socket_ht, "0-3", []),
    ("dual socket HT, 6 cores free", T.dual_socket_ht, "0-11", [0, 2, 4, 1, 3, 5]),
    ("dual socket HT, 5 cores free (1 consumed from socket 0)", T.dual_socket_ht, "1-5,7-11", [2, 4, 1, 3, 5]),
    ("dual socket HT, 4 cores free (1 consumed from each socket)", T.dual_socket_ht, "2-5,8-11", [2, 4, 3, 5]),
]


@pytest.mark.parametrize(("name", "topo", "avail", "expect"), FREE_CORES, ids=[c[0] for c in FREE_CORES])
def test_free_cores(name, topo, avail, expect):
    assert CPUTaker(topo()).accumulator(S(avail)).free_cores() == expect


# -- TestCPUAccumulatorFreeCPUs ---------------------------------------------------------------------------------
FREE_CPUS = [
    ("single socket HT, 8 cpus free", T.single_socket_ht, "0-7", [0, 4, 1, 5, 2, 6, 3, 7]),
    ("single socket HT, 5 cpus free", T.single_socket_ht, "3-7", [4, 5, 6, 3, 7]),
    ("dual socket HT, 12 cpus free", T.dual_socket_ht, "0-11", [0, 6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 11 cpus free", T.dual_socket_ht, "1-11", [6, 2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("dual socket HT, 10 cpus free", T.dual_socket_ht, "1-5,7-11", [2, 8, 4, 10, 1, 7, 3, 9, 5, 11]),
    ("triple socket HT, 12 cpus free", T.triple_socket_ht, "0-3,6-13", [12, 13, 0, 1, 2, 3, 6, 7, 8, 9, 10, 11]),
]


@pytest.mark.parametrize(("name", "topo", "avail", "expect"), FREE_CPUS, ids=[c[0] for c in FREE_CPUS])
def test_free_cpus(name, topo, avail, expect):
    assert CPUTaker(topo()).accumulator(S(avail)).free_cpus() == expect


def test_spread_order_of_kep_4176():
    # KEP-4176 example on topoDualSocketHT: spread order walks each socket in CPU id order.
    acc = CPUTaker(T.dual_socket_ht()).accumulator(S("0-11"))
    assert acc.free_cpus(spread=True) == [0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11]


# -- commonTakeByTopologyTestCases + TestTakeByTopologyNUMAPacked ------------------------------------------------
M = T.dual_socket_multi_numa_per_socket_ht
COMMON = [
    ("take zero cpus from single socket with HT", T.single_socket_ht, "0-7", 0, ""),
    ("take one cpu from single socket with HT", T.single_socket_ht, "0-7", 1, "0"),
    ("take one cpu from single socket with HT, some cpus are taken", T.single_socket_ht, "1,3,5-7", 1, "6"),
    ("take two cpus from single socket with HT", T.single_socket_ht, "0-7", 2, "0,4"),
    ("take all cpus from single socket with HT", T.single_socket_ht, "0-7", 8, "0-7"),
    ("take two cpus from single socket with HT, only one core totally free", T.single_socket_ht, "0-3,6", 2, "2,6"),
    ("take a socket of cpus from dual socket with HT", T.dual_socket_ht, "0-11", 6, "0,2,4,6,8,10"),
    ("take a socket of cpus from dual socket with multi-numa-per-socket with HT", M, "0-79", 40, "0-19,40-59"),
    ("take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT", M, "0-79", 20, "0-9,40-49"),
    ("take a NUMA node of cpus from dual socket with multi-numa-per-socket with HT, with 1 NUMA node already taken",
     M, "10-39,50-79", 20, "10-19,50-59"),
    ("take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket with HT",
     M, "0-79", 60, "0-29,40-69"),
    ("take a socket and a NUMA node of cpus from dual socket with multi-numa-per-socket with HT, a core taken",
     M, "1-39,41-79", 60, "10-39,50-79"),
]

PACKED = [
    *[(name, topo, avail, n, {}, exp) for name, topo, avail, n, exp in COMMON],
    ("take one cpu from dual socket with HT - core from Socket 0", T.dual_socket_ht, "1-5,7-11", 1, {}, "2"),
    ("allocate 4 full cores with 3 coming from the first NUMA node (filling it up) and 1 coming from the second "
     "NUMA node", T.dual_socket_ht, "0-11", 8, {}, "0,6,2,8,4,10,1,7"),
    ("allocate 32 full cores with 30 coming from the first 3 NUMA nodes (filling them up) and 2 coming from the "
     "fourth NUMA node", M, "0-79", 64, {}, "0-29,40-69,30,31,70,71"),
    # PreferAlignByUncoreCache cases
    ("take cpus from two full UncoreCaches and partial from a single UncoreCache", T.uncore_single_socket_no_smt,
     "1-15", 10, {"prefer-align-cpus-by-uncorecache": "true"}, "1,2,4-11"),
    ("take one cpu from dual socket with HT - core from Socket 0 (uncore)", T.dual_socket_ht, "1-5,7-11", 1,
     {"prefer-align-cpus-by-uncorecache": "true"}, "1"),
    ("take first available UncoreCache from first socket", T.uncore_dual_socket_no_smt, "0-15", 4,
     {"prefer-align-cpus-by-uncorecache": "true"}, "0-3"),
    ("take all available UncoreCache from first socket", T.uncore_dual_socket_no_smt, "2-15", 6,
     {"prefer-align-cpus-by-uncorecache": "true"}, "2-7"),
    ("take first available UncoreCache from second socket", T.uncore_dual_socket_no_smt, "8-15", 4,
     {"prefer-align-cpus-by-uncorecache": "true"}, "8-11"),
    ("take first available UncoreCache from available NUMA", T.uncore_single_socket_multi_numa, "3,4-8,12", 2,
     {"prefer-align-cpus-by-uncorecache": "true"}, "4,5"),
    ("take cpus from best available UncoreCache group of multi uncore cache single socket - SMT enabled",
     T.uncore_single_socket_smt, "2-3,10-11,4-7,12-15", 6, {"prefer-align-cpus-by-uncorecache": "true"},
     "4-6,12-14"),
    ("take cpus from multiple UncoreCache of single socket - SMT enabled", T.uncore_single_socket_smt, "1-7,9-15",
     10, {"prefer-align-cpus-by-uncorecache": "true"}, "4-7,12-15,1,9"),
    # TestTakeByTopologyWithSpreadPhysicalCPUsPreferredOption
    ("take a socket of cpus from single socket with HT, 3 cpus", T.single_socket_ht, "0-7", 3,
     {"distribute-cpus-across-cores": "true"}, "0-2"),
    ("take a socket of cpus from dual socket with HT, 2 cpus", T.dual_socket_ht, "0-11", 2,
     {"distribute-cpus-across-cores": "true"}, "0,2"),
    ("take a socket of cpus from dual socket with HT, 3 cpus", T.dual_socket_ht, "0-11", 3,
     {"distribute-cpus-across-cores": "true"}, "0,2,4"),
    ("take a socket of cpus from dual socket with HT, 6 cpus", T.dual_socket_ht, "0-11", 6,
     {"distribute-cpus-across-cores": "true"}, "0,2,4,6,8,10"),
    ("take cpus from dual socket with HT, 8 cpus", T.dual_socket_ht, "0-11", 8,
     {"distribute-cpus-across-cores": "true"}, "0,2,4,6,8,10,1,3"),
    ("take a socket of cpus from dual socket without HT, 2 cpus", T.dual_socket_no_ht, "0-7", 2,
     {"distribute-cpus-across-cores": "true"}, "0,1"),
    ("take a socket of cpus from dual socket with multi numa per socket and HT, 12 cpus", M, "0-79", 8,
     {"distribute-cpus-across-cores": "true"}, "0-7"),
    # kubelet's own core labels (CPU 1 is on core 64): the spread follows them, as in kubelet
    ("take a socket of cpus from quad socket four way with HT, 12 cpus", T.quad_socket_four_way_ht, "0-287", 12,
     {"distribute-cpus-across-cores": "true"}, "0-2,9-10,13-14,21-22,25-26,33"),
]


@pytest.mark.parametrize(("name", "topo", "avail", "n", "opts", "expect"), PACKED, ids=[c[0] for c in PACKED])
def test_take_by_topology_numa_packed(name, topo, avail, n, opts, expect):
    assert take_by_topology(topo(), S(avail), n, opts) == S(expect)


def test_take_more_cpus_than_are_available():
    # "take more cpus than are available from single socket with HT"
    with pytest.raises(AllocationError, match=r"^not enough cpus available to satisfy request: requested=5, "
                                              r"available=4$"):
        take_by_topology(T.single_socket_ht(), S("0,2,4,6"), 5)
    with pytest.raises(AllocationError, match="requested=5, available=4"):
        take_by_topology(T.single_socket_ht(), S("0,2,4,6"), 5, {"distribute-cpus-across-numa": "true"})


def test_cpus_outside_the_topology_are_ignored():
    with pytest.raises(AllocationError, match="not enough cpus"):
        take_by_topology(T.single_socket_ht(), S("6-7,100-110"), 3)
    assert take_by_topology(T.single_socket_ht(), S("6-7,100-110"), 2) == S("6-7")


def test_bad_counts_and_options():
    with pytest.raises(AllocationError, match="non-negative integer"):
        take_by_topology(T.single_socket_ht(), S("0-7"), -1)
    with pytest.raises(ConfigError, match="unknown CPU Manager Policy option"):
        take_by_topology(T.single_socket_ht(), S("0-7"), 1, {"pack-harder": "true"})


# -- commonTakeByTopologyExtendedTestCases + TestTakeByTopologyNUMADistributed ------------------------------------
L = T.dual_socket_multi_numa_per_socket_ht_large
DISTRIBUTED = [
    *[(name, topo, avail, n, 1, exp) for name, topo, avail, n, exp in COMMON],
    ("allocate 4 full cores with 2 distributed across each NUMA node", T.dual_socket_ht, "0-11", 8, 1,
     "0,6,2,8,1,7,3,9"),
    ("allocate 32 full cores with 8 distributed across each NUMA node", M, "0-79", 64, 1,
     "0-7,10-17,20-27,30-37,40-47,50-57,60-67,70-77"),
    ("allocate 24 full cores with 8 distributed across the first 3 NUMA nodes", M, "0-79", 48, 1,
     "0-7,10-17,20-27,40-47,50-57,60-67"),
    ("allocate 24 full cores with 8 distributed across the first 3 NUMA nodes (taking all but 2 from the first "
     "NUMA node)", M, "1-29,32-39,41-69,72-79", 48, 1, "1-8,10-17,20-27,41-48,50-57,60-67"),
    ("allocate 24 full cores with 8 distributed across the last 3 NUMA nodes (even though all 8 could be allocated "
     "from the first NUMA node)", M, "2-29,31-39,42-69,71-79", 48, 1, "10-17,20-27,31-38,50-57,60-67,71-78"),
    ("allocate 8 full cores with 2 distributed across each NUMA node", M,
     "0-2,10-12,20-22,30-32,40-41,50-51,60-61,70-71", 16, 1, "0-1,10-11,20-21,30-31,40-41,50-51,60-61,70-71"),
    ("take one cpu from dual socket with HT - core from Socket 0", T.dual_socket_ht, "1-5,7-11", 1, 1, "1"),
    ("take one cpu from dual socket with HT - core from Socket 0 - cpuGroupSize 2", T.dual_socket_ht, "1-5,7-11",
     1, 2, "2"),
    ("allocate 13 full cores distributed across the first 2 NUMA nodes", M, "0-79", 26, 1, "0-6,10-16,40-45,50-55"),
    ("allocate 13 full cores distributed across the first 2 NUMA nodes (cpuGroupSize 2)", M, "0-79", 26, 2,
     "0-6,10-15,40-46,50-55"),
    ("allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU spilling over to each of "
     "NUMA 0, 1", M, "0-79", 62, 1, "0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76"),
    ("allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs spilling over to each of "
     "NUMA 0, 1, 2 (cpuGroupSize 2)", M, "0-79", 62, 2, "0-7,10-17,20-27,30-36,40-47,50-57,60-67,70-76"),
    ("allocate 31 full cores with 15 CPUs distributed across each NUMA node and 1 CPU spilling over to each of "
     "NUMA 2, 3 (to keep balance)", M, "0-8,10-18,20-39,40-48,50-58,60-79", 62, 1,
     "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77"),
    ("allocate 31 full cores with 14 CPUs distributed across each NUMA node and 2 CPUs spilling over to each of "
     "NUMA 0, 2, 3 (to keep balance with cpuGroupSize 2)", M, "0-8,10-18,20-39,40-48,50-58,60-79", 62, 2,
     "0-7,10-16,20-27,30-37,40-47,50-56,60-67,70-77"),
    ("ensure bestRemainder chosen with NUMA nodes that have enough CPUs to satisfy the request", M,
     "0-3,10-13,20-23,30-36,40-43,50-53,60-63,70-76", 34, 1, "0-3,10-13,20-23,30-34,40-43,50-53,60-63,70-74"),
    ("ensure previous failure encountered on live machine has been fixed (1/1)", L,
     "0,128,30,31,158,159,43-47,171-175,62,63,190,191,75-79,203-207,94,96,222,223,101-111,229-239,126,127,254,255",
     28, 1, "43-47,75-79,96,101-105,171-174,203-206,229-232"),
]


@pytest.mark.parametrize(("name", "topo", "avail", "n", "group", "expect"), DISTRIBUTED,
                         ids=[c[0] for c in DISTRIBUTED])
def test_take_by_topology_numa_distributed(name, topo, avail, n, group, expect):
    assert CPUTaker(topo()).take_distributed(S(avail), n, group) == S(expect)


def test_policy_dispatch_uses_smt_width_as_group_with_full_pcpus_only():
    # "allocate 13 full cores ... (cpuGroupSize 2)": the group size comes from full-pcpus-only.
    opts = {"distribute-cpus-across-numa": "true", "full-pcpus-only": "true"}
    assert take_by_topology(M(), S("0-79"), 26, opts) == S("0-6,10-15,40-46,50-55")
    assert take_by_topology(M(), S("0-79"), 26, {"distribute-cpus-across-numa": "true"}) == S(
        "0-6,10-16,40-45,50-55"
    )


def test_xeon_gold_6258r_write_up_examples():
    t = T.xeon_gold_6258r()
    # a 2-CPU Guaranteed pod gets one core's two threads; reserved CPU 0 keeps core 0 (0,56) out.
    assert take_by_topology(t, t.all_cpus - S("0"), 2) == S("1,57")
    # 56 CPUs: a whole socket's threads
    assert take_by_topology(t, t.all_cpus - S("0"), 56) == S("28-55,84-111")


def test_balance_score_rounding():
    # mean and standard deviation are rounded to 3 decimals, like kubelet.
    assert _stddev([1, 2]) == 0.5
    assert _stddev([0, 0, 1]) == 0.471
    assert _stddev([5, 5, 5]) == 0.0


def test_distributed_falls_back_to_packed_when_count_is_not_a_multiple_of_the_group():
    t = T.dual_socket_ht()
    assert CPUTaker(t).take_distributed(S("1-5,7-11"), 1, 2) == take_by_topology(t, S("1-5,7-11"), 1)
