from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator

import pytest

from nriplugin import Backoff, NriPlugin, PluginConfig
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import PAUSE_IMAGE, ContainerdLab, scratch_lab
from numapin_lab.cri.containerd_versions import containerd_bin_dir
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


VERSIONS = ("1.7", "2.x")


@pytest.fixture(scope="session", params=VERSIONS, ids=[f"containerd{v}" for v in VERSIONS])
def nri_lab(request: pytest.FixtureRequest) -> Iterator[ContainerdLab]:
    """One containerd with NRI on per version for the session (a missing one fails the test, never skips)."""
    with scratch_lab("nri-lab-", containerd_bin_dir(str(request.param)), nri=True) as lab:
        yield lab


@pytest.fixture
async def cri(nri_lab: ContainerdLab) -> AsyncIterator[CRIClient]:
    async with CRIClient(nri_lab.socket) as client:
        # containerd 2.x's CRI learns of the images the lab imported through events, a moment after the import: a
        # pod run at once can find no pause image (seen once here)
        for _ in range(300):
            if PAUSE_IMAGE in {t for i in await client.list_images() for t in i.repo_tags}:
                break
            await asyncio.sleep(0.1)
        yield client
    await nri_lab.remove_all_pods()
