"""kubelet's standard test machines (cpumanager policy_test.go and friends) as Topology builders.

Core ids follow numapin (and kubelet's Discover): the lowest thread id of the core. Where kubelet's test
tables number cores differently, the numbering used here keeps the same order, so every ordering rule
(free count, then id) gives the same answer. Uncore ids default to 0 like kubelet's zero-valued
UncoreCacheID, except on the machines that describe L3 groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from hypothesis import strategies as st

from allocator.topology import CPUInfo, Topology


def build(
    rows: Iterable[tuple[int, int, int, int, int]],
    numa_nodes: Iterable[int] = (),
    distances: dict[int, tuple[int, ...]] | None = None,
) -> Topology:
    """Rows are ``(cpu, core, socket, numa, uncore)``; core ids are renumbered to the lowest thread id."""
    rows = list(rows)
    lowest: dict[int, int] = {}
    for cpu, core, _s, _n, _u in rows:
        lowest[core] = min(lowest.get(core, cpu), cpu)
    cpus = tuple(CPUInfo(cpu=c, core=lowest[k], socket=s, numa=n, uncore=u) for c, k, s, n, u in rows)
    return Topology(cpus=cpus, numa_nodes=tuple(numa_nodes), numa_distances=distances)


def regular(
    sockets: int,
    numa_per_socket: int,
    cores_per_numa: int,
    threads: int,
    *,
    cores_per_uncore: int | None = None,
) -> Topology:
    """A Linux-style numbering: first thread of every core 0..C-1, then the second threads C..2C-1, ...

    NUMA node n holds cores n*cores_per_numa ... ; sockets hold numa_per_socket consecutive NUMA nodes.
    L3 groups are ``cores_per_uncore`` consecutive cores (one per NUMA node when not given).
    """
    cores = sockets * numa_per_socket * cores_per_numa
    per_uncore = cores_per_uncore or cores_per_numa
    rows = []
    for t in range(threads):
        for core in range(cores):
            numa = core // cores_per_numa
            rows.append((t * cores + core, core, numa // numa_per_socket, numa, core // per_uncore))
    return build(rows)


# -- kubelet's test machines -------------------------------------------------------------------------------


def single_socket_ht() -> Topology:
    """topoSingleSocketHT: 8 CPUs, 4 cores, CPUs n and n+4 are siblings."""
    return build((c, c % 4, 0, 0, 0) for c in range(8))


def dual_socket_ht() -> Topology:
    """topoDualSocketHT: 12 CPUs, socket = cpu % 2, siblings n and n+6."""
    return build((c, c % 6, c % 2, c % 2, 0) for c in range(12))


def dual_socket_no_ht() -> Topology:
    """topoDualSocketNoHT: 8 CPUs, 0-3 socket 0 and 4-7 socket 1."""
    return build((c, c, c // 4, c // 4, 0) for c in range(8))


def triple_socket_ht() -> Topology:
    """topoTripleSocketHT: 18 CPUs, cores {0,1} {2,3} ...; CPUs 0-5 socket 1, 6-11 socket 0, 12-17 socket 2."""
    socket_of = {0: 1, 1: 0, 2: 2}
    return build((c, c // 2, socket_of[c // 6], socket_of[c // 6], 0) for c in range(18))


def dual_socket_multi_numa_per_socket_ht() -> Topology:
    """topoDualSocketMultiNumaPerSocketHT (dual Xeon Gold 6230): 80 CPUs, NUMA n = 10n..10n+9 and 40+10n...,
    two NUMA nodes per socket."""
    return build((c, c % 40, (c % 40) // 20, (c % 40) // 10, 0) for c in range(80))


def fake_multi_socket_dual_socket_per_numa_ht() -> Topology:
    """fakeTopoMultiSocketDualSocketPerNumaHT: the 6230 with NUMA nodes and sockets swapped (4 sockets, 2 NUMA)."""
    return build((c, c % 40, (c % 40) // 10, (c % 40) // 20, 0) for c in range(80))


def dual_socket_multi_numa_per_socket_ht_large() -> Topology:
    """topoDualSocketMultiNumaPerSocketHTLarge (dual AMD EPYC 7742, NPS=4): 256 CPUs, 8 NUMA nodes of 16 cores."""
    return build((c, c % 128, (c % 128) // 64, (c % 128) // 16, 0) for c in range(256))


def xeon_gold_6258r() -> Topology:
    """The 112-CPU dual Xeon Gold 6258R of the CPU-manager write-ups: NUMA0 0-27,56-83; NUMA1 28-55,84-111."""
    rows = []
    for c in range(112):
        socket = (c % 56) // 28
        rows.append((c, c % 56, socket, socket, socket))
    return build(rows, distances={0: (10, 21), 1: (21, 10)})


def e5_2680_v3() -> Topology:
    """Dual E5-2680 v3: 48 CPUs, 12 cores per socket, NUMA0 0-11,24-35; NUMA1 12-23,36-47."""
    return build((c, c % 24, (c % 24) // 12, (c % 24) // 12, (c % 24) // 12) for c in range(48))


# -- L3 (uncore) machines, as used by kubelet's prefer-align-cpus-by-uncorecache tables ---------------------


def uncore_single_socket_no_smt() -> Topology:
    """topoUncoreSingleSocketNoSMT: 16 CPUs, no SMT, four L3 groups of 4 CPUs."""
    return build((c, c, 0, 0, c // 4) for c in range(16))


def uncore_dual_socket_no_smt() -> Topology:
    """topoUncoreDualSocketNoSMT: 16 CPUs, no SMT, 2 sockets, four L3 groups of 4 CPUs (two per socket)."""
    return build((c, c, c // 8, c // 8, c // 4) for c in range(16))


def uncore_single_socket_multi_numa() -> Topology:
    """topoUncoreSingleSocketMultiNuma: 16 CPUs, no SMT, one socket, NUMA 0-7 and 8-15, L3 groups of 4."""
    return build((c, c, 0, c // 8, c // 4) for c in range(16))


def uncore_single_socket_smt() -> Topology:
    """topoUncoreSingleSocketSMT: 16 CPUs, siblings n and n+8, two L3 groups of 4 cores (0-3,8-11 and 4-7,12-15)."""
    return build((c, c % 8, 0, 0, (c % 8) // 4) for c in range(16))


def dual_socket_single_numa_per_socket_smt_uncore() -> Topology:
    """topoDualSocketSingleNumaPerSocketSMTUncore: 384 CPUs, 2 sockets = 2 NUMA nodes, SMT2 (n and n+192),
    24 L3 groups of 8 cores (16 CPUs)."""
    return regular(2, 1, 96, 2, cores_per_uncore=8)


def epyc_4_numa_per_socket() -> Topology:
    """An AMD EPYC with 2 sockets, 4 NUMA nodes per socket (NPS4), 8-core L3 groups, SMT2: 256 CPUs."""
    return regular(2, 4, 16, 2, cores_per_uncore=8)


def sixteen_numa() -> Topology:
    """A 16-NUMA-node machine: 2 sockets x 8 NUMA nodes x 4 cores x 2 threads (128 CPUs)."""
    return regular(2, 8, 4, 2)


def large_384() -> Topology:
    """2 sockets, 8 NUMA nodes (4 per socket), 24 cores per NUMA node, SMT2: 384 CPUs, 8-core L3 groups."""
    return regular(2, 4, 24, 2, cores_per_uncore=8)


MACHINES: dict[str, Callable[[], Topology]] = {
    "single_socket_ht": single_socket_ht,
    "dual_socket_ht": dual_socket_ht,
    "dual_socket_no_ht": dual_socket_no_ht,
    "triple_socket_ht": triple_socket_ht,
    "dual_socket_multi_numa_per_socket_ht": dual_socket_multi_numa_per_socket_ht,
    "fake_multi_socket_dual_socket_per_numa_ht": fake_multi_socket_dual_socket_per_numa_ht,
    "dual_socket_multi_numa_per_socket_ht_large": dual_socket_multi_numa_per_socket_ht_large,
    "xeon_gold_6258r": xeon_gold_6258r,
    "e5_2680_v3": e5_2680_v3,
    "uncore_single_socket_no_smt": uncore_single_socket_no_smt,
    "uncore_dual_socket_no_smt": uncore_dual_socket_no_smt,
    "uncore_single_socket_multi_numa": uncore_single_socket_multi_numa,
    "uncore_single_socket_smt": uncore_single_socket_smt,
    "dual_socket_single_numa_per_socket_smt_uncore": dual_socket_single_numa_per_socket_smt_uncore,
    "epyc_4_numa_per_socket": epyc_4_numa_per_socket,
    "sixteen_numa": sixteen_numa,
    "large_384": large_384,
}


# -- random machines for property tests ---------------------------------------------------------------------


@st.composite
def random_topologies(draw: st.DrawFn, *, offline: bool = True) -> Topology:
    """Hierarchical machines: sockets above NUMA nodes or NUMA nodes above sockets, SMT 1-2, L3 groups,
    CPU numbering either Linux-like (siblings far apart) or core-major, some CPUs possibly offline."""
    numa_above = draw(st.booleans())
    outer = draw(st.integers(1, 3))
    inner = draw(st.integers(1, 3))
    cores_per_unit = draw(st.integers(1, 4))
    threads = draw(st.integers(1, 2))
    cores_per_uncore = draw(st.integers(1, 4))
    units = outer * inner
    cores = units * cores_per_unit
    rows = []
    linux = draw(st.booleans())
    for core in range(cores):
        unit = core // cores_per_unit
        if numa_above:
            numa, socket = unit // inner, unit
        else:
            socket, numa = unit // inner, unit
        for t in range(threads):
            cpu = t * cores + core if linux else core * threads + t
            rows.append((cpu, core, socket, numa, core // cores_per_uncore))
    if offline and len(rows) > 2 and draw(st.booleans()):
        dropped = draw(st.sets(st.sampled_from([r[0] for r in rows]), max_size=len(rows) // 4))
        rows = [r for r in rows if r[0] not in dropped] or rows
    return build(rows)
