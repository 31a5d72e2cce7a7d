"""``numapin plan`` on scenarios beyond the examples: sysfs topologies, a state to start from, devices, hint
families on a 16-NUMA-node machine."""

from __future__ import annotations

import json

import yaml

from allocator import CheckpointStore, CPUSet, CPUState
from numapin.cli import main


def pod(name: str, cpu: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "app", "resources": {"limits": {"cpu": cpu, "memory": "1Gi"}}}]}}


def run_json(capsys, tmp_path, doc: dict, *extra: str) -> dict:
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["plan", str(path), "--format", "json", *extra]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_sixteen_numa_nodes_with_a_device(sysfs_machine, tmp_path, capsys):
    root = sysfs_machine("numa-16")
    doc = {"topology": f"sysfs:{root}", "numReservedCPUs": 2, "topologyManagerPolicy": "restricted",
           "devices": {"p": {"app": {"example.com/gpu": [3]}}}, "pods": [pod("p", "6")]}
    out = run_json(capsys, tmp_path, doc)
    c = out["pods"][0]["containers"][0]
    assert out["pods"][0]["admitted"] and c["mems"] == "3" and c["cpus"] == "12-14,76-78"
    assert c["affinity"] == {"numa": [3], "preferred": True}
    assert c["hints"]["example.com/gpu"]["family"]["required"] == [3]
    # more than 8 NUMA nodes: the CPU hints are a family (every NUMA set with enough free CPUs), never 2^16 lists
    family = c["hints"]["cpu"]["family"]
    assert family["threshold"] == 6 and family["preferredSize"] == 1 and family["universe"] == list(range(16))
    assert out["reservedCPUs"] == "0,64"
    path = tmp_path / "scenario.yaml"
    assert main(["plan", str(path)]) == 0
    text = capsys.readouterr().out
    assert "example.com/gpu hints: every NUMA set holding {3}; preferred: 1 node(s)" in text
    assert "cpu hints: every NUMA set with at least 6 free; preferred: 1 node(s)" in text


def test_starting_from_a_saved_state(tmp_path, capsys, sysfs_machine):
    """A state written by numapin (the state file's JSON) is where the plan starts."""
    root = sysfs_machine("e5-2680v3")
    state = CPUState(default_cpuset=CPUSet.parse("0,2-24,26-47"))
    state.set("old", "app", CPUSet.parse("1,25"))
    CheckpointStore(tmp_path / "state").save(state)
    saved = json.loads((tmp_path / "state").read_text())
    doc = {"topology": f"sysfs:{root}", "reservedCPUs": "0,24", "state": saved, "pods": [pod("p", "2")]}
    out = run_json(capsys, tmp_path, doc)
    assert out["pods"][0]["containers"][0]["cpus"] == "2,26"
    assert out["sharedPool"] == "0,3-24,27-47"


def test_text_drawing_marks_containers(tmp_path, capsys, sysfs_machine):
    root = sysfs_machine("e5-2680v3")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"topology": f"sysfs:{root}", "reservedCPUs": "0,24",
                                    "pods": [pod("a", "2"), pod("b", "4"), pod("c", "500m")]}))
    assert main(["plan", str(path), "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert "Marks: * = reserved  A = ns/a app (exclusive)  B = ns/b app (exclusive)  . = shared pool" in out
    assert "[0* 24*] [1A 25A] [2B 26B] [3B 27B] [4. 28.]" in out
    assert "app container app: shared, cpus shared pool 0,4-24,28-47, mems 0-1" in out


def test_feature_gates_decide_what_a_pod_with_pod_level_resources_gets(tmp_path, capsys, sysfs_machine):
    """kubelet's featureGates in the scenario: PodLevelResourceManagers pins the container Guaranteed on its own."""
    root = sysfs_machine("e5-2680v3")
    p = pod("p", "2")
    p["spec"]["resources"] = {"limits": {"cpu": "2", "memory": "1Gi"}}
    doc = {"topology": f"sysfs:{root}", "reservedCPUs": "0,24", "pods": [p]}
    assert run_json(capsys, tmp_path, doc)["pods"][0]["containers"][0]["mode"] == "shared"  # kubelet's default
    doc["featureGates"] = {"PodLevelResourceManagers": True}
    c = run_json(capsys, tmp_path, doc)["pods"][0]["containers"][0]
    assert c["mode"] == "exclusive" and len(CPUSet.parse(c["cpus"])) == 2
