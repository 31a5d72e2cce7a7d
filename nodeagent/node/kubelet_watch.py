"""The proxy's watch on kubelet's configuration: ``nodeagent.node.kubelet_drift`` read at start and every period,
its findings logged (when they change, and again every tenth check while they last), handed to the metrics, kept
for ``/status``, and asked by the decisions whether new exclusive admissions must be refused."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .kubelet_drift import DriftReport, KubeletPaths, check_kubelet

__all__ = ["KubeletWatch"]

log = logging.getLogger("numapin.criproxy")
_REPEAT = 10  # a drift that lasts is logged again every tenth check


class KubeletWatch:
    """``await watch.check()`` once, then ``watch.run()`` as a background task; ``watch.refusal()`` at any time."""

    def __init__(self, paths: KubeletPaths, listen: str, period: float,
                 on_report: Callable[[DriftReport], None] | None = None) -> None:
        self.paths, self.listen, self.period = paths, listen, period
        self.report = DriftReport()
        self.checked = False
        self.on_report = on_report or (lambda report: None)
        self._unchanged = 0

    def refusal(self) -> str | None:
        """Why a new exclusive admission is refused now (None: it is not)."""
        return self.report.refusal()

    async def check(self) -> DriftReport:
        report = await asyncio.to_thread(check_kubelet, self.paths, self.listen)
        changed = (report.problems, report.notes) != (self.report.problems, self.report.notes) or not self.checked
        self._unchanged = 0 if changed else self._unchanged + 1
        if report.problems and (changed or self._unchanged % _REPEAT == 0):
            for p in report.problems:
                log.warning("kubelet drift: %s", p.detail)
            if report.fights:
                log.warning("kubelet drift: new exclusive admissions are refused until kubelet's CPU and Memory "
                            "Managers are back on none (kubelet and numapin would both write cpusets)")
        elif changed and self.report.problems:
            log.warning("kubelet drift: cleared (%s)", ", ".join(report.sources) or "no kubelet configuration seen")
        if changed:
            for n in report.notes:
                log.info("kubelet configuration: %s", n)
        self.report, self.checked = report, True
        self.on_report(report)
        return report

    async def run(self) -> None:
        """Check every period (the first check is ``check``'s, at start); a period of 0 checks only at start."""
        while self.period > 0:
            await asyncio.sleep(self.period)
            try:
                await self.check()
            except Exception:  # a check that fails keeps the last report; the next one tries again
                log.exception("kubelet drift: the check failed")
