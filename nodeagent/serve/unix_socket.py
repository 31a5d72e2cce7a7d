"""A unix socket path made free for a new server (the proxy's relay, the control socket): a stale socket file
replaced, a live one or a file that is no socket refused."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat

__all__ = ["SocketInUseError", "prepare_socket"]


class SocketInUseError(RuntimeError):
    """Another live server owns the socket path, or the path is not a socket."""


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
