"""The queue that brings containerd's records up to date after direct cgroup writes: one update per container at
containerd at a time and in decision order, a newer value replacing one not sent yet, refused ones sent again,
and ``quiesce`` waiting for an update at containerd with another value than the one being written. The sender here is
the test's own (the real one, against containerd, is covered by test_converge_containerd)."""

from __future__ import annotations

import asyncio
import random

from allocator.cpuset import CPUSet
from nodeagent.decisions.registry import Tracked
from nodeagent.node.records import Record, RecordQueue


def tracked(i: int) -> Tracked:
    return Tracked(f"c{i}", "sb", "uid", "default/web", f"w{i}", "shared")


class Containerd:
    """Takes record updates; each waits until released (``auto`` releases at once), refuses while ``refusing``."""

    def __init__(self, auto: bool = True) -> None:
        self.auto = auto
        self.refusing = False
        self.at_once: dict[str, int] = {}
        self.most = 0
        self.landed: dict[str, list[str]] = {}
        self.gates: list[asyncio.Event] = []

    async def send(self, r: Record) -> bool:
        cid = r.container.id
        self.at_once[cid] = self.at_once.get(cid, 0) + 1
        assert self.at_once[cid] == 1, "two updates of one container at containerd at once"
        self.most = max(self.most, sum(self.at_once.values()))
        try:
            if not self.auto:
                gate = asyncio.Event()
                self.gates.append(gate)
                await gate.wait()
            else:
                await asyncio.sleep(random.random() / 1000)
            if self.refusing:
                return False
            self.landed.setdefault(cid, []).append(str(r.cpus))
            return True
        finally:
            self.at_once[cid] -= 1


async def test_updates_of_one_container_land_one_at_a_time_and_the_newest_last() -> None:
    random.seed(5)
    c = Containerd()
    q = RecordQueue(c.send, fanout=3, delay=0)
    ts = [tracked(i) for i in range(10)]
    for value in ("0", "0-1", "0-2", "0-3"):
        for t in ts:
            q.put(Record(t, CPUSet.parse(value), None))
        await asyncio.sleep(0.001)
    assert await q.settle(5)
    assert c.most <= 3
    assert all(landed[-1] == "0-3" for landed in c.landed.values()) and len(c.landed) == 10
    assert q.pending == 0


async def test_refused_updates_are_sent_again_for_live_containers_only() -> None:
    c = Containerd()
    q = RecordQueue(c.send, delay=0)
    c.refusing = True
    a, b = tracked(1), tracked(2)
    q.put(Record(a, CPUSet.parse("0"), None))
    q.put(Record(b, CPUSet.parse("0"), None))
    assert await q.settle(5)
    assert q.pending == 2 and c.landed == {}
    c.refusing = False
    assert q.retry(["c1"]) == 1  # c2 is gone
    assert await q.settle(5)
    assert c.landed == {"c1": ["0"]} and q.pending == 0


async def test_quiesce_waits_for_an_update_with_another_value() -> None:
    c = Containerd(auto=False)
    q = RecordQueue(c.send, delay=0, timeout=5)
    t = tracked(1)
    q.put(Record(t, CPUSet.parse("0-3"), None))  # a widening at containerd
    await asyncio.sleep(0)
    assert await q.quiesce("c1", CPUSet.parse("0-3"), None)  # the value being written: no wait
    assert not q.busy("c1", CPUSet.parse("0-3"), None) and not q.busy("c2")  # what the pusher asks before waiting
    assert q.busy("c1", CPUSet.parse("0"), None) and q.busy("c1")
    narrowing = asyncio.create_task(q.quiesce("c1", CPUSet.parse("0"), None))
    widening = asyncio.create_task(q.quiesce("c1", CPUSet.parse("0-7"), None))
    await asyncio.sleep(0.01)
    # landing after the write, the update would undo the narrowing, or keep the container off CPUs just given
    assert not narrowing.done() and not widening.done()
    c.gates[0].set()
    assert await narrowing and await widening
    q.put(Record(t, CPUSet.parse("0-7"), None))
    await asyncio.sleep(0)
    q.timeout = 0.05
    assert not await q.quiesce("c1", CPUSet.parse("0"), None)  # containerd hangs: said so
    c.gates[1].set()
    assert await q.settle(5)


async def test_a_value_not_sent_yet_is_replaced_and_drop_forgets_it() -> None:
    c = Containerd(auto=False)
    q = RecordQueue(c.send, fanout=1, delay=0)
    a, b = tracked(1), tracked(2)
    q.put(Record(a, CPUSet.parse("0"), None))
    await asyncio.sleep(0)
    q.put(Record(b, CPUSet.parse("0"), None))   # waits: fan-out 1
    q.put(Record(b, CPUSet.parse("0-1"), None))  # replaces it
    q.put(Record(a, CPUSet.parse("0-2"), None))  # after the one at containerd
    q.drop("c2")
    c.auto = True
    c.gates[0].set()
    assert await q.settle(5)
    assert c.landed == {"c1": ["0", "0-2"]}


async def test_records_wait_their_delay_and_refused_ones_go_at_once_when_retried() -> None:
    c = Containerd()
    q = RecordQueue(c.send, delay=2.0)
    t = tracked(1)
    q.put(Record(t, CPUSet.parse("0"), None))
    await asyncio.sleep(0.01)
    assert c.landed == {} and q.pending == 1  # the start that caused the narrowing goes first
    assert await q.settle(10)
    assert c.landed == {"c1": ["0"]}
    q.delay = 0
    c.refusing = True
    q.put(Record(t, CPUSet.parse("0-1"), None))
    assert await q.settle(5) and q.pending == 1
    c.refusing = False
    q.delay = 600  # a retry does not wait for it
    q.retry(["c1"])
    assert await q.settle(5)
    assert c.landed == {"c1": ["0", "0-1"]}
