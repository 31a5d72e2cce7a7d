from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator

import pytest

from nriplugin import Backoff, NriPlugin, PluginConfig
from numapin_lab.cri.ledger import scratch_dir
from tests.nri.peer import Peer
from tests.nri.recorder import Recorder

FAST = Backoff(initial=0.01, factor=2, cap=0.05, jitter=0.5)


@pytest.fixture
async def peer() -> AsyncIterator[Peer]:
    """The test runtime listening on ``nri.sock`` in a new short directory (unix socket paths are short)."""
    where = scratch_dir("nri-")
    p = await Peer(str(where / "nri.sock")).start()
    try:
        yield p
    finally:
        await p.stop()
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def plugin(peer: Peer, recorder: Recorder) -> AsyncIterator[NriPlugin]:
    """The plugin connected (or connecting) to the test peer; its ``run`` task is checked at the end."""
    p = NriPlugin(PluginConfig(peer.path, name="numapin-test", index="42", backoff=FAST), recorder)
    task = asyncio.create_task(p.run())
    p.task = task  # type: ignore[attr-defined]
    yield p
    await p.stop()
    await asyncio.wait_for(task, 30)
