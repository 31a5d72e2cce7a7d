"""The seeded kubelet-like churn (``numapin_lab.cri.churn``) through the second door: the kubelet-like client talks
to containerd (1.7 / 2.x, NRI on) directly, and ``numapin nri`` is a real child process plugged into the lab's NRI
socket. The operations, faults and invariants are the proxy churn's, judged from the kernel, with ONE difference
NRI forces and the report shows apart:

while no plugin is connected (killed with -9 and not yet synchronized again, or containerd restarted and the
plugin not yet registered again) containerd creates containers without numapin's cpusets: NRI on 1.7 / 2.1 cannot
make a plugin mandatory. Such a container runs wherever its parent cgroup lets it, exclusive CPUs included, until
the plugin is back and has converged it. That is ``unpinnedWhilePluginDown``: containers whose runtime creation
time (containerd's ``created_at``) falls in a window from the plugin's loss to its Synchronize. Running on another
container's exclusive CPUs is excused for them only, and only until they are converged or ``repair_bound`` (2 s)
after the plugin is synchronized, whichever comes first; everything else is a violation as for the proxy. The
figure the window is measured by: the seconds from the plugin's synchronization until every such container runs
on numapin's decision in the kernel (``convergedAfterSyncSeconds``), beside how long the plugin was away.

After every kill of the plugin the driver goes on creating pods while it is down (kubelet does not know the plugin
is gone), so the window is exercised, not only possible.

``python -m numapin_lab.cri.churn_nri --seed 7 --ops 2000 --containerd 2.x`` prints the JSON report; exit status 1
on a violation (``benchmarks/churn.py --door nri`` runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc.aio

from .churn import Churn, ChurnConfig, ChurnReport, build_parser, config_of, drive, run_printed
from .client import CRIClient
from .containerd import ContainerdLab
from .containerd_versions import containerd_bin_dir
from .kernel_truth import ContainerTruth
from .nri_process import NriProcess

__all__ = ["ChurnPlugin", "NriChurn", "NriChurnReport", "main", "run_nri_churn"]

CONVERGE_POLL = 0.05   # seconds between two kernel samples while the plugin converges what it missed
SETTLE = 0.3           # a temp file still there this much later is a leftover, not a write under way


class ChurnPlugin(NriProcess):
    """The plugin process as the churn judges it: right after its Synchronize the plugin's background reconcile
    saves the state, so a temp file seen at that moment may be a write under way; a leftover of a kill is a temp
    file still there ``SETTLE`` seconds later."""

    def leftovers(self) -> list[str]:
        first = super().leftovers()
        if not first:
            return first
        time.sleep(SETTLE)
        return sorted(set(first) & set(super().leftovers()))


@dataclass
class NriChurnReport(ChurnReport):
    plugin_windows: list[dict[str, Any]] = field(default_factory=list)  # one per loss of the plugin
    created_while_down: set[str] = field(default_factory=set)   # container ids created in a window
    unpinned_while_down: set[str] = field(default_factory=set)  # of those: seen off numapin's decision
    on_exclusive_cpus: set[str] = field(default_factory=set)    # of those: seen on another's exclusive CPUs
    overlaps_excused: int = 0

    def to_json(self) -> dict[str, Any]:
        converge = [w["convergedAfterSyncSeconds"] for w in self.plugin_windows
                    if w.get("convergedAfterSyncSeconds") is not None]
        return {**super().to_json(), "door": "nri", "pluginWindows": len(self.plugin_windows),
                "createdWhilePluginDown": len(self.created_while_down),
                "unpinnedWhilePluginDown": {
                    "containers": len(self.unpinned_while_down),
                    "onExclusiveCPUs": len(self.on_exclusive_cpus),
                    "overlapsExcused": self.overlaps_excused,
                    "maxConvergedAfterSyncSeconds": round(max(converge, default=0.0), 3),
                    "windows": self.plugin_windows}}


@dataclass
class Window:
    """A time the plugin was not there: from its loss (wall clock, as containerd's ``created_at``) until it was
    synchronized again (None while it is down)."""

    lost_ns: int
    cause: str
    lost_at: float                 # monotonic
    synced_ns: int | None = None
    synced_at: float | None = None

    def holds(self, created_ns: int) -> bool:
        return created_ns >= self.lost_ns and (self.synced_ns is None or created_ns <= self.synced_ns)


class NriChurn(Churn):
    """The churn with ``numapin nri`` as the door (``self.proxy`` is the plugin's process)."""

    proxy: NriProcess
    report: NriChurnReport

    def __init__(self, cfg: ChurnConfig, lab: ContainerdLab, plugin: NriProcess, report: NriChurnReport) -> None:
        super().__init__(cfg, lab, plugin, report, kubelet_socket=lab.socket)
        self.windows: list[Window] = []
        self.runtime = CRIClient(lab.socket, timeout=10.0)   # the harness's own look at containerd's records
        self._created_ns: dict[str, int] = {}
        self._converged: set[str] = set()   # window containers the kernel showed on numapin's decision
        self._connections = 0               # the plugin's sessions before containerd was killed

    # -- the windows --------------------------------------------------------------------------------
    def fault_begins(self, cause: str) -> None:
        self.plugin_lost(cause)

    def plugin_lost(self, cause: str) -> None:
        if self.windows and self.windows[-1].synced_ns is None:
            return
        self.windows.append(Window(time.time_ns(), cause, time.monotonic()))
        self.trace(f"plugin lost ({cause})")

    async def created_ns(self, cid: str) -> int | None:
        """containerd's creation time of ``cid`` (its own record), or None when it does not know it."""
        if cid not in self._created_ns:
            with contextlib.suppress(grpc.aio.AioRpcError):
                for c in await self.runtime.list_containers():
                    self._created_ns[c.id] = c.created_at
        return self._created_ns.get(cid)

    async def window_of(self, cid: str) -> Window | None:
        created = await self.created_ns(cid)
        if created is None:
            return None
        return next((w for w in self.windows if w.holds(created)), None)

    async def excused_window(self, c: ContainerTruth) -> bool:
        """``c`` was created while the plugin was down, is not converged yet and the plugin has not been
        synchronized for longer than the bound."""
        w = await self.window_of(c.id)
        if w is None or c.id in self._converged:
            return False
        return w.synced_at is None or time.monotonic() - w.synced_at <= self.repair_bound

    async def overlap_excused(self, exclusive: ContainerTruth, other: ContainerTruth) -> bool:
        if await super().overlap_excused(exclusive, other):
            return True
        for c in (other, exclusive):
            if await self.excused_window(c):
                self.report.overlaps_excused += 1
                self.report.unpinned_while_down.add(c.id)
                self.report.on_exclusive_cpus.add(c.id)
                return True
        return False

    async def plugin_synchronized(self) -> None:
        """The plugin is synchronized again: close the window and measure, from the kernel, how long until every
        container created in it runs on numapin's decision (a violation past ``repair_bound``)."""
        w = self.windows[-1] if self.windows and self.windows[-1].synced_ns is None else None
        if w is None:
            return
        w.synced_ns, w.synced_at = time.time_ns(), time.monotonic()
        self._created_ns.clear()
        await self.created_ns("")   # refresh containerd's records
        mine = {cid for cid, ns in self._created_ns.items() if w.holds(ns)}
        self.report.created_while_down |= mine
        pending = set(mine)
        first = True
        converged_after: float | None = 0.0
        while pending:
            status = await asyncio.to_thread(self.proxy.status, 2.0)
            running = await self.truth.running()
            now = time.monotonic()
            if status is not None and running is not None:
                pinned, pool = self.decision_of(status)
                live = {c.id: c for c in running}
                for cid in list(pending):
                    c = live.get(cid)
                    if c is None:   # exited or removed meanwhile: nothing left to converge
                        pending.discard(cid)
                        continue
                    cpus = pinned.get((c.pod_uid, c.name), (pool, ""))[0]
                    if c.exactly() == (cpus, self.topology.numa_of(cpus)):
                        pending.discard(cid)
                        self._converged.add(cid)
                    elif first:
                        self.report.unpinned_while_down.add(cid)
                first = False
            converged_after = now - w.synced_at
            if pending and converged_after > self.repair_bound:
                self.violation("unpinned", f"containers created while the plugin was down ({w.cause}) still off "
                                           f"numapin's decision {converged_after:.1f} s after it was synchronized: "
                                           f"{sorted(c[:13] for c in pending)}")
                converged_after = None
                break
            if pending:
                await asyncio.sleep(CONVERGE_POLL)
        self.report.plugin_windows.append({
            "cause": w.cause, "downSeconds": round(w.synced_at - w.lost_at, 3), "created": len(mine),
            "convergedAfterSyncSeconds": None if converged_after is None else round(converged_after, 3)})

    # -- the faults, through this door ---------------------------------------------------------------
    async def kill_proxy_during(self, carrier: Callable[[], Awaitable[None]], *, mid_create: bool,
                                delay: float | None = None) -> None:
        """The plugin SIGKILLed while ``carrier`` runs (as the proxy); then kubelet goes on creating a pod while the
        plugin is down, before it is started again."""
        async def carrier_then_more() -> None:
            await carrier()
            for _ in range(int(100 * self.cfg.time_scale)):
                if not self.proxy.running:
                    break
                await asyncio.sleep(0.05)
            if not self.proxy.running:
                await self.create_pod(self.rng.choice(("burstable", "besteffort", "guaranteed-frac", None)))

        await super().kill_proxy_during(carrier_then_more, mid_create=mid_create, delay=delay)

    async def restart_proxy(self) -> None:
        await super().restart_proxy()
        await self.plugin_synchronized()

    async def restart_containerd_during(self, carrier: Callable[[], Awaitable[None]]) -> None:
        """containerd SIGKILLed and started again: the plugin's connection goes with it, so a window opens at the
        kill and closes when the plugin is synchronized again."""
        st = await asyncio.to_thread(self.proxy.status, 2.0)
        self._connections = int(((st or {}).get("door") or {}).get("connections", 0))
        await super().restart_containerd_during(carrier)
        await self.plugin_synchronized()

    async def door_back(self) -> bool:
        st = await asyncio.to_thread(self.proxy.status, 2.0)
        door = (st or {}).get("door") or {}
        return bool(st and st.get("reconciled") and door.get("synchronized")
                    and int(door.get("connections", 0)) > self._connections)

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            await self.runtime.close()


async def run_nri_churn(cfg: ChurnConfig, lab: ContainerdLab, workdir: Path) -> NriChurnReport:
    """Run the churn against ``lab`` (started, ``nri=True``) with a fresh ``numapin nri`` in ``workdir``."""
    if not lab.nri:
        raise ValueError("the NRI churn needs a lab containerd with NRI on (ContainerdLab(..., nri=True))")
    report = NriChurnReport(cfg.seed, cfg.ops)
    kw = {"root": Path(cfg.proxy_root).resolve()} if cfg.proxy_root else {}
    plugin = ChurnPlugin(workdir, lab.socket, lab.nri_socket, reserved_cpus=cfg.reserved_cpus, sysfs=cfg.sysfs, **kw)
    await drive(lab, plugin, lambda: NriChurn(cfg, lab, plugin, report))
    return report


def main(argv: list[str] | None = None) -> int:
    p = build_parser("python -m numapin_lab.cri.churn_nri", __doc__.split("\n\n")[0])
    p.add_argument("--containerd", default="2.x", choices=("1.7", "2.x"),
                   help="which lab containerd (NRI needs 1.7 or later; default 2.x)")
    args = p.parse_args(argv)
    bin_dir = containerd_bin_dir(args.containerd)
    return run_printed(args, config_of(p, args), lambda d: ContainerdLab(d, bin_dir, nri=True), run_nri_churn,
                       "plugin")


if __name__ == "__main__":
    sys.exit(main())
