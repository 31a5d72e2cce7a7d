"""The proxy's listening unix socket: created 0660, a stale socket file replaced, a live one refused.

``start_relay_server`` serves the relay (a synchronous gRPC server on threads, see relay.py); ``start_server`` an
asyncio gRPC server (the in-memory lab runtime).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
import grpc.aio

from criproxy.relay.grpc_relay import MAX_MESSAGE, RelayHandler
from nodeagent.serve.unix_socket import SocketInUseError, prepare_socket

__all__ = ["RelayServer", "SocketInUseError", "listen_path", "prepare_socket", "start_relay_server", "start_server"]

SOCKET_MODE = 0o660
# Threads of the relay: each relayed call holds one while the runtime answers (a StopContainer can take a pod's
# grace period, a PullImage minutes); calls beyond this wait for a free thread.
RELAY_THREADS = 256
_SERVER_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.so_reuseport", 0),
)


def listen_path(listen: str) -> str:
    """The filesystem path of ``unix:///path``, ``unix:/path`` or ``/path``."""
    for prefix in ("unix://", "unix:"):
        if listen.startswith(prefix):
            listen = listen[len(prefix):]
            break
    if not listen.startswith("/"):
        raise ValueError(f"listen address {listen!r}: expected an absolute unix socket path")
    return listen


async def start_server(path: str, handlers: Sequence[grpc.GenericRpcHandler]
                       ) -> grpc.aio.Server | RelayServer:
    """Start a gRPC server on the unix socket ``path`` (mode 0660) with ``handlers``."""
    if len(handlers) == 1 and isinstance(handlers[0], RelayHandler):
        return await start_relay_server(path, handlers[0])  # the relay's handler needs its own kind of server
    prepare_socket(path)
    server = grpc.aio.server(options=_SERVER_OPTIONS)
    server.add_generic_rpc_handlers(tuple(handlers))
    old = os.umask(0o117)  # the socket is born 0660: no window with wider permissions
    try:
        server.add_insecure_port("unix:" + path)
        await server.start()
    finally:
        os.umask(old)
    os.chmod(path, SOCKET_MODE)
    return server


class RelayServer:
    """The relay's running server, with the stop/wait interface of ``grpc.aio.Server``."""

    def __init__(self, server: grpc.Server, executor: ThreadPoolExecutor) -> None:
        self._server = server
        self._executor = executor
        self._stopped = asyncio.Event()

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls, give calls in flight ``grace`` seconds, then cancel them."""
        if self._stopped.is_set():
            return
        done = self._server.stop(grace)
        await asyncio.to_thread(done.wait)
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._stopped.set()

    async def wait_for_termination(self) -> None:
        await self._stopped.wait()


async def start_relay_server(path: str, handler: RelayHandler, *, threads: int = RELAY_THREADS) -> RelayServer:
    """Serve ``handler`` on the unix socket ``path`` (mode 0660); its interceptors run on the calling event loop."""
    prepare_socket(path)
    handler.loop = asyncio.get_running_loop()
    executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="numapin-relay")
    server = grpc.server(executor, handlers=[handler], options=_SERVER_OPTIONS)
    old = os.umask(0o117)  # the socket is born 0660: no window with wider permissions
    try:
        server.add_insecure_port("unix:" + path)
        server.start()
    except BaseException:
        server.stop(None)
        executor.shutdown(wait=False)
        raise
    finally:
        os.umask(old)
    os.chmod(path, SOCKET_MODE)
    return RelayServer(server, executor)

