"""A Rejection raised inside a context manager (as the proxy's pool gate is) still reaches kubelet with its own
status and message (it was a frozen dataclass: leaving the context manager assigned ``__traceback__`` and the
caller got INTERNAL "FrozenInstanceError: cannot assign to field '__traceback__'")."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import grpc.aio
import pytest

from criproxy.relay.grpc_relay import Rejection, RelayHandler, Upstream
from criproxy.relay.relays import start_relay
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.memory_runtime import MemoryRuntime


@contextlib.asynccontextmanager
async def gate() -> AsyncIterator[None]:
    yield


async def test_rejection_raised_inside_a_context_manager_keeps_its_status(short_tmp: Path, runtime: MemoryRuntime,
                                                                         relay_kind: str) -> None:
    async def status(request: bytes, forward: object) -> bytes:
        async with gate():
            raise Rejection(grpc.StatusCode.UNAVAILABLE, "numapin: not started yet")

    upstream = Upstream(runtime.socket_path)
    path = str(short_tmp / "r.sock")
    server = await start_relay(path, RelayHandler(upstream, {"Status": status}), relay_kind)
    try:
        async with CRIClient(path) as c:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.call("Status", pb.StatusRequest(), pb.StatusResponse)
        assert (err.value.code(), err.value.details()) == (grpc.StatusCode.UNAVAILABLE, "numapin: not started yet")
    finally:
        await server.stop(0)
        await upstream.close()


def test_rejection_can_be_re_raised() -> None:
    e = Rejection(grpc.StatusCode.FAILED_PRECONDITION, "numapin: no")
    for _ in range(2):
        with pytest.raises(Rejection) as got:
            raise e
        assert got.value.code == grpc.StatusCode.FAILED_PRECONDITION and str(got.value) == "numapin: no"
