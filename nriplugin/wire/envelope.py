"""ttrpc's envelopes (package ``ttrpc``): a Request names the service and method and carries the serialized request;
a Response carries a status and, on success only, the serialized response."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError

from protos import ttrpc_pb2

from .codes import Code
from .errors import ProtocolError

__all__ = ["Call", "Reply", "decode_call", "decode_reply", "encode_call", "encode_error", "encode_reply"]


@dataclass(frozen=True)
class Call:
    """A decoded Request envelope."""

    service: str
    method: str
    payload: bytes
    timeout_nano: int


@dataclass(frozen=True)
class Reply:
    """A decoded Response envelope."""

    code: int
    message: str
    payload: bytes


def encode_call(service: str, method: str, payload: bytes, timeout_nano: int = 0) -> bytes:
    return bytes(ttrpc_pb2.Request(service=service, method=method, payload=payload,
                                   timeout_nano=timeout_nano).SerializeToString())


def encode_reply(payload: bytes) -> bytes:
    return bytes(ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=Code.OK), payload=payload).SerializeToString())


def encode_error(code: int, message: str) -> bytes:
    """An error Response: a status with ``code`` (not OK) and no payload, as ttrpc's server sends it."""
    if code == Code.OK:
        raise ValueError("an error status needs a code other than OK")
    return bytes(ttrpc_pb2.Response(status=ttrpc_pb2.Status(code=code, message=message)).SerializeToString())


def _decode(kind: Any, data: bytes, where: str) -> Any:
    try:
        return kind.FromString(data)
    except DecodeError as e:
        raise ProtocolError(f"a ttrpc {kind.__name__} envelope of {len(data)} bytes on {where} that does not decode "
                            f"({e})") from None


def decode_call(data: bytes, where: str) -> Call:
    req = _decode(ttrpc_pb2.Request, data, where)
    return Call(req.service, req.method, req.payload, req.timeout_nano)


def decode_reply(data: bytes, where: str) -> Reply:
    resp = _decode(ttrpc_pb2.Response, data, where)
    return Reply(resp.status.code, resp.status.message, resp.payload)
