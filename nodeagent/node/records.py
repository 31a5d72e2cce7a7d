"""containerd's record follows the kernel: the ``UpdateContainerResources`` calls that bring containerd's stored
cpuset of running containers up to date after the proxy wrote their cgroups directly.

The kernel is written first (see ``narrowing``); the record updates run in the background, a few at a time
(each makes containerd run ``runc update``, a process start: many at once only slow the node down), and only
``delay`` seconds after the change (the create and start of the exclusive container that caused a narrowing go
first, without a hundred runc processes competing with them). At most one
update per container is at containerd at any moment, and a newer value for a container replaces one still
waiting to be sent, so updates of one container land in the order they were decided. An update that fails is kept
and sent again on the next convergence pass (``retry``); meanwhile the kernel already holds the value, and if
containerd or runc rewrites the stale record into the cgroup, the convergence pass sees it in the kernel and
repairs it.

Before the proxy writes a cgroup, ``quiesce`` waits for that container's update at containerd unless it carries
the very value being written: landing after the write, it would put its older value back into the cgroup (a
widening still landing while a narrowing is written would undo the narrowing; a narrowing still landing while a
widening is written would keep the container off the CPUs it was just given, until the next record or convergence).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from allocator.cpuset import CPUSet
from nodeagent.decisions.registry import Tracked

__all__ = ["Record", "RecordQueue"]

log = logging.getLogger("numapin.criproxy")


@dataclass(frozen=True)
class Record:
    """The cpuset containerd must record for a container."""
    container: Tracked
    cpus: CPUSet
    mems: CPUSet | None

    def same(self, cpus: CPUSet, mems: CPUSet | None) -> bool:
        """Whether this record, landing in the cgroup, leaves ``cpus``/``mems`` there (None: mems not written)."""
        return self.cpus == cpus and (mems is None or self.mems is None or self.mems == mems)


# sends one record; True when containerd took it, False when it must be sent again later
Sender = Callable[[Record], Awaitable[bool]]


class RecordQueue:
    def __init__(self, send: Sender, *, fanout: int = 4, delay: float = 1.0, timeout: float = 10.0) -> None:
        self._send = send
        self.fanout = max(1, fanout)
        self.delay = delay
        self.timeout = timeout
        self._waiting: dict[str, Record] = {}                       # container id -> newest value not sent yet
        self._due: dict[str, float] = {}                            # container id -> not sent before (monotonic)
        self._timer: asyncio.TimerHandle | None = None
        self._sending: dict[str, tuple[Record, asyncio.Task[None]]] = {}  # at containerd now, one per container
        self._failed: dict[str, Record] = {}                        # refused: sent again by ``retry``
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, record: Record) -> None:
        """Bring containerd's record of ``record.container`` to ``record`` (replacing any older one not sent)."""
        cid = record.container.id
        self._failed.pop(cid, None)
        self._waiting[cid] = record
        self._due[cid] = time.monotonic() + self.delay
        self._pump()

    def drop(self, container_id: str) -> None:
        """Forget what is not sent yet for a container (its record is written some other way, or it is gone)."""
        self._waiting.pop(container_id, None)
        self._due.pop(container_id, None)
        self._failed.pop(container_id, None)
        self._note_idle()

    def busy(self, container_id: str, cpus: CPUSet | None = None, mems: CPUSet | None = None) -> bool:
        """Whether an update of the container with another value than ``cpus``/``mems`` (None: any update) is at
        containerd now (``quiesce`` would wait for it)."""
        sending = self._sending.get(container_id)
        return sending is not None and (cpus is None or not sending[0].same(cpus, mems))

    async def quiesce(self, container_id: str, cpus: CPUSet | None = None, mems: CPUSet | None = None) -> bool:
        """Wait until no update of the container with another value than ``cpus``/``mems`` (None: any update) is
        at containerd. False when one still is after ``timeout`` (containerd hangs)."""
        if not self.busy(container_id, cpus, mems):
            return True
        sending = self._sending[container_id]
        try:
            await asyncio.wait_for(asyncio.shield(sending[1]), self.timeout)
        except TimeoutError:
            return False
        return True

    def retry(self, live: Iterable[str]) -> int:
        """Send again what containerd refused, for the containers of ``live`` (the rest are forgotten)."""
        keep = set(live)
        failed, self._failed = self._failed, {}
        n = 0
        for cid, record in failed.items():
            if cid in keep and cid not in self._waiting:
                self._waiting[cid] = record
                self._due[cid] = 0.0
                n += 1
        self._pump()
        return n

    @property
    def pending(self) -> int:
        """Record updates not yet taken by containerd (waiting, at containerd, or refused)."""
        return len(self._waiting) + len(self._sending) + len(self._failed)

    async def settle(self, timeout: float | None = None) -> bool:
        """Wait until nothing waits or is at containerd (refused ones aside). False on ``timeout``."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _pump(self) -> None:
        now = time.monotonic()
        later = None
        for cid in list(self._waiting):
            if len(self._sending) >= self.fanout:
                break
            if cid in self._sending:
                continue  # one at a time per container: the newer value goes once this one is back
            due = self._due.get(cid, 0.0)
            if due > now:
                later = due if later is None else min(later, due)
                continue
            record = self._waiting.pop(cid)
            self._due.pop(cid, None)
            task = asyncio.get_running_loop().create_task(self._one(record))
            self._sending[cid] = (record, task)
        if later is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(later - now, self._tick)
        self._note_idle()

    def _tick(self) -> None:
        self._timer = None
        self._pump()

    def _note_idle(self) -> None:
        if self._waiting or self._sending:
            self._idle.clear()
        else:
            self._idle.set()

    async def _one(self, record: Record) -> None:
        cid = record.container.id
        try:
            ok = await self._send(record)
        except Exception:  # a bug must not leave the queue stuck
            log.exception("record update of container %s failed", cid[:13])
            ok = False
        finally:
            self._sending.pop(cid, None)
        if not ok and cid not in self._waiting:
            self._failed[cid] = record
        self._pump()
