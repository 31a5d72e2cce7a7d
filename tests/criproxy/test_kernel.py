"""Reading a container's real cpuset: cgroup v1 and v2 layouts (real files in a temporary tree), systemd
cgroup paths, and this very process as a container of the host."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from allocator.cpuset import CPUSet
from nodeagent.decisions.gate import PoolGate
from nodeagent.node.kernel import (
    CgroupLayout,
    KernelReader,
    KernelRoots,
    cgroup_of_pid,
    cgroup_of_spec,
    read_view,
    read_views,
    write_cpuset,
)


def fake_tree(root: Path, *, unified: bool, cgroup: str, cpus: str, mems: str, procs: dict[int, tuple[str, str]]
              ) -> KernelRoots:
    proc, cg = root / "proc", root / "cgroup"
    d = cg / cgroup.lstrip("/") if unified else cg / "cpuset" / cgroup.lstrip("/")
    d.mkdir(parents=True)
    if unified:
        (cg / "cgroup.controllers").write_text("cpuset cpu memory\n")
    suffix = ".effective" if unified else ""
    (d / f"cpuset.cpus{suffix}").write_text(cpus + "\n")
    (d / f"cpuset.mems{suffix}").write_text(mems + "\n")
    (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in procs))
    for pid, (pc, pm) in procs.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "status").write_text(f"Name:\tsleep\nCpus_allowed:\tff\nCpus_allowed_list:\t{pc}\n"
                                                f"Mems_allowed_list:\t{pm}\n")
        line = f"0::{cgroup}\n" if unified else f"3:cpuset:{cgroup}\n1:cpu,cpuacct:{cgroup}\n"
        (proc / str(pid) / "cgroup").write_text(line)
    return KernelRoots(proc, cg)


@pytest.mark.parametrize("unified", [False, True], ids=["cgroup-v1", "cgroup-v2"])
def test_view_of_a_container(tmp_path: Path, unified: bool) -> None:
    roots = fake_tree(tmp_path, unified=unified, cgroup="/kubepods/podu/abc", cpus="0,3-7", mems="0-1",
                      procs={41: ("0,3-7", "0-1"), 42: ("3", "0")})
    layout = CgroupLayout.detect(roots)
    assert layout.unified is unified
    assert cgroup_of_pid(roots, 41) == "/kubepods/podu/abc"
    v = read_view(layout, "/kubepods/podu/abc")
    assert v is not None and v.running
    assert (v.cpus, v.mems, [t.pid for t in v.tasks]) == (CPUSet.parse("0,3-7"), CPUSet.parse("0-1"), [41, 42])
    assert v.disagreement(CPUSet.parse("0,3-7"), CPUSet.parse("0-1")) is None  # pid 42 narrowed itself: fine
    assert v.disagreement(CPUSet.parse("0,3-6"), None) == "cgroup cpuset.cpus 0,3-7"
    assert v.disagreement(CPUSet.parse("0,3-7"), CPUSet.parse("0")) == "cgroup cpuset.mems 0-1"
    assert v.all_cpus == CPUSet.parse("0,3-7")
    assert read_views(layout, {"x": "/kubepods/podu/abc", "gone": "/kubepods/podu/nope"})["gone"] is None


def test_a_process_outside_its_cgroup_disagrees(tmp_path: Path) -> None:
    roots = fake_tree(tmp_path, unified=False, cgroup="/k/c", cpus="0", mems="0", procs={7: ("0-1", "0")})
    v = read_view(CgroupLayout.detect(roots), "/k/c")
    assert v is not None
    assert v.disagreement(CPUSet.parse("0"), CPUSet.parse("0")) == "pid 7 Cpus_allowed_list 0-1"
    assert v.all_cpus == CPUSet.parse("0-1")


def test_cgroup_without_processes_is_not_running(tmp_path: Path) -> None:
    roots = fake_tree(tmp_path, unified=True, cgroup="/k/c", cpus="0", mems="0", procs={})
    v = read_view(CgroupLayout.detect(roots), "/k/c")
    assert v is not None and not v.running


def test_cgroups_path_forms() -> None:
    assert cgroup_of_spec("/kubepods/burstable/podu/abc") == "/kubepods/burstable/podu/abc"
    assert cgroup_of_spec("kubepods-burstable-podu.slice:cri-containerd:abc") == (
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu.slice/cri-containerd-abc.scope")
    assert cgroup_of_spec("kubepods-podu.slice:cri-containerd:abc") == (
        "/kubepods.slice/kubepods-podu.slice/cri-containerd-abc.scope")
    assert cgroup_of_spec("") is None


def test_this_process_is_read_from_the_real_kernel() -> None:
    roots = KernelRoots()
    layout = CgroupLayout.detect(roots)
    cg = cgroup_of_pid(roots, os.getpid())
    assert cg is not None
    v = read_view(layout, cg)
    assert v is not None and os.getpid() in [t.pid for t in v.tasks]
    assert v.all_cpus.issuperset(CPUSet(os.sched_getaffinity(0)))


async def test_pool_gate_excludes_writers_and_prefers_them() -> None:
    gate, log = PoolGate(), []

    async def reader(i: int, hold: asyncio.Event) -> None:
        async with gate.shared():
            log.append(f"r{i}+")
            await hold.wait()
            log.append(f"r{i}-")

    async def writer() -> None:
        async with gate.exclusive():
            log.append("w+")
            await asyncio.sleep(0)
            log.append("w-")

    hold = asyncio.Event()
    r1 = asyncio.create_task(reader(1, hold))
    r2 = asyncio.create_task(reader(2, hold))
    await asyncio.sleep(0.01)
    w = asyncio.create_task(writer())
    await asyncio.sleep(0.01)
    r3 = asyncio.create_task(reader(3, hold))  # arrives while the writer waits: goes after it
    await asyncio.sleep(0.01)
    assert log == ["r1+", "r2+"]
    hold.set()
    await asyncio.gather(r1, r2, w, r3)
    assert log[:4] == ["r1+", "r2+", "r1-", "r2-"] and log[4:] == ["w+", "w-", "r3+", "r3-"]


async def test_a_writer_that_gives_up_lets_readers_in() -> None:
    gate = PoolGate()
    hold = asyncio.Event()

    async def reader() -> None:
        async with gate.shared():
            await hold.wait()

    r = asyncio.create_task(reader())
    await asyncio.sleep(0.01)
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(gate.exclusive().__aenter__(), 0.05)
    async with asyncio.timeout(5):
        async with gate.shared():
            pass
    hold.set()
    await r


def test_roots_that_hold_no_cgroups_are_named(tmp_path: Path) -> None:
    assert CgroupLayout.detect(KernelRoots()).problem() is None
    bad = CgroupLayout.detect(KernelRoots(Path("/proc"), tmp_path))
    assert bad.problem() == (f"{tmp_path} holds neither a cgroup v2 hierarchy nor a v1 cpuset hierarchy "
                             f"(--cgroup-root)")
    assert CgroupLayout.detect(KernelRoots(tmp_path, Path("/sys/fs/cgroup"))).problem() == (
        f"{tmp_path} is not a proc file system (--proc-root)")


def test_the_reader_rereads_processes_when_the_cgroup_changes(tmp_path: Path) -> None:
    """The reader skips /proc/<pid>/status only while the cgroup's files and process list read as before;
    any change of them, and any view that disagrees with itself, is read afresh."""
    roots = fake_tree(tmp_path, unified=False, cgroup="/k/c", cpus="0-1", mems="0", procs={7: ("0-1", "0")})
    reader = KernelReader(CgroupLayout.detect(roots))
    d = roots.cgroup / "cpuset/k/c"
    status = roots.proc / "7" / "status"
    assert reader.view("/k/c").tasks[0].cpus == CPUSet.parse("0-1")
    # the cpuset narrowed: the kernel moved the process too; both show
    (d / "cpuset.cpus").write_text("0\n")
    status.write_text("Name:\tsleep\nCpus_allowed_list:\t0\nMems_allowed_list:\t0\n")
    v = reader.view("/k/c")
    assert (v.cpus, v.tasks[0].cpus) == (CPUSet.parse("0"), CPUSet.parse("0"))
    # a new process joined: read
    (roots.proc / "8").mkdir()
    (roots.proc / "8" / "status").write_text("Name:\tsh\nCpus_allowed_list:\t0\nMems_allowed_list:\t0\n")
    (d / "cgroup.procs").write_text("7\n8\n")
    assert [t.pid for t in reader.view("/k/c").tasks] == [7, 8]
    # a process outside its cgroup's cpuset: that view is never remembered
    status.write_text("Name:\tsleep\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n")
    (d / "cgroup.procs").write_text("7\n")
    assert reader.view("/k/c").disagreement(CPUSet.parse("0"), None) == "pid 7 Cpus_allowed_list 0-1"
    status.write_text("Name:\tsleep\nCpus_allowed_list:\t0\nMems_allowed_list:\t0\n")
    assert reader.view("/k/c").disagreement(CPUSet.parse("0"), None) is None
    reader.retain([])
    (d / "cgroup.procs").write_text("")
    assert not reader.view("/k/c").running
    assert reader.view("/k/gone") is None


def test_write_cpuset_moves_a_cgroup_and_never_creates_one(tmp_path: Path) -> None:
    roots = fake_tree(tmp_path, unified=False, cgroup="/k/c", cpus="0-1", mems="0", procs={})
    layout = CgroupLayout.detect(roots)
    assert write_cpuset(layout, "/k/c", CPUSet.parse("1"), CPUSet.parse("0")) is None
    assert (roots.cgroup / "cpuset/k/c/cpuset.cpus").read_text() == "1"
    assert (roots.cgroup / "cpuset/k/c/cpuset.mems").read_text() == "0"
    problem = write_cpuset(layout, "/k/not-started", CPUSet.parse("1"), None)
    assert problem is not None and "No such file or directory" in problem
    assert not (roots.cgroup / "cpuset/k/not-started").exists()
