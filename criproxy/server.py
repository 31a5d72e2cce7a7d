"""The proxy's listening unix socket: created 0660, a stale socket file replaced, a live one refused."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from collections.abc import Sequence

import grpc
import grpc.aio

from .relay import MAX_MESSAGE

__all__ = ["SocketInUseError", "listen_path", "prepare_socket", "start_server"]

SOCKET_MODE = 0o660


class SocketInUseError(RuntimeError):
    """Another live server owns the socket path, or the path is not a socket."""


def listen_path(listen: str) -> str:
    """The filesystem path of ``unix:///path``, ``unix:/path`` or ``/path``."""
    for prefix in ("unix://", "unix:"):
        if listen.startswith(prefix):
            listen = listen[len(prefix):]
            break
    if not listen.startswith("/"):
        raise ValueError(f"listen address {listen!r}: expected an absolute unix socket path")
    return listen


def prepare_socket(path: str) -> None:
    """Make ``path`` free for a new server: remove a stale socket, refuse when something answers on it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUseError(f"{path} exists and is not a socket; refusing to replace it")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(path)
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        raise SocketInUseError(f"{path}: cannot tell whether a server owns it: {e}") from e
    finally:
        s.close()
    raise SocketInUseError(f"{path}: another server is listening on it; refusing to start")


async def start_server(path: str, handlers: Sequence[grpc.GenericRpcHandler]) -> grpc.aio.Server:
    """Start a gRPC server on the unix socket ``path`` (mode 0660) with ``handlers``."""
    prepare_socket(path)
    server = grpc.aio.server(options=(
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.so_reuseport", 0),
    ))
    server.add_generic_rpc_handlers(tuple(handlers))
    old = os.umask(0o117)  # the socket is born 0660: no window with wider permissions
    try:
        server.add_insecure_port("unix:" + path)
        await server.start()
    finally:
        os.umask(old)
    os.chmod(path, SOCKET_MODE)
    return server
