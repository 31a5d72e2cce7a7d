"""``numapin nri`` as a process beside a lab containerd with NRI on, for one test: CPU 0 reserved
(``tests.criproxy.test_e2e_containerd.SHARED``), its directory and the lab's pods removed on the way out."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.nri_process import NriProcess
from tests.criproxy.test_e2e_containerd import SHARED

__all__ = ["plugin_process"]


@asynccontextmanager
async def plugin_process(lab: ContainerdLab, *extra_args: str) -> AsyncIterator[NriProcess]:
    d = scratch_dir("npx-nri-")
    p = NriProcess(d, lab.socket, lab.nri_socket, reserved_cpus=SHARED, extra_args=extra_args)
    await asyncio.to_thread(p.start)
    try:
        yield p
    finally:
        p.stop()
        await lab.remove_all_pods()
        shutil.rmtree(d, ignore_errors=True)
