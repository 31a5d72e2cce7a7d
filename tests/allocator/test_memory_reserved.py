"""``--reserved-memory`` parsing and kubelet's start-up check against Node Allocatable (allocator.memory.reserved).

The error texts are kubelet's (its spelling included: operators search for them)."""

from __future__ import annotations

import pytest

from allocator.errors import ConfigError
from allocator.memory import (
    MachineMemory,
    node_allocatable_reservation,
    parse_reserved_memory,
    reserved_memory_from_config,
    system_reserved_memory,
)
from allocator.memory.quantity_text import ByteQuantity

GI = 1 << 30
MI = 1 << 20
MACHINE = MachineMemory.uniform((0, 1), 64 * GI, ((2 * MI, 512), (GI, 2)))


def test_flag_in_kubelets_format():
    r = parse_reserved_memory("0:memory=1Gi,hugepages-2Mi=0;1:memory=2Gi")
    assert [(x.numa_node, [(n, q.value) for n, q in x.limits]) for x in r] == [
        (0, [("memory", GI), ("hugepages-2Mi", 0)]), (1, [("memory", 2 * GI)])]
    assert r[0].to_flag() == "0:memory=1Gi,hugepages-2Mi=0"
    assert parse_reserved_memory("") == ()


@pytest.mark.parametrize(("text", "message"), [
    ("0memory=1Gi", "the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...], "
                    "got 0memory=1Gi"),
    ("0:1:memory=1Gi", "the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...]"
                       ", got 0:1:memory=1Gi"),
    ("a:memory=1Gi", "failed to convert the NUMA node ID, exptected integer, got a"),
    ("0:memory", "the reserved limit has incorrect value, expected type=quantatity, got memory"),
    ("0:memory=1Gi,", "the reserved limit has incorrect value, expected type=quantatity, got "),
    ("0:cpu=1", 'memory type conversion error, unknown type: "cpu"'),
    ("0:memory=lots", "failed to parse the quantatity, expected quantatity, got lots"),
    ("0:memory=1Gi;", "the reserved memory has incorrect format, expected numaNodeID:type=quantity[,type=quantity...]"
                      ", got "),
])
def test_flag_errors_are_kubelets(text, message):
    with pytest.raises(ConfigError) as e:
        parse_reserved_memory(text)
    assert str(e.value) == message


def test_config_file_form():
    r = reserved_memory_from_config([{"numaNode": 0, "limits": {"memory": "1100Mi"}},
                                     {"numaNode": 1, "limits": {"memory": 1024, "hugepages-1Gi": "1Gi"}}])
    assert [(x.numa_node, dict((n, q.value) for n, q in x.limits)) for x in r] == [
        (0, {"memory": 1100 * MI}), (1, {"memory": 1024, "hugepages-1Gi": GI})]
    for bad, match in (({"numaNode": "0"}, "numaNode"), ({"numaNode": 0, "limits": {"cpu": "1"}}, "unknown type"),
                       ({"numaNode": 0, "limits": {"memory": True}}, "quantity"), ("x", "object")):
        with pytest.raises(ConfigError, match=match):
            reserved_memory_from_config([bad])
    with pytest.raises(ConfigError, match="list"):
        reserved_memory_from_config({"numaNode": 0})


@pytest.mark.parametrize(("value", "text"), [
    (ByteQuantity(0), "0"), (ByteQuantity(GI, True), "1Gi"), (ByteQuantity(16484 * MI, True), "16484Mi"),
    (ByteQuantity(1000, True), "1k"), (ByteQuantity(1500 * 10**6), "1500M"), (ByteQuantity(104857600), "104857600"),
    (ByteQuantity(1025, True), "1025"), (ByteQuantity(GI + 1, True), "1073741825"),
])
def test_quantities_print_as_kubelet_prints_them(value, text):
    assert str(value) == text


def test_node_allocatable_sums_reservations_and_eviction():
    na = node_allocatable_reservation(memory_capacity=128 * GI, kube_reserved={"memory": "16Gi", "cpu": "4"})
    assert str(na["memory"]) == "16484Mi" and set(na) == {"memory"}  # default eviction threshold 100Mi
    na = node_allocatable_reservation(memory_capacity=128 * GI, system_reserved={"memory": "1G"},
                                      kube_reserved={"memory": "1Gi", "hugepages-2Mi": "4Mi"}, eviction_hard=None)
    assert na["memory"].value == 10**9 + GI and str(na["memory"]) == "2073741824"  # the first addend's format
    assert na["hugepages-2Mi"].value == 4 * MI
    na = node_allocatable_reservation(memory_capacity=100 * GI, eviction_hard="memory.available<1%")
    assert na["memory"].value == GI
    with pytest.raises(ConfigError, match="percentage"):
        node_allocatable_reservation(memory_capacity=GI, eviction_hard="x%")


def test_reservations_must_add_up_to_node_allocatable():
    na = node_allocatable_reservation(memory_capacity=128 * GI, kube_reserved={"memory": "2Gi"})
    good = parse_reserved_memory("0:memory=1124Mi;1:memory=1Gi")
    assert system_reserved_memory(MACHINE, good, na) == {0: {"memory": 1124 * MI}, 1: {"memory": GI}}
    with pytest.raises(ConfigError) as e:
        system_reserved_memory(MACHINE, parse_reserved_memory("0:memory=1Gi;1:memory=1Gi"), na)
    assert str(e.value) == ('the total amount "2Gi" of type "memory" is not equal to the value "2148Mi" determined by '
                            'Node Allocatable feature')
    with pytest.raises(ConfigError) as e:
        system_reserved_memory(MACHINE, (), na)
    assert str(e.value) == ('the total amount "0" of type "memory" is not equal to the value "2148Mi" determined by '
                            'Node Allocatable feature')
    # huge pages reserved per node must match what Node Allocatable reserves of them too
    with pytest.raises(ConfigError, match='of type "hugepages-2Mi" is not equal to the value "0"'):
        system_reserved_memory(MACHINE, parse_reserved_memory("0:memory=1124Mi,hugepages-2Mi=2Mi;1:memory=1Gi"), na)


def test_unknown_node_and_no_memory_at_all():
    na = node_allocatable_reservation(memory_capacity=128 * GI)
    with pytest.raises(ConfigError) as e:
        system_reserved_memory(MACHINE, parse_reserved_memory("2:memory=100Mi"), na)
    assert str(e.value) == "the reserved memory configuration references a NUMA node 2 that does not exist on this " \
                           "machine"
    with pytest.raises(ConfigError) as e:
        system_reserved_memory(MACHINE, (), {})
    assert str(e.value) == "[memorymanager] you should specify the system reserved memory"


def test_duplicate_entries_count_twice_in_the_sum_and_the_last_wins():
    na = node_allocatable_reservation(memory_capacity=128 * GI, eviction_hard="200Mi")
    r = parse_reserved_memory("0:memory=100Mi;0:memory=100Mi")
    assert system_reserved_memory(MACHINE, r, na) == {0: {"memory": 100 * MI}, 1: {}}
