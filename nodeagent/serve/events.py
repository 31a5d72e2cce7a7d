"""Events on pods, as kubelet records them (``kubectl describe pod`` and ``kubectl get events`` show them): core/v1
Events whose involvedObject is the Pod (namespace, name, uid), source component ``numapin`` on this node, type
Normal or Warning, one word of reason and a message.

Recording never delays or fails a decision: ``record`` (called in the decision path) only takes a token of the
pod's spam filter and appends to a bounded queue; a background task (``run``) drains it to the API server. An Event
that says the same as one already sent on the same pod increments that Event's ``count`` and ``lastTimestamp``
(a PATCH) instead of creating another. What cannot go (the pod's burst spent, the queue full, the API server slow,
gone or refusing) is dropped, counted by why, and logged at most once a minute for each why.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubeapi.client import api_client
from nodeagent.decisions.pod_events import PodEvent
from nodeagent.serve.event_limits import Aggregate, AggregateKey, Aggregates, SpamFilter

__all__ = ["COMPONENT", "EventRecorder"]

log = logging.getLogger("numapin.events")

COMPONENT = "numapin"
QUEUE_SIZE = 1024
REQUEST_SECONDS = 5.0     # one call to the API server; past it the Event is dropped
LOG_EVERY_SECONDS = 60.0  # drops are logged at most this often (with how many since the last line)


@dataclass(frozen=True)
class _Pending:
    event: PodEvent
    at: float    # unix time it happened
    name: str    # the Event's name if it is created: <pod>.<unix nanoseconds in hex>, as kubelet's


class EventRecorder:
    """``record(event)`` from the decisions; ``await run()`` in a background task; ``await close()`` at the end.
    ``kubeconfig`` None: in-cluster credentials. ``on_dropped(why)``: rate-limited, queue-full, unreachable,
    refused; ``on_sent(action)``: created, patched."""

    def __init__(self, kubeconfig: str | None, node_name: str, *, queue_size: int = QUEUE_SIZE,
                 request_seconds: float = REQUEST_SECONDS, spam: SpamFilter | None = None,
                 on_dropped: Callable[[str], None] = lambda why: None,
                 on_sent: Callable[[str], None] = lambda action: None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.kubeconfig = kubeconfig
        self.node_name = node_name
        self.queue_size = queue_size
        self.request_seconds = request_seconds
        self.spam = spam if spam is not None else SpamFilter(clock=clock)
        self.on_dropped = on_dropped
        self.on_sent = on_sent
        self.clock = clock
        self.wall = wall
        self._queue: deque[_Pending] = deque()
        self._wake = asyncio.Event()
        self._aggregates = Aggregates()
        self._last_ns = 0
        self._client: Any = None  # kubernetes-asyncio's ApiClient, made by the first send
        self._last_log: dict[str, float] = {}  # why -> when a drop was last logged
        self._unlogged: dict[str, int] = {}    # why -> drops not logged since

    # -- the decision path: never waits ---------------------------------------------------------------------
    def record(self, event: PodEvent) -> None:
        if not self.spam.allow(event.uid or f"{event.namespace}/{event.name}"):
            self._drop("rate-limited", event, "the pod's burst of Events is spent (one more every 5 minutes)")
            return
        if len(self._queue) >= self.queue_size:
            self._drop("queue-full", event, f"{self.queue_size} Events wait for the API server already")
            return
        at = self.wall()
        ns = max(int(at * 1e9), self._last_ns + 1)
        self._last_ns = ns
        self._queue.append(_Pending(event, at, f"{event.name}.{ns:x}"))
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    # -- the background task --------------------------------------------------------------------------------
    async def run(self) -> None:
        await self._wake.wait()
        # the API client's import takes seconds on a loaded node: in a worker thread, never on the decisions' loop
        await asyncio.to_thread(importlib.import_module, "kubernetes_asyncio.client")
        from kubernetes_asyncio.client.rest import ApiException

        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                p = self._queue.popleft()
                try:
                    await self._send(p)
                except asyncio.CancelledError:
                    raise
                except ApiException as e:
                    self._drop("refused", p.event, f"the API server answered {e.status} {e.reason}: "
                                                   f"{_api_message(e)}")
                except Exception as e:  # connection refused, timeout, no credentials: the API server is not there
                    self._drop("unreachable", p.event, f"{type(e).__name__}: {e}")

    async def _send(self, p: _Pending) -> None:
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.rest import ApiException

        if self._client is None:
            self._client = await asyncio.wait_for(api_client(self.kubeconfig), self.request_seconds)
        core = client.CoreV1Api(self._client)
        ev = p.event
        key: AggregateKey = (ev.namespace, ev.uid, ev.type, ev.reason, ev.message)
        stamp = _rfc3339(p.at)
        seen = self._aggregates.get(key)
        if seen is not None:
            try:
                await core.patch_namespaced_event(seen.name, ev.namespace,
                                                  {"count": seen.count + 1, "lastTimestamp": stamp},
                                                  _content_type="application/merge-patch+json",
                                                  _request_timeout=self.request_seconds)
            except ApiException as e:
                if e.status != 404:  # gone (Events live an hour): created anew below
                    raise
                self._aggregates.forget(key)
            else:
                self._aggregates.put(key, Aggregate(seen.name, seen.count + 1, seen.first_timestamp))
                self.on_sent("patched")
                return
        await core.create_namespaced_event(ev.namespace, self._body(p, stamp),
                                           _request_timeout=self.request_seconds)
        self._aggregates.put(key, Aggregate(p.name, 1, stamp))
        self.on_sent("created")

    def _body(self, p: _Pending, stamp: str) -> dict[str, Any]:
        ev = p.event
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": ev.namespace, "name": ev.name}
        if ev.uid:
            involved["uid"] = ev.uid
        return {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": p.name, "namespace": ev.namespace},
                "involvedObject": involved, "type": ev.type, "reason": ev.reason, "message": ev.message,
                "source": {"component": COMPONENT, "host": self.node_name},
                "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}

    def _drop(self, why: str, event: PodEvent, detail: str) -> None:
        """Count the drop; log it, unless a drop for the same ``why`` was logged less than a minute ago."""
        self.on_dropped(why)
        now = self.clock()
        last = self._last_log.get(why)
        if last is not None and now - last < LOG_EVERY_SECONDS:
            self._unlogged[why] = self._unlogged.get(why, 0) + 1
            return
        more = self._unlogged.pop(why, 0)
        also = f" ({more} more dropped so since the last line)" if more else ""
        log.warning("Event %s on pod %s/%s dropped (%s): %s%s", event.reason, event.namespace, event.name, why,
                    detail, also)
        self._last_log[why] = now

    async def close(self) -> None:
        """Close the API client (the task that ``run``s is cancelled by its owner first)."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None


def _rfc3339(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _api_message(e: Exception) -> str:
    body = getattr(e, "body", None)
    return str(body)[:300] if body else str(e)
