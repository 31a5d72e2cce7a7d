"""Every scenario in examples/ through the real ``numapin plan`` command, checked against its ``expect``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (REPO / "examples").iterdir() if p.suffix in (".yaml", ".yml"))


def test_the_documented_examples_are_there():
    assert {p.name for p in EXAMPLES} >= {
        "guaranteed-2cpu.yaml", "guaranteed-1500m.yaml", "socket-56cpu.yaml", "single-numa-node-reject.yaml",
        "crane-share.yaml", "memory-static.yaml",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example(path):
    expect = yaml.safe_load(path.read_text())["expect"]
    proc = subprocess.run([sys.executable, "-m", "numapin", "plan", str(path), "--format", "json"],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    pods = json.loads(proc.stdout)["pods"]
    assert len(pods) == len(expect)
    for got, want in zip(pods, expect, strict=True):
        assert got["admitted"] == want["admitted"], got
        assert got["reason"] == want.get("reason"), got
        for name, fields in want["containers"].items():
            c = next(c for c in got["containers"] if c["name"] == name)
            for key, value in fields.items():
                assert c[key] == value, (path.name, got["name"], name, key, c)


@pytest.mark.parametrize("fmt", ["summary", "text"])
def test_human_formats(fmt):
    path = REPO / "examples" / "crane-share.yaml"
    proc = subprocess.run([sys.executable, "-m", "numapin", "plan", str(path), "--format", fmt],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "pod default/shared-pinned: admitted" in out
    assert "app container app: share, cpus 1-2,57-58, mems 0" in out
    assert "app container app: shared, cpus shared pool 0-2,5-58,61-111, mems 0-1" in out
    if fmt == "text":
        assert "A = default/shared-pinned app (share)" in out and "* = reserved" in out
        assert "[0* 56*] [1A 57A] [2A 58A] [3B 59B]" in out


def test_memory_per_numa_node_in_the_plan():
    path = REPO / "examples" / "memory-static.yaml"
    proc = subprocess.run([sys.executable, "-m", "numapin", "plan", str(path)], capture_output=True, text=True,
                          cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "pod default/too-big: REJECTED TopologyAffinityError" in out and "memory 100Gi asked" in out
    assert "memory per NUMA node (Memory Manager policy Static):" in out
    assert "hugepages-1Gi 2Gi free of 4Gi allocatable (2Gi held, 0 reserved for the system, 4Gi total)" in out
    assert "default/pages app: hugepages-1Gi 2Gi on NUMA node(s) 1" in out
    proc = subprocess.run([sys.executable, "-m", "numapin", "plan", str(path), "--format", "json"],
                          capture_output=True, text=True, cwd=REPO, check=False)
    memory = json.loads(proc.stdout)["memory"]
    assert memory["nodes"]["0"]["resources"]["memory"]["reserved"] == 40 << 30
    assert {(h["pod"], h["type"], tuple(h["numaNodes"])) for h in memory["holders"]} == {
        ("default/first", "memory", (0,)), ("default/second", "memory", (1,)), ("default/pages", "memory", (1,)),
        ("default/pages", "hugepages-1Gi", (1,))}
