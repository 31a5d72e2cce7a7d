"""A request to change a running pod's CPU mode, as the proxy's two sources deliver it (the API server's watch of
the node's pods, ``nodeagent.decisions.pod_watch``; the local command, ``nodeagent.serve.control``), and the answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from allocator.pod import PodInfo

__all__ = ["ModeAnswer", "ModeRequest", "ModeSink"]


@dataclass(frozen=True)
class ModeRequest:
    """Move pod ``namespace/name`` (``uid`` when known) to ``mode``: ``none``, ``exclusive``, ``share`` or
    ``kubelet`` (kubelet's rule). ``pod`` is its model from the API object (None from the local command: the proxy
    reads it from the pod's sandbox). ``first_sight``: the watch sees this pod for the first time since the proxy
    started (a mode equal to the one the pod was created with is then no request, see
    ``nodeagent.decisions.mode_apply``)."""

    namespace: str
    name: str
    mode: str
    source: str                   # "api" or "local"
    uid: str = ""
    pod: PodInfo | None = None
    first_sight: bool = False

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ModeAnswer:
    """What became of a request: ``outcome`` is ``changed``, ``unchanged``, ``refused``, ``ignored`` (not a pod of
    this node, or nothing to do) or ``error``; ``reason`` kubelet's reason of a refusal."""

    outcome: str
    message: str
    reason: str | None = None
    change: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"outcome": self.outcome, "message": self.message}
        if self.reason:
            out["reason"] = self.reason
        if self.change is not None:
            out["change"] = self.change
        return out


ModeSink = Callable[[ModeRequest], Awaitable[ModeAnswer]]
