"""``StartContainer``, door-neutral (``StartGuard.start``, around the door's own step that has the runtime start the
container): a container starts only where the decision says, checked in the kernel.

- A container of the shared pool (or pinned in ``share`` mode) starts with the pool gate held *shared*: no
  narrowing or widening runs while containerd creates its task (an update then would only change the stored
  spec and the task would start on the old, wider cpuset). Before the start returns, its kernel cpuset is
  read and repaired if it is not the decision.
- An ``exclusive`` container starts with the gate held *exclusively*, and only once the kernel shows no other
  running container on its CPUs: any that still has them is repaired first; if one still has them after
  that, the start is refused with UNAVAILABLE (kubelet retries) rather than run the two together.
- After a restart, a ``StartContainer`` the previous proxy forwarded may still be completing in containerd,
  with the cpuset of before a narrowing. Containers created but not running at the start-up reconcile are
  suspects for ``suspect_window`` seconds: an exclusive start first waits until each is running (then the
  kernel check above covers it), gone, started through this proxy, or the window is over.
- A door whose runtime drops a caller that answers late (NRI: containerd disconnects a plugin after its request
  timeout, 2 s by default, and starts the container without it) bounds the whole exclusive start with ``within``:
  past that, the start is refused (UNAVAILABLE, kubelet retries) with a log line naming what was not yet clear,
  instead of an answer that never arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from allocator.cpuset import CPUSet
from nodeagent.decisions.registry import Registry, Tracked
from nodeagent.node.converge import Converger, Decision
from nodeagent.node.kernel import KernelView
from nodeagent.rejection import Rejection

__all__ = ["StartGuard"]

log = logging.getLogger("numapin.criproxy")

R = TypeVar("R")


class StartGuard:
    def __init__(self, registry: Registry, converger: Converger, decide: Callable[[Tracked], Decision | None], *,
                 clear_timeout: float = 5.0, suspect_window: float = 5.0,
                 on_refusal: Callable[[], None] | None = None) -> None:
        self.registry = registry
        self.converger = converger
        self.decide = decide
        self.clear_timeout = clear_timeout
        self.suspect_window = suspect_window
        self.on_refusal = on_refusal or (lambda: None)
        self._suspects: dict[str, float] = {}   # container id -> until when a foreign start may land

    async def note_unstarted(self) -> None:
        """After the start-up reconcile: remember the containers created but not running."""
        live = self.converger.live()
        views = await self.converger.views(live)
        until = time.monotonic() + self.suspect_window
        self._suspects = {t.id: until for t in live if views.get(t.id) is None and self.converger.knows(t.id)}
        if self._suspects:
            log.info("start guard: %d containers are created but not running; for %g s an exclusive start waits "
                     "for any start of them the previous proxy forwarded", len(self._suspects), self.suspect_window)

    async def _await_suspects(self, t: Tracked, deadline: float) -> list[Tracked]:
        """Wait until no suspect may still land (see the module); past ``deadline`` return the ones that still
        may (empty: none left)."""
        while True:
            now = time.monotonic()
            pending = [o for o in self.converger.live()
                       if o.id != t.id and self._suspects.get(o.id, 0.0) > now]
            for cid in [c for c, until in self._suspects.items() if until <= now or c not in self.registry.containers]:
                del self._suspects[cid]
            if not pending:
                return []
            views = await self.converger.views(pending)
            for o in pending:
                if views.get(o.id) is not None:
                    self._suspects.pop(o.id, None)  # running now: the kernel check sees it
            left = [o for o in pending if o.id in self._suspects]
            if not left or time.monotonic() >= deadline:
                return left
            await asyncio.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))

    async def start(self, container_id: str, run: Callable[[], Awaitable[R]], *, within: float | None = None) -> R:
        """Start the container ``container_id``: ``run`` is the door's step that has the runtime start it, called
        under the pool gate (exclusively, once the kernel shows no other running container on its CPUs, for an
        exclusive container); the kernel's cpuset is checked and repaired right after. Raises Rejection (``run``
        not called) when its exclusive CPUs cannot be taken back in time: within ``clear_timeout`` seconds, or
        ``within`` seconds from now when that is sooner (a door whose caller stops waiting then)."""
        self._suspects.pop(container_id, None)  # started through this door, under the gate
        t = self.registry.containers.get(container_id)
        if t is None or t.mode == "bypass":
            return await run()
        gate = self.converger.pusher.gate
        if t.mode == "exclusive":
            limit = None if within is None else time.monotonic() + max(within, 0.0)
            async with gate.exclusive():
                await self._clear(t, limit)
                response = await run()
                await self.converger.repair([t], "after start")
            return response
        async with gate.shared():
            response = await run()
            await self.converger.repair([t], "after start")
        return response

    def _overlaps(self, t: Tracked, cpus: CPUSet, views: dict[str, KernelView | None]
                  ) -> list[tuple[Tracked, CPUSet]]:
        out = []
        for o in self.converger.live():
            v = views.get(o.id)
            if o.id == t.id or v is None or not v.running:
                continue
            common = v.all_cpus & cpus
            if common:
                out.append((o, common))
        return out

    async def _clear(self, t: Tracked, limit: float | None) -> None:
        """Return once no other running container has ``t``'s CPUs in the kernel (repairing those that do);
        raise UNAVAILABLE if some still do after ``clear_timeout``, or at ``limit`` (the caller's deadline,
        ``time.monotonic()`` seconds) if that comes first."""
        d = self.decide(t)
        if d is None:
            return
        landing = await self._await_suspects(t, float("inf") if limit is None else limit)
        if landing:
            names = ", ".join(f"{o.pod_ref} {o.name} id={o.id[:13]}" for o in landing)
            log.warning("start pod=%s container=%s (exclusive cpus=%s) refused: %d container(s) whose start the "
                        "previous process may have forwarded are not running yet: %s", t.pod_ref, t.name, d.cpus,
                        len(landing), names)
            self.on_refusal()
            raise Rejection(grpc.StatusCode.UNAVAILABLE,
                            f"numapin: pod {t.pod_ref} container {t.name} not started yet: container(s) {names} "
                            "created before numapin's restart may still start with its exclusive CPUs; retry")
        deadline = time.monotonic() + self.clear_timeout
        bounded = limit is not None and limit < deadline
        if limit is not None:
            deadline = min(deadline, limit)
        while True:
            others = [o for o in self.converger.live() if o.id != t.id]
            views = await self.converger.views(others)
            overlaps = self._overlaps(t, d.cpus, views)
            if not overlaps:
                return
            if time.monotonic() >= deadline:
                break
            for o, common in overlaps:
                log.warning("start pod=%s container=%s (exclusive cpus=%s): running container pod=%s container=%s "
                            "id=%s still has cpus %s in the kernel; repairing it before the start", t.pod_ref, t.name,
                            d.cpus, o.pod_ref, o.name, o.id[:13], common)
            await self.converger.repair([o for o, _ in overlaps], "before an exclusive start")
            await asyncio.sleep(0.05)
            d = self.decide(t) or d
        names = ", ".join(f"{o.pod_ref} {o.name} (cpus {c})" for o, c in overlaps)
        why = "before the runtime's deadline for the answer" if bounded else f"within {self.clear_timeout:g} s"
        log.warning("start pod=%s container=%s (exclusive cpus=%s) refused %s: not yet clear of running "
                    "container(s) %s", t.pod_ref, t.name, d.cpus, why, names)
        self.on_refusal()
        raise Rejection(grpc.StatusCode.UNAVAILABLE,
                        f"numapin: pod {t.pod_ref} container {t.name} not started: its exclusive CPUs {d.cpus} are "
                        f"still used by running container(s) {names} and could not be taken back {why}")
