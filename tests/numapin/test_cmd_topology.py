"""``numapin topology`` on generated sysfs trees, through the real CLI entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from allocator import CPUSet, Topology
from numapin.cli import main
from numapin.render import core_cell, render_topology

REPO = Path(__file__).resolve().parents[2]


def test_text_drawing(sysfs_machine, capsys):
    root = sysfs_machine("epyc-7763-nps4")
    assert main(["topology", "--sysfs", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Node: 256 CPUs, 128 cores, 2 thread(s) per core, 2 socket(s), 8 NUMA node(s), 16 L3")
    assert "Socket 1 (128 CPUs)" in out
    assert "  NUMA node 5 (32 CPUs: 80-95,208-223)" in out
    assert "    L3 1 (8 cores)\n      [8 136] [9 137] [10 138]" in out
    assert "NUMA distances:" in out


def test_json_is_a_topology(sysfs_machine, capsys):
    root = sysfs_machine("cpuless-node")
    assert main(["topology", "--sysfs", str(root), "--format", "json"]) == 0
    t = Topology.from_dict(json.loads(capsys.readouterr().out))
    assert t == Topology.from_sysfs(root) and t.numa_nodes == (0, 1, 2)


def test_cpuless_and_offline_drawn(sysfs_machine, capsys):
    assert main(["topology", "--sysfs", str(sysfs_machine("cpuless-node"))]) == 0
    assert "NUMA node 2 (no CPUs: memory only)" in capsys.readouterr().out
    assert main(["topology", "--sysfs", str(sysfs_machine("offline-8"))]) == 0
    out = capsys.readouterr().out
    assert "[0 4] [2 6] [5]" in out and "5 CPUs" in out


def test_bad_root_exits_2_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "numapin", "topology", "--sysfs", str(tmp_path / "nope")],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 2
    assert "--sysfs" in proc.stderr and "a sysfs root" in proc.stderr and "Traceback" not in proc.stderr


def test_marks():
    assert core_cell(CPUSet.parse("1,57"), {1: "A"}) == "[1A 57.]"
    assert core_cell(CPUSet.parse("1,57")) == "[1 57]"
    t = Topology.from_dict({"cpus": [{"cpu": i, "core": i, "socket": 0, "numa": 0} for i in range(2)]})
    drawing = render_topology(t, marks={1: "A"}, legend=[("A", "default/p app")])
    assert "Marks: A = default/p app" in drawing and "[0.] [1A]" in drawing


def test_state_marks():
    from allocator import CPUState
    from numapin.render import state_marks

    state = CPUState(default_cpuset=CPUSet.parse("0,3"))
    state.set("u1", "app", CPUSet.parse("1"), "share")
    state.set("u2", "db", CPUSet.parse("2"))
    marks, legend = state_marks(state, CPUSet.parse("0"), names={"u1": "ns/web"})
    assert marks == {0: "*", 1: "A", 2: "B"}
    assert legend == [("*", "reserved"), ("A", "ns/web app (share)"), ("B", "u2 db (exclusive)"), (".", "shared pool")]
