"""The start guard within NRI's request timeout: containerd drops a plugin that answers StartContainer late (2 s by
default) and starts the container without it, so an exclusive start whose CPUs are not clear by the runtime's
deadline is refused in time (UNAVAILABLE, kubelet retries), with a log line naming what was not clear.

The kernel is a tree of real files (``tests/criproxy/test_kernel.py``'s): a running shared container whose process
keeps the exclusive CPU whatever numapin writes to its cgroup, the case the guard cannot repair."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc
import pytest

from allocator.cpuset import CPUSet
from nodeagent.decisions.registry import Registry, Tracked
from nodeagent.decisions.starts import StartGuard
from nodeagent.node.converge import Converger, Decision
from nodeagent.node.cpuset_pusher import CpusetPusher
from nodeagent.node.cri_runtime import CriChannel, CriRuntime
from nodeagent.node.kernel import CgroupLayout
from nodeagent.rejection import Rejection
from nriplugin.door.records import EventRecords
from tests.criproxy.test_kernel import fake_tree

EXCL = CPUSet.parse("2")
POOL = CPUSet.parse("0-1,3")
MEMS = CPUSet.parse("0")


def _decide(t: Tracked) -> Decision:
    return Decision(EXCL if t.mode == "exclusive" else POOL, MEMS)


async def test_an_exclusive_start_not_clear_by_the_runtimes_deadline_is_refused_with_what_was_not_clear(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    roots = fake_tree(tmp_path, unified=True, cgroup="/k/web", cpus="0-3", mems="0", procs={7: ("0-3", "0")})
    layout = CgroupLayout.detect(roots)
    registry = Registry()
    registry.add(Tracked("web0123456789abcdef", "sb-web", "uid-web", "default/web", "app", "shared", POOL, MEMS))
    registry.add(Tracked("db0123456789abcdef", "sb-db", "uid-db", "default/db", "main", "exclusive", EXCL, MEMS))
    pusher = CpusetPusher(EventRecords(), registry, layout=layout)
    pusher.cgroups["web0123456789abcdef"] = "/k/web"  # as NRI names it; the runtime is never asked
    channel = CriChannel(f"unix://{tmp_path}/no-runtime.sock")
    try:
        converger = Converger(CriRuntime(channel.call), registry, pusher, layout, _decide)
        guard = StartGuard(registry, converger, _decide, clear_timeout=30.0)
        started: list[str] = []

        async def run() -> None:
            started.append("db")

        with caplog.at_level(logging.WARNING, logger="numapin.criproxy"), pytest.raises(Rejection) as refused:
            await guard.start("db0123456789abcdef", run, within=0.3)
    finally:
        await channel.close()
    assert started == []
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    assert refused.value.message == (
        "numapin: pod default/db container main not started: its exclusive CPUs 2 are still used by running "
        "container(s) default/web app (cpus 2) and could not be taken back before the runtime's deadline for the "
        "answer")
    assert ("start pod=default/db container=main (exclusive cpus=2) refused before the runtime's deadline for the "
            "answer: not yet clear of running container(s) default/web app (cpus 2)") in caplog.messages
    assert not pusher.gate.busy  # the gate is free for the next start or narrowing
