"""A small real HTTP server speaking the part of the Kubernetes API the webhook's cluster sources use: list and
``?watch=true`` of NodeResourceTopologies, Nodes and Pods (all namespaces), with resourceVersions, a bounded event
history (a watch from a version older than the history gets an ERROR 410 event, as from kube-apiserver), field
selectors ``spec.nodeName=``/``spec.nodeName!=``/``metadata.name=``/``metadata.namespace=`` (an object leaving the
selector is sent as DELETED, as kube-apiserver does), and the test's hooks: end every open watch, inject an event,
change objects without recording the change (as if the history were compacted). A single pod can be read with
GET ``/api/v1/namespaces/{namespace}/pods/{name}`` (``get_delay`` seconds late, for timeouts)."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

NRT_PATH = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"
NODES_PATH = "/api/v1/nodes"
PODS_PATH = "/api/v1/pods"

_LISTS = {NRT_PATH: ("NodeResourceTopologyList", "topology.node.k8s.io/v1alpha2"),
          NODES_PATH: ("NodeList", "v1"), PODS_PATH: ("PodList", "v1")}


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])


def _field(obj: Mapping[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return "" if cur is None else str(cur)


def parse_field_selector(text: str) -> list[tuple[str, bool, str]]:
    """``a=b,c!=d`` as (field, equal, value); ValueError on a field this server does not know."""
    out: list[tuple[str, bool, str]] = []
    for term in filter(None, text.split(",")):
        if "!=" in term:
            name, value = term.split("!=", 1)
            equal = False
        else:
            name, value = term.split("==", 1) if "==" in term else term.split("=", 1)
            equal = True
        if name not in ("spec.nodeName", "metadata.name", "metadata.namespace"):
            raise ValueError(f"field label not supported: {name}")
        out.append((name, equal, value))
    return out


def _is_watch(query: Mapping[str, str]) -> bool:
    """kube-apiserver reads ``watch`` with Go's strconv.ParseBool (kubernetes-asyncio sends ``True``)."""
    return query.get("watch", "") in ("1", "t", "T", "true", "TRUE", "True")


def matches(obj: Mapping[str, Any], selector: list[tuple[str, bool, str]]) -> bool:
    return all((_field(obj, f) == v) == eq for f, eq, v in selector)


@dataclass
class _Resource:
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # (resourceVersion, type, object) in order; older entries are dropped by compact()
    history: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)
    oldest: int = 0  # a watch from a version below this gets 410


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    authorization: str | None


