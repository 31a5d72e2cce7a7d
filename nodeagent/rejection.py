"""A refusal of the node agent, in the same terms for both doors: a gRPC status code (NRI's ttrpc uses the same
numbers) and the message kubelet shows. The CRI proxy answers the call with it; the NRI plugin returns it as the
event's error status."""

from __future__ import annotations

import grpc

__all__ = ["Rejection"]


class Rejection(Exception):
    """Raised by a decision to answer the caller with an error, nothing forwarded or created.

    A plain exception, not a frozen dataclass: Python assigns ``__traceback__`` on the way out of a context manager
    (the pool gate's), which a frozen dataclass refuses, and the caller got INTERNAL "FrozenInstanceError" instead
    of the rejection."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message
