import random

import pytest

from allocator import CPUInfo, CPUSet, Topology, TopologyError


def small() -> Topology:
    # 2 sockets x 2 cores x 2 threads; cpu n and n+4 are siblings
    cpus = []
    for cpu in range(8):
        core = cpu % 4
        socket = core // 2
        cpus.append({"cpu": cpu, "core": core, "socket": socket, "numa": socket, "uncore": socket})
    return Topology.from_dict({"cpus": cpus, "numaDistances": {"0": [10, 21], "1": [21, 10]}})


def test_queries():
    t = small()
    assert t.num_cpus == 8 and t.num_cores == 4 and t.threads_per_core == 2
    assert t.cpus_in_numa(1) == CPUSet.parse("2-3,6-7")
    assert t.cpus_in_core(1) == CPUSet.parse("1,5")
    assert t.core_siblings(CPUSet.parse("0,3")) == CPUSet.parse("0,3-4,7")
    assert t.numa_of(CPUSet.parse("0,6")) == CPUSet.parse("0-1")
    assert t.distance(0, 1) == 21 and t.distance(1, 1) == 10


def test_round_trip_and_memory_only_nodes():
    t = small()
    assert Topology.from_dict(t.to_dict()) == t
    d = t.to_dict()
    d["numaNodes"] = [0, 1, 2]
    del d["numaDistances"]
    t2 = Topology.from_dict(d)
    assert t2.numa_nodes == (0, 1, 2) and t2.cpu_numa_nodes == (0, 1)
    assert t2.cpus_in_numa(2) == CPUSet()


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({}, "topology.cpus"),
        ({"cpus": [{"cpu": 0, "core": 0, "socket": 0}]}, "topology.cpus[0].numa"),
        ({"cpus": [{"cpu": -1, "core": 0, "socket": 0, "numa": 0}]}, "topology.cpus[0].cpu"),
        ({"cpus": [{"cpu": 1, "core": 1, "socket": 0, "numa": 0}] * 2}, "listed twice"),
        (
            {"cpus": [{"cpu": 0, "core": 1, "socket": 0, "numa": 0}, {"cpu": 1, "core": 1, "socket": 1, "numa": 0}]},
            "cannot be threads of one core",
        ),
        (
            {"cpus": [{"cpu": 0, "core": 1, "socket": 0, "numa": 0}, {"cpu": 1, "core": 1, "socket": 0, "numa": 1}]},
            "cannot be threads of one core",
        ),
        ({"cpus": [{"cpu": 0, "core": 0, "socket": 0, "numa": 0}], "numaDistances": {"0": [10, 20]}},
         "one distance per NUMA node"),
    ],
)
def test_bad_documents(doc, fragment):
    with pytest.raises(TopologyError) as e:
        Topology.from_dict(doc)
    assert fragment in str(e.value)


def test_core_ids_are_labels():
    """kubelet's machines number cores freely (its quad-socket four-way-HT test machine gives CPU 1 core 64):
    a core id need not be the lowest id of its threads, and it orders cores like kubelet does."""
    cpus = [{"cpu": 0, "core": 7, "socket": 0, "numa": 0}, {"cpu": 2, "core": 7, "socket": 0, "numa": 0},
            {"cpu": 1, "core": 3, "socket": 0, "numa": 0}, {"cpu": 3, "core": 3, "socket": 0, "numa": 0}]
    t = Topology.from_dict({"cpus": cpus})
    assert t.cores == (3, 7)
    assert t.cpus_in_core(7) == CPUSet.parse("0,2") and t.cpus_in_core(3) == CPUSet.parse("1,3")
    assert t.cpu(0).core == 7 and Topology.from_dict(t.to_dict()) == t


@pytest.mark.parametrize("seed", range(3))
def test_relabelled_cores_allocate_alike(seed):
    """Seeded: core labels renumbered in the same order (as kubelet's machines do) change no allocation; labels
    in any order keep the same cores (only the tie-breaking order may differ)."""
    from allocator import take_by_topology
    from tests.topologies import MACHINES

    rng = random.Random(seed)
    for name in sorted(MACHINES):
        t = MACHINES[name]()
        if t.num_cpus > 128:
            continue
        ranks = {core: i for i, core in enumerate(t.cores)}
        spaced = sorted(rng.sample(range(10 * len(ranks) + 10), len(ranks)))
        same_order = Topology(cpus=tuple(CPUInfo(c.cpu, spaced[ranks[c.core]], c.socket, c.numa, c.uncore)
                                         for c in t.cpus), numa_nodes=t.numa_nodes)
        shuffled_labels = rng.sample(range(1000), len(ranks))
        shuffled = Topology(cpus=tuple(CPUInfo(c.cpu, shuffled_labels[ranks[c.core]], c.socket, c.numa, c.uncore)
                                       for c in t.cpus), numa_nodes=t.numa_nodes)
        assert {t.cpus_in_core(k) for k in t.cores} == {shuffled.cpus_in_core(k) for k in shuffled.cores}
        for _ in range(20):
            available = CPUSet(c for c in t.all_cpus if rng.random() < 0.7)
            count = rng.randint(0, len(available))
            opts = rng.choice([{}, {"full-pcpus-only": "true"}, {"distribute-cpus-across-cores": "true"}])
            want = take_by_topology(t, available, count, opts)
            assert take_by_topology(same_order, available, count, opts) == want, (name, seed)
            assert len(take_by_topology(shuffled, available, count, opts)) == count
