"""``numapin nri`` as a process beside a lab containerd with NRI on, for one test: CPU 0 reserved
(``tests.criproxy.test_e2e_containerd.SHARED``), its directory and the lab's pods removed on the way out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.nri_process import NriProcess
from numapin_lab.cri.proxy_process import serving
from tests.criproxy.test_e2e_containerd import SHARED

__all__ = ["plugin_process"]


@asynccontextmanager
async def plugin_process(lab: ContainerdLab, *extra_args: str) -> AsyncIterator[NriProcess]:
    p = NriProcess(scratch_dir("npx-nri-"), lab.socket, lab.nri_socket, reserved_cpus=SHARED, extra_args=extra_args)
    async with serving(p, lab):
        yield p
