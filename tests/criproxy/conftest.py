from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from criproxy.relay import RelayHandler, Upstream
from criproxy.server import start_server
from criproxy.testing.client import CRIClient
from criproxy.testing.memory_runtime import MemoryRuntime


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory (unix socket paths are limited to 107 bytes)."""
    d = tempfile.mkdtemp(prefix="npx-", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def runtime(short_tmp: Path) -> AsyncIterator[MemoryRuntime]:
    rt = await MemoryRuntime(str(short_tmp / "rt.sock")).start()
    yield rt
    await rt.stop()


@pytest.fixture
async def relay(short_tmp: Path, runtime: MemoryRuntime) -> AsyncIterator[str]:
    """A plain relay (no interceptors) in front of the in-process runtime; yields its socket path."""
    upstream = Upstream(runtime.socket_path)
    path = str(short_tmp / "proxy.sock")
    server = await start_server(path, [RelayHandler(upstream)])
    yield path
    await server.stop(0)
    await upstream.close()


@pytest.fixture
async def client(relay: str) -> AsyncIterator[CRIClient]:
    c = CRIClient(relay)
    yield c
    await c.close()
