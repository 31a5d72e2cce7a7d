"""What the frame relay reads in header blocks: each ``:path``'s method and interceptor (``_Routes``), a trailer
block's gRPC status (``_Statuses``) and a held answer's header blocks (``_Blocks``), both remembered by their bytes
(the runtime encodes its blocks without the dynamic table, see ``frame_kubelet``), the metadata of a decoded block,
and the errors that close a relayed connection."""

from __future__ import annotations

import base64
from collections.abc import Sequence

import grpc
import hpack

from criproxy.relay.grpc_relay import CRI_SERVICES, UNARY_METHODS, Interceptor, Metadata, PassThrough

_CACHE_LIMIT = 1024
_CACHED_BLOCK = 512  # the largest header block remembered (_Blocks)
# the largest header block accepted or kept (grpc-go's default header list limit, kubelet's and its runtime's)
_MAX_HEADER_LIST = 16 << 20


class _ProtocolError(Exception):
    """A peer broke HTTP/2 (or HPACK): the connection is closed."""


class _OverBudget(_ProtocolError):
    """A client would cost more memory than a connection may (conn_limits): the connection is closed."""


class _Routes:
    """What each ``:path`` is: its method name, interceptor (None: relayed untouched) and the interceptor's
    ``PassThrough`` (None: every call held); shared by connections."""

    def __init__(self, interceptors: dict[str, Interceptor], pass_through: dict[str, PassThrough]) -> None:
        self._interceptors = interceptors
        self._pass_through = pass_through
        self._known: dict[bytes, tuple[str, Interceptor | None, PassThrough | None]] = {}

    def of(self, path: bytes) -> tuple[str, Interceptor | None, PassThrough | None]:
        route = self._known.get(path)
        if route is None:
            method = path.decode("utf-8", "replace")
            service, _, name = method.lstrip("/").rpartition("/")
            icpt = self._interceptors.get(name) if service in CRI_SERVICES and name in UNARY_METHODS else None
            route = (method, icpt, self._pass_through.get(name) if icpt is not None else None)
            if len(self._known) < _CACHE_LIMIT:
                self._known[path] = route
        return route


class _Statuses:
    """The gRPC status of a runtime's trailer block, remembered by its bytes (stateless blocks: see module doc)."""

    def __init__(self) -> None:
        self._known: dict[bytes, grpc.StatusCode] = {}

    def of(self, block: bytes) -> grpc.StatusCode:
        code = self._known.get(block)
        if code is None:
            try:
                code = _status_code(_stateless_decode(block))
            except _ProtocolError:
                return grpc.StatusCode.UNKNOWN
            if len(self._known) < _CACHE_LIMIT:
                self._known[block] = code
        return code


class _Blocks:
    """The runtime's header blocks of held answers, decoded and remembered by their bytes (perf, issue 37: a runtime
    answers with the same few blocks, and an HPACK decode costs tens of microseconds); shared by connections."""

    def __init__(self) -> None:
        self._known: dict[bytes, tuple[tuple[bytes, bytes], ...]] = {}

    def of(self, block: bytes) -> tuple[tuple[bytes, bytes], ...]:
        headers = self._known.get(block)
        if headers is None:
            headers = tuple(_stateless_decode(block))
            if len(block) <= _CACHED_BLOCK and len(self._known) < _CACHE_LIMIT:
                self._known[block] = headers
        return headers


def _stateless_decode(block: bytes) -> list[tuple[bytes, bytes]]:
    decoder = hpack.Decoder()
    decoder.header_table_size = 0
    decoder.max_allowed_table_size = 0
    try:
        return [(bytes(k), bytes(v)) for k, v in decoder.decode(block, raw=True)]
    except hpack.HPACKError as e:
        raise _ProtocolError(f"cannot decode the runtime's header block: {e}") from e


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def _status_code(headers: Sequence[tuple[bytes, bytes]]) -> grpc.StatusCode:
    for k, v in headers:
        if k == b"grpc-status":
            return _CODES.get(int(v), grpc.StatusCode.UNKNOWN) if v.isdigit() else grpc.StatusCode.UNKNOWN
    return grpc.StatusCode.UNKNOWN


# what gRPC keeps out of a response's initial and trailing metadata
_STATUS_KEYS = frozenset({b"content-type", b"grpc-status", b"grpc-message", b"grpc-encoding",
                          b"grpc-accept-encoding"})


def _metadata(headers: Sequence[tuple[bytes, bytes]], *, skip: frozenset[bytes] = _STATUS_KEYS) -> Metadata:
    out: list[tuple[str, str | bytes]] = []
    for k, v in headers:
        if k.startswith(b":") or k in skip:
            continue
        key = k.decode("latin-1")
        if key.endswith("-bin"):
            out.append((key, base64.b64decode(v + b"=" * (-len(v) % 4))))
        else:
            out.append((key, v.decode("latin-1")))
    return tuple(out)


def _unquote(message: bytes) -> str:
    import urllib.parse

    return urllib.parse.unquote(message.decode("latin-1"), errors="replace")


def _message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload
