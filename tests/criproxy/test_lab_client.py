"""The lab's CRI client stands for a process of its own (kubelet, crictl, kubelet again after a restart): a client
made while another client of the same test is backing off from a dead server connects afresh. gRPC shares a target's
connection among a process's channels by default, and a client made right after the proxy came back once failed at
once with the "connection refused" an older client had met while the proxy was down (a red CI run)."""

from __future__ import annotations

import asyncio
import shutil
import socket

import grpc
import grpc.aio
import pytest

from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.ledger import scratch_dir


async def test_a_new_client_does_not_inherit_an_older_clients_failed_connection() -> None:
    d = scratch_dir("npx-lab-client-")
    try:
        path = str(d / "proxy.sock")
        # a killed server's socket file: bound, nobody listening
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(path)
        async with CRIClient(path) as older:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await older.version()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            # the older client keeps retrying in the background with growing back-off (attempts about 0.1, 0.26,
            # 0.52, 0.93, 1.6 s after its failure): 1.2 s in, it is between two attempts and its last one failed
            await asyncio.sleep(1.2)
            server = grpc.aio.server()  # a server with no methods: a call that reaches it is told UNIMPLEMENTED
            server.add_insecure_port("unix:" + path)
            await server.start()
            try:
                async with CRIClient(path) as newer:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await newer.version()
                    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, err.value.details()
            finally:
                await server.stop(None)
    finally:
        shutil.rmtree(d, ignore_errors=True)
