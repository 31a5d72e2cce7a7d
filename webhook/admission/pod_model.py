"""The pod model of a review's pod, its containers read once per distinct container spec (perf, issue 37).

Reading a pod's containers (names, roles, CPU and memory quantities) is a pure function of the two container lists
of its spec, and the pods of one Deployment, ReplicaSet or Job repeat them exactly. ``pod_info`` reads the pod as
``PodInfo.from_pod`` does, but the containers come from a bounded memo keyed by the lists' JSON text (msgspec,
one C call): a repeated spec costs its encoding instead of the model's Python walk over every quantity. The pod's
own fields (identity, annotations, status, pod-level resources) are read every time. Nothing here depends on a node.

The key is the text the lists encode to, and the memo reads the containers again from that text (a pure function of
its argument, so the memo can never answer for other lists): lists the encoding could change (a value JSON cannot
carry as it is, a ``null`` that could have been a non-finite number, a key order aside) are read directly.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import msgspec

from allocator.pod import ContainerInfo, PodInfo, read_containers

__all__ = ["MEMO_SIZE", "pod_info"]

MEMO_SIZE = 2048  # distinct container specs remembered (about 1-2 KiB each)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """``PodInfo.from_pod(pod)``, the containers read once per distinct spec. Raises PodSpecError as it does."""
    return PodInfo.from_pod(pod, containers_of=_containers)


def _containers(spec: Mapping[str, Any]) -> tuple[ContainerInfo, ...]:
    # as ``read_containers`` reads them: a list that is absent, null or empty is no container
    lists = (spec.get("initContainers") or [], spec.get("containers") or [])
    try:
        key = _encoder.encode(lists)
    except (TypeError, ValueError, OverflowError):  # not plain JSON values (a Mapping subclass, a lone surrogate)
        return read_containers(spec)
    if b"null" in key:  # a non-finite float encodes as null: only the lists themselves say what they hold
        return read_containers(spec)
    return _read_text(key)


@functools.lru_cache(maxsize=MEMO_SIZE)
def _read_text(key: bytes) -> tuple[ContainerInfo, ...]:
    """The containers of the two lists ``key`` encodes (errors are raised, never remembered)."""
    init, apps = _decoder.decode(key)
    return read_containers({"initContainers": init, "containers": apps})
