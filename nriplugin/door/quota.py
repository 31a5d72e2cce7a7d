"""The NRI door's CFS quota of pinned containers: lifted in the kernel only, containerd's record keeps kubelet's.

kubelet (1.36) reads a container's CPU limit back from the runtime's ContainerStatus (``cpu_quota``/``cpu_period``)
and, when the quota there is not positive, keeps showing the limit of its previous status (docs/nri.md "The CFS
quota"). The proxy door rewrites ContainerStatus; kubelet talks to containerd directly under NRI, so the door must
leave kubelet's quota in containerd's record and take it off the cgroup itself:

- at StartContainer (the task and its cgroup exist, its process does not run yet);
- at PostUpdateContainer (runc has just written kubelet's new quota: an in-place resize of a pinned container);
- on every sweep: after each answered event and each convergence pass, for every running pinned container. runc
  writes the record's quota back whenever containerd applies an update of the container (numapin's own record
  updates, which carry a cpuset only), and so does systemd's daemon-reload on the systemd cgroup driver; until the
  sweep the container runs with kubelet's quota, which is its own CPU count over its own CPUs.

``enabled`` False (``--keep-cfs-quota``): nothing is lifted."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from nodeagent.decisions.registry import Registry
from nodeagent.node.kernel import CgroupLayout
from nodeagent.node.kernel_quota import UNLIMITED, lift_quota, read_quota

__all__ = ["QuotaKeeper"]

log = logging.getLogger("numapin.nri")


def _lift_all(layout: CgroupLayout, cgroups: list[tuple[str, str]], check: bool) -> list[tuple[str, str | None]]:
    """(container id, why not lifted or None) for the cgroups among ``cgroups`` that have a quota (all when not
    ``check``)."""
    out: list[tuple[str, str | None]] = []
    for cid, cg in cgroups:
        if check:
            try:
                if read_quota(layout, cg) == UNLIMITED:
                    continue
            except (OSError, ValueError):
                continue  # not started, or gone
        out.append((cid, lift_quota(layout, cg)))
    return out


class QuotaKeeper:
    def __init__(self, layout: CgroupLayout, registry: Registry, cgroups: Mapping[str, str], *,
                 enabled: bool = True) -> None:
        self.layout = layout
        self.registry = registry
        self.cgroups = cgroups   # container id -> cgroup (the pusher's, from NRI's cgroups_path)
        self.enabled = enabled
        self.lifted = 0          # cgroups whose quota was taken off (for /status and the tests' logs)
        self._sweep: asyncio.Task[None] | None = None
        self._again = False

    def _pinned(self, ids: Iterable[str]) -> list[tuple[str, str]]:
        out = []
        for cid in ids:
            t = self.registry.containers.get(cid)
            cg = self.cgroups.get(cid)
            if t is not None and cg is not None and t.pinned and not t.exited:
                out.append((cid, cg))
        return out

    async def lift(self, ids: Iterable[str], *, check: bool = False) -> None:
        """Take the quota off the cgroups of the pinned ones among ``ids`` (``check``: only where there is one)."""
        if not self.enabled:
            return
        todo = self._pinned(ids)
        if not todo:
            return
        for cid, why in await asyncio.to_thread(_lift_all, self.layout, todo, check):
            t = self.registry.containers.get(cid)
            ref = f"pod={t.pod_ref} container={t.name}" if t is not None else ""
            if why is None:
                self.lifted += 1
                log.info("CFS quota lifted in the kernel: %s id=%s (containerd's record keeps kubelet's)", ref,
                         cid[:13])
            else:
                log.warning("CFS quota of %s id=%s not lifted: %s", ref, cid[:13], why)

    async def sweep(self) -> None:
        """Every running pinned container whose cgroup has a quota again loses it."""
        await self.lift(list(self.registry.containers), check=True)

    def sweep_soon(self) -> None:
        """A sweep in the background (one at a time; one more after it when asked meanwhile)."""
        if not self.enabled:
            return
        if self._sweep is not None and not self._sweep.done():
            self._again = True
            return
        self._sweep = asyncio.get_running_loop().create_task(self._run(), name="numapin-nri-quota-sweep")

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                await self.sweep()
            except Exception:  # a bug must not end the sweeps
                log.exception("CFS quota sweep failed")
            if not self._again:
                return

    async def stop(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            await asyncio.gather(self._sweep, return_exceptions=True)
