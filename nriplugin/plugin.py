"""The long-running NRI plugin: connect to the runtime's socket, run a session, and when it ends (the runtime
restarted or closed the connection, or sent something that breaks the protocol) log one line and connect again
after a capped, jittered back-off; every new connection is a brand-new registration with a full Synchronize. Only an
``UnsupportedRuntime`` ends ``run``: retrying would not change the runtime.

    plugin = NriPlugin(PluginConfig("/var/run/nri/nri.sock", name="numapin", index="90"), handler)
    task = asyncio.create_task(plugin.run())
    ...
    failed = await plugin.update_containers([update])   # unsolicited: never from inside an event handler
    await plugin.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .backoff import Backoff
from .handler import Handler
from .runtime_check import MINIMUM_VERSIONS, UnsupportedRuntime
from .session import DEFAULT_REGISTRATION_TIMEOUT, RuntimeCallError, Session
from .wire.errors import ConnectionClosed, ProtocolError
from .wire.trunk import Trunk

__all__ = ["DEFAULT_SOCKET", "NotConnected", "NriPlugin", "PluginConfig"]

DEFAULT_SOCKET = "/var/run/nri/nri.sock"


class NotConnected(Exception):
    """No session is synchronized with the runtime right now."""


@dataclass(frozen=True)
class PluginConfig:
    socket_path: str = DEFAULT_SOCKET
    name: str = "numapin"
    index: str = "90"  # exactly two digits: the runtime calls plugins in ascending index order
    registration_timeout: float = DEFAULT_REGISTRATION_TIMEOUT  # how long to wait for RegisterPlugin's answer
    backoff: Backoff = field(default_factory=Backoff)
    minimum_versions: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MINIMUM_VERSIONS)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9]{2}", self.index):
            raise ValueError(f"plugin index {self.index!r}: NRI needs exactly two digits (00-99)")
        if not self.name or any(c.isspace() or c == "/" for c in self.name):
            raise ValueError(f"plugin name {self.name!r}: NRI needs a non-empty name without spaces or '/'")


class NriPlugin:
    def __init__(self, config: PluginConfig, handler: Handler, *, rng: random.Random | None = None,
                 log: logging.Logger | None = None) -> None:
        self.config = config
        self.handler = handler
        self.rng = rng or random.Random()
        self.log = log or logging.getLogger("nriplugin")
        self.session: Session | None = None
        self.connections = 0  # sessions that got as far as a Synchronize answered
        self.closed: list[str] = []  # why each session ended, oldest first (the last 100)
        self._stopping = asyncio.Event()
        self._synchronized = asyncio.Condition()

    async def run(self) -> None:
        """Serve until ``stop()`` (returns) or a refused runtime (raises ``UnsupportedRuntime``)."""
        attempt = 0
        while not self._stopping.is_set():
            path = self.config.socket_path
            try:
                trunk = await Trunk.connect(path)
            except OSError as e:
                delay = self.config.backoff.delay(attempt, self.rng)
                if attempt == 0:
                    self.log.info("NRI socket %s: %s; retrying (next in %.2f s)", path, e.strerror or e, delay)
                attempt += 1
                await self._pause(delay)
                continue
            session = Session(trunk, self.handler, name=self.config.name, index=self.config.index,
                              registration_timeout=self.config.registration_timeout,
                              minimum_versions=self.config.minimum_versions, log=self.log)
            self.session = session
            watcher = asyncio.create_task(self._count_sync(session))
            try:
                reason = await self._serve(session)
            finally:
                watcher.cancel()
                self.session = None
                if session.runtime is not None:
                    try:
                        await self.handler.on_disconnected(self.closed[-1] if self.closed else "stopped")
                    except Exception as e:  # the handler's bug must not end the plugin
                        self.log.error("the handler's on_disconnected failed: %r", e)
            if reason is not None:
                raise reason
            attempt = 0 if session.synchronized.is_set() else attempt + 1
            await self._pause(self.config.backoff.delay(attempt, self.rng))

    async def _serve(self, session: Session) -> UnsupportedRuntime | None:
        path = self.config.socket_path
        try:
            await session.run()
            why = "the session ended"
        except UnsupportedRuntime as e:
            self._note(str(e))
            self.log.error("NRI runtime refused: %s", e)
            return e
        except ConnectionClosed as e:
            why = f"{e}"
            if not self._stopping.is_set():
                self.log.info("NRI connection to %s closed: %s; reconnecting", path, e)
        except ProtocolError as e:
            why = f"bad input: {e}"
            self.log.warning("closing the NRI connection to %s: %s; reconnecting", path, e)
        except (RuntimeCallError, TimeoutError) as e:
            why = f"registration failed: {e}"
            self.log.warning("NRI registration at %s failed: %s; reconnecting", path, e)
        except OSError as e:
            why = f"socket error: {e}"
            self.log.warning("NRI connection to %s failed: %s; reconnecting", path, e)
        self._note(why)
        return None

    def _note(self, why: str) -> None:
        self.closed = [*self.closed[-99:], why]

    async def _count_sync(self, session: Session) -> None:
        await session.synchronized.wait()
        async with self._synchronized:
            self.connections += 1
            self._synchronized.notify_all()

    async def wait_synchronized(self, connections: int = 1) -> None:
        """Until ``connections`` sessions in all have been synchronized (the current one included)."""
        async with self._synchronized:
            await self._synchronized.wait_for(lambda: self.connections >= connections)

    async def _pause(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay)

    async def stop(self) -> None:
        """End the current session and ``run``."""
        self._stopping.set()
        if self.session is not None:
            self.session.close(ConnectionClosed("the plugin is stopping"))

    async def update_containers(self, updates: list[Any], evictions: list[Any] | None = None,
                                timeout: float = 5.0) -> list[Any]:
        """Unsolicited updates of containers (``nri_pb2.ContainerUpdate``); the ones the runtime could not apply.
        Never await this from inside an event handler: the runtime applies it only after the event, which then
        times out (and on containerd 1.7/2.1 a call racing an event can hang containerd: nri.md §5.5)."""
        session = self.session
        if session is None or not session.synchronized.is_set():
            raise NotConnected("numapin's NRI plugin is not synchronized with a runtime now")
        return await session.update_containers(updates, evictions, timeout)
