"""numapin's NRI door: an asyncio NRI plugin (containerd 1.7 / 2.x) driven by a ``Handler``.

``wire/`` is the transport (the trunk multiplexer, ttrpc framing); ``session`` one connection's protocol
(register, configure, synchronize, events); ``plugin`` the long-running plugin that reconnects; ``handler`` the
interface its user implements; ``events`` the subscription; ``runtime_check`` the start-up check. Protocol facts:
shared/reference/nri.md."""

from __future__ import annotations

from .backoff import Backoff
from .events import CONTAINER_EVENTS, Event
from .handler import BaseHandler, CallContext, Handler, PluginError, RuntimeInfo
from .plugin import DEFAULT_SOCKET, NotConnected, NriPlugin, PluginConfig
from .runtime_check import UnsupportedRuntime
from .session import RuntimeCallError
from .wire.codes import Code

__all__ = ["CONTAINER_EVENTS", "DEFAULT_SOCKET", "Backoff", "BaseHandler", "CallContext", "Code", "Event", "Handler",
           "NotConnected", "NriPlugin", "PluginConfig", "PluginError", "RuntimeCallError", "RuntimeInfo",
           "UnsupportedRuntime"]
