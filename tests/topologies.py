"""kubelet's standard test machines (cpumanager policy_test.go and friends) as Topology builders.

``build`` renumbers core ids to the lowest thread id of the core (what sysfs discovery gives); where kubelet's
test tables number cores differently, that numbering keeps the same order, so every ordering rule (free count,
then id) gives the same answer. ``quad_socket_four_way_ht`` keeps kubelet's own core labels (core ids are only
labels). Uncore ids default to 0 like kubelet's zero-valued
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


# topoQuadSocketFourWayHT (Knights Landing, SNC4, from hwloc's lstopo picture): 288 CPUs, 4 sockets = 4 NUMA
# nodes, 72 cores of 4 threads. Per socket: kubelet's core label and its four CPUs.
_QUAD_SOCKET_FOUR_WAY_HT: tuple[tuple[tuple[int, tuple[int, int, int, int]], ...], ...] = (
    ((0, (0, 169, 109, 229)), (1, (50, 170, 110, 230)), (64, (1, 25, 13, 38)), (65, (2, 26, 14, 39)),
     (72, (9, 33, 21, 46)), (73, (10, 34, 22, 47)), (8, (57, 177, 117, 237)), (9, (58, 178, 118, 238)),
     (24, (71, 191, 131, 251)), (25, (72, 192, 132, 252)), (32, (79, 199, 139, 259)), (33, (80, 200, 140, 260)),
     (40, (87, 207, 147, 267)), (41, (88, 208, 148, 268)), (48, (95, 215, 155, 275)), (49, (96, 216, 156, 276)),
     (56, (103, 223, 163, 283)), (57, (104, 224, 164, 284))),
    ((66, (3, 27, 15, 40)), (67, (4, 28, 16, 41)), (74, (11, 35, 23, 48)), (75, (12, 36, 24, 49)),
     (2, (51, 171, 111, 231)), (3, (52, 172, 112, 232)), (10, (59, 179, 119, 239)), (11, (60, 180, 120, 240)),
     (18, (65, 185, 125, 245)), (19, (66, 186, 126, 246)), (26, (73, 193, 133, 253)), (27, (74, 194, 134, 254)),
     (34, (81, 201, 141, 261)), (35, (82, 202, 142, 262)), (42, (89, 209, 149, 269)), (43, (90, 210, 150, 270)),
     (50, (97, 217, 157, 277)), (51, (98, 218, 158, 278))),
    ((68, (5, 29, 17, 42)), (69, (6, 30, 18, 43)), (4, (53, 173, 113, 233)), (5, (54, 174, 114, 234)),
     (12, (61, 181, 121, 241)), (13, (62, 182, 122, 242)), (20, (67, 187, 127, 247)), (21, (68, 188, 128, 248)),
     (28, (75, 195, 135, 255)), (29, (76, 196, 136, 256)), (36, (83, 203, 143, 263)), (37, (84, 204, 144, 264)),
     (44, (91, 211, 151, 271)), (45, (92, 212, 152, 272)), (52, (99, 219, 159, 279)), (53, (100, 220, 160, 280)),
     (60, (105, 225, 165, 285)), (61, (106, 226, 166, 286))),
    ((70, (7, 31, 19, 44)), (71, (8, 32, 20, 45)), (63, (37, 168, 108, 228)), (62, (107, 227, 167, 287)),
     (6, (55, 175, 115, 235)), (7, (56, 176, 116, 236)), (14, (63, 183, 123, 243)), (15, (64, 184, 124, 244)),
     (22, (69, 189, 129, 249)), (23, (70, 190, 130, 250)), (30, (77, 197, 137, 257)), (31, (78, 198, 138, 258)),
     (38, (85, 205, 145, 265)), (39, (86, 206, 146, 266)), (46, (93, 213, 153, 273)), (47, (94, 214, 154, 274)),
     (54, (101, 221, 161, 281)), (55, (102, 222, 162, 282))),
)


def quad_socket_four_way_ht() -> Topology:
    """topoQuadSocketFourWayHT with kubelet's core labels (CPU 1's core is 64; core 0 holds CPUs 0,109,169,229).
    Uncore ids are 0 like kubelet's zero-valued UncoreCacheID."""
    cpus = tuple(CPUInfo(cpu=cpu, core=core, socket=socket, numa=socket, uncore=0)
                 for socket, cores in enumerate(_QUAD_SOCKET_FOUR_WAY_HT) for core, threads in cores for cpu in threads)
    return Topology(cpus=cpus, numa_nodes=())


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
    "quad_socket_four_way_ht": quad_socket_four_way_ht,
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
