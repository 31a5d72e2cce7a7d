"""A bounded memo of a pure function of a pod without its identity (perf, issue 37 round 3: /validate's checks of a
pod CREATE that read the pod alone).

By the time a validating webhook sees a pod CREATE, the API server has given the pod its uid and, from
``generateName``, its name: every pod's text differs there, while the pods of one Deployment, ReplicaSet or Job
agree on everything else /validate's pod checks read. So the key is the pod's JSON text (msgspec, one C call) with
``metadata.uid``, ``metadata.name`` and ``metadata.labels`` left out (the identity, and labels that a StatefulSet
makes per pod and the checks never read), together with the caller's ``context`` (what else the answer depends on:
the request's namespace, the operator's policy...). The memo works its answer out again from that key alone (the text
decoded, the context passed on), so it can never answer for another pod or context; whatever the function reads of
the pod, it reads it from the key. A pod the key cannot stand for is not remembered (``None``: the caller takes its
own path): ``metadata`` not an object, a uid or name that is not a string (the pod model refuses those, naming the
field), a value JSON cannot carry as it is, or a ``null`` in the text (a non-finite number encodes as one).
Nothing about a node may be computed here: the caller asks the nodes afterwards, every time.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

import msgspec

__all__ = ["PodTextMemo"]

T = TypeVar("T")

_LEFT_OUT = frozenset({"uid", "name", "labels"})  # metadata the key leaves out (see above)


class PodTextMemo(Generic[T]):
    """``compute(pod, context)`` remembered for ``size`` distinct (context, pod text) keys, the pod given to it as
    decoded from the key, without its uid, name and labels."""

    def __init__(self, compute: Callable[[Mapping[str, Any], Any], T], size: int) -> None:
        self._compute = compute
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder()
        self._of_key = functools.lru_cache(maxsize=size)(self._from_key)

    def get(self, pod: Mapping[str, Any], context: Hashable) -> T | None:
        """``compute``'s answer for ``pod`` in ``context``, or None when the pod cannot be keyed (see the module)."""
        meta = pod.get("metadata")
        if not isinstance(meta, dict):
            return None
        if not (isinstance(meta.get("uid", ""), str) and isinstance(meta.get("name", ""), str)):
            return None
        bare = dict(pod)
        bare["metadata"] = {k: v for k, v in meta.items() if k not in _LEFT_OUT}
        try:
            text = self._encoder.encode(bare)
        except (TypeError, ValueError, OverflowError):  # not plain JSON values (a Mapping subclass, a lone surrogate)
            return None
        if b"null" in text:  # a non-finite float encodes as null: only the pod itself says what it holds
            return None
        return self._of_key(context, text)

    def _from_key(self, context: Any, text: bytes) -> T:
        return self._compute(self._decoder.decode(text), context)

    def cache_info(self) -> Any:
        """The memo's hits, misses and size (``functools.lru_cache``'s)."""
        return self._of_key.cache_info()
