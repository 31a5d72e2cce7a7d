import pytest

from allocator import CPUSet, Topology, TopologyError


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
