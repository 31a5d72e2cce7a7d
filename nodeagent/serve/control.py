"""The proxy's local control socket, for nodes without API access: ``numapin mode`` talks to it.

A unix socket (default ``/var/run/numapin/control.sock``) born mode 0600 and owned by the proxy's user (root), so
only root on the node can use it; the peer's uid is checked again on every connection (SO_PEERCRED). One request per
connection, one JSON document per line each way (at most 64 KiB):

- ``{"op": "set-mode", "pod": "NAMESPACE/NAME", "mode": "share"}`` -> the ``ModeAnswer`` (``outcome``, ``message``,
  ``reason``, ``change``);
- ``{"op": "modes"}`` -> ``{"outcome": "ok", "pods": [{"pod", "uid", "mode", "changed"}...]}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

from allocator.errors import PodSpecError
from allocator.mode_change import parse_target
from nodeagent.decisions.mode_request import ModeAnswer, ModeRequest, ModeSink
from nodeagent.serve.unix_socket import prepare_socket

__all__ = ["MAX_LINE", "ControlServer", "call_control"]

log = logging.getLogger("numapin.criproxy.control")

MAX_LINE = 64 * 1024
SOCKET_MODE = 0o600


class ControlServer:
    def __init__(self, path: str, sink: ModeSink, modes: Callable[[], list[dict[str, Any]]]) -> None:
        self.path = path
        self.sink = sink
        self.modes = modes
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> ControlServer:
        await asyncio.to_thread(prepare_socket, self.path)
        # born 0600: no window with wider permissions (the umask is the process's: created without an await)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)
        except OSError:
            sock.close()
            raise
        finally:
            os.umask(old)
        self._server = await asyncio.start_unix_server(self._serve, sock=sock, limit=MAX_LINE, start_serving=False)
        await self._server.start_serving()  # a stop() from now on closes it, even if this start is cancelled
        os.chmod(self.path, SOCKET_MODE)
        log.info("control socket on %s (root only)", self.path)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            answer = await self._answer(reader, writer)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict[str, Any]:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid not in (0, os.geteuid()):
                log.warning("control socket: refused a request from uid %d", uid)
                return _error(f"uid {uid} may not use the control socket (root only)")
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            return _error(f"request longer than {MAX_LINE} bytes")
        except asyncio.IncompleteReadError as e:
            line = e.partial
        try:
            req = json.loads(line)
        except ValueError as e:
            return _error(f"request is not JSON: {e}")
        if not isinstance(req, dict):
            return _error("request must be a JSON object")
        op = req.get("op")
        if op == "modes":
            return {"outcome": "ok", "pods": self.modes()}
        if op != "set-mode":
            return _error(f"unknown op {op!r} (set-mode, modes)")
        pod, mode = req.get("pod"), req.get("mode")
        if not isinstance(pod, str) or pod.count("/") != 1 or not all(pod.split("/")):
            return _error(f"pod must be NAMESPACE/NAME, got {pod!r}")
        if mode is not None and not isinstance(mode, str):
            return _error(f"mode must be a string, got {mode!r}")
        try:
            target = parse_target(mode)
        except PodSpecError as e:
            return _error(str(e))
        ns, name = pod.split("/")
        answer = await self.sink(ModeRequest(ns, name, target, "local"))
        return answer.to_dict()


def _error(message: str) -> dict[str, Any]:
    return ModeAnswer("error", message).to_dict()


async def call_control(path: str, request: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
    """Send one request to the control socket at ``path`` and return the answer (OSError when unreachable)."""
    reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path, limit=MAX_LINE), timeout)
    try:
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    if not line:
        raise ConnectionError(f"{path}: the proxy closed the connection without an answer")
    answer = json.loads(line)
    if not isinstance(answer, dict):
        raise ConnectionError(f"{path}: unexpected answer {line[:200]!r}")
    return answer