class FakeKubeAPI:
    """The server; ``await start()`` then ``url``; objects are changed with ``put``/``delete``."""

    def __init__(self) -> None:
        self.rv = 100
        self.resources: dict[str, _Resource] = {p: _Resource() for p in _LISTS}
        self.requests: list[Request] = []
        self._changed = asyncio.Condition()
        self._generation = 0  # bumped by end_watches(): every open watch returns
        self._injected: list[dict[str, Any]] = []
        self.open_watches = 0
        self.get_delay = 0.0
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- server ---------------------------------------------------------------------------------------------
    async def start(self, port: int = 0) -> None:
        app = web.Application()
        for path in _LISTS:
            app.router.add_get(path, self._handle)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods/{name}", self._get_pod)
        # handler_cancellation: a client that goes away ends its watch handler (the open-watch count drops)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def close(self) -> None:
        await self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}}],
        }))
        return path

    # -- objects --------------------------------------------------------------------------------------------
    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def _stamp(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = copy.deepcopy(dict(obj))
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return obj

    async def put(self, path: str, obj: Mapping[str, Any], *, record: bool = True) -> dict[str, Any]:
        """Create or replace an object (ADDED or MODIFIED event unless ``record`` is False)."""
        res = self.resources[path]
        stamped = self._stamp(obj)
        key = _key(stamped)
        kind = "MODIFIED" if key in res.objects else "ADDED"
        res.objects[key] = stamped
        if record:
            res.history.append((self.rv, kind, stamped))
        else:
            self.compact(path)
        await self._notify()
        return stamped

    async def delete(self, path: str, name: str, namespace: str = "", *, record: bool = True) -> None:
        res = self.resources[path]
        old = res.objects.pop((namespace, name))
        gone = self._stamp(old)
        if record:
            res.history.append((self.rv, "DELETED", gone))
        else:
            self.compact(path)
        await self._notify()

    def compact(self, path: str) -> None:
        """Forget the event history: a watch from any earlier version now gets 410 Gone."""
        res = self.resources[path]
        res.history.clear()
        res.oldest = self.rv

    async def end_watches(self) -> None:
        """Close every open watch response (as kube-apiserver does at its timeout or on restart)."""
        self._generation += 1
        await self._notify()

    async def inject(self, event: Mapping[str, Any]) -> None:
        """Send ``event`` on every watch open now (e.g. an ERROR Status)."""
        self._injected.append(dict(event))
        await self._notify()

    def watch_requests(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path and _is_watch(r.query)]

    def list_requests(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path and not _is_watch(r.query)]

    # -- HTTP -----------------------------------------------------------------------------------------------
    @staticmethod
    def _status(code: int, reason: str, message: str) -> dict[str, Any]:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                "reason": reason, "code": code}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append(Request(request.method, request.path, query, request.headers.get("Authorization")))
        try:
            selector = parse_field_selector(query.get("fieldSelector", ""))
        except ValueError as e:
            return web.json_response(self._status(400, "BadRequest", str(e)), status=400)
        if _is_watch(query):
            return await self._watch(request, query, selector)
        res = self.resources[request.path]
        kind, api_version = _LISTS[request.path]
        items = [o for k, o in sorted(res.objects.items()) if matches(o, selector)]
        return web.json_response({"kind": kind, "apiVersion": api_version,
                                  "metadata": {"resourceVersion": str(self.rv)}, "items": items})

    async def _get_pod(self, request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["namespace"], request.match_info["name"]
        self.requests.append(Request(request.method, request.path, dict(request.query),
                                     request.headers.get("Authorization")))
        if self.get_delay:
            await asyncio.sleep(self.get_delay)
        obj = self.resources[PODS_PATH].objects.get((ns, name))
        if obj is None:
            return web.json_response(self._status(404, "NotFound", f'pods "{name}" not found'), status=404)
        return web.json_response(obj)

    def get_requests(self) -> list[Request]:
        return [r for r in self.requests if r.path.startswith("/api/v1/namespaces/")]

    async def _watch(self, request: web.Request, query: dict[str, str],
                     selector: list[tuple[str, bool, str]]) -> web.StreamResponse:
        res = self.resources[request.path]
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        generation = self._generation
        injected_seen = len(self._injected)
        self.open_watches += 1
        try:
            since = int(query.get("resourceVersion") or self.rv)
            if since < res.oldest:
                await self._send(resp, {"type": "ERROR", "object": self._status(
                    410, "Expired", f"too old resource version: {since} ({res.oldest})")})
                return resp
            # what the client last saw of each object, to tell a selector exit from an unrelated change
            visible: dict[tuple[str, str], bool] = {}
            for rv, kind, obj in list(res.history):
                if rv <= since:
                    visible[_key(obj)] = kind != "DELETED" and matches(obj, selector)
            for key, obj in res.objects.items():
                if int(obj["metadata"]["resourceVersion"]) <= since:
                    visible[key] = matches(obj, selector)
            while True:
                for rv, kind, obj in [e for e in res.history if e[0] > since]:
                    key = _key(obj)
                    was = visible.get(key, False)
                    now = kind != "DELETED" and matches(obj, selector)
                    visible[key] = now
                    if now:
                        await self._send(resp, {"type": "ADDED" if not was else kind, "object": obj})
                    elif was:
                        await self._send(resp, {"type": "DELETED", "object": obj})
                    since = rv
                for event in self._injected[injected_seen:]:
                    await self._send(resp, event)
                injected_seen = len(self._injected)
                if generation != self._generation:
                    return resp
                async with self._changed:
                    if (not [e for e in res.history if e[0] > since] and generation == self._generation
                            and injected_seen == len(self._injected)):
                        await self._changed.wait()
        except ConnectionResetError:
            return resp
        finally:
            self.open_watches -= 1

    @staticmethod
    async def _send(resp: web.StreamResponse, event: Mapping[str, Any]) -> None:
        await resp.write(json.dumps(event).encode() + b"\n")
