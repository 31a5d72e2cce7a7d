from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.webhook.helpers import PKI, Client, make_pki
from webhook.app import WebhookApp, WebhookOptions


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    d = tmp_path / "tls"
    d.mkdir()
    return make_pki(d)


@pytest.fixture
def nrt_dir(tmp_path: Path) -> Path:
    d = tmp_path / "nrt"
    d.mkdir()
    return d


@pytest.fixture
def pods_dir(tmp_path: Path) -> Path:
    d = tmp_path / "pods"
    d.mkdir()
    return d


@pytest.fixture
async def server(pki: PKI, nrt_dir: Path, pods_dir: Path) -> AsyncIterator[object]:
    logging.getLogger("numapin").setLevel(logging.INFO)
    srv = WebhookApp(WebhookOptions(cert=pki.cert, key=pki.key, host="127.0.0.1", port=0, nrt_dir=nrt_dir,
                                      pods_dir=pods_dir, cert_poll_seconds=0.05, nrt_poll_seconds=0.05,
                                      max_body=256 * 1024))
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def client(server: object, pki: PKI) -> AsyncIterator[Client]:
    async with aiohttp.ClientSession() as session:
        yield Client(server.port, pki, session)  # type: ignore[attr-defined]
