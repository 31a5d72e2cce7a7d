"""The CPU intent annotation: what the webhook stamps on a pod and the CRI proxy reads on CreateContainer.

CRI carries no resource requests and no init/sidecar roles, so the webhook records them on the pod as
``numapin.io/cpu-intent``, a compact JSON document::

    {"v": 1, "qosClass": "Guaranteed", "cpuManager": "exclusive",
     "containers": [{"name": "app", "role": "app", "cpu": [2000, 2000], "memory": [1073741824, 1073741824]}]}

``cpu`` is ``[request, limit]`` in milli-CPUs, ``memory`` ``[request, limit]`` in bytes, ``null`` where not set;
``hugepages`` (only for a container asking some) maps ``hugepages-<size>`` to bytes (requests equal limits);
``cpuManager`` is the normalised ``qos.gocrane.io/cpu-manager`` value or ``null``. Containers are listed
init containers first (``role`` ``init`` or ``sidecar``), in spec order, then app containers. ``"podLevel": true``
is present only for a pod with pod-level resources (``spec.resources``; by kubelet's rule none of its containers gets
CPUs of its own, and ``qosClass`` is the pod-level one); older intents without it read as ``false``.

The annotation is untrusted on input (anyone creating a pod can write it): ``decode_intent`` refuses a text longer
than ``MAX_INTENT_CHARS`` or nested deeper than ``MAX_INTENT_DEPTH`` before handing it to the JSON parser (checked
by linear, non-recursive scans), so every bad annotation is a PodSpecError, never a RecursionError.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from .errors import PodSpecError
from .pod import CPU_MANAGER_VALUES, ContainerInfo, PodInfo, is_bypassed

__all__ = ["INTENT_ANNOTATION", "INTENT_VERSION", "MAX_INTENT_CHARS", "MAX_INTENT_DEPTH", "decode_intent",
           "encode_intent", "json_depth_exceeds"]

INTENT_ANNOTATION = "numapin.io/cpu-intent"
INTENT_VERSION = 1
_ROLES = ("init", "sidecar", "app")
_QOS = ("Guaranteed", "Burstable", "BestEffort")
# ~580 containers; checking the longest text takes a few milliseconds. The intent is 4 levels deep.
MAX_INTENT_CHARS = 64 * 1024
MAX_INTENT_DEPTH = 4
_STRING = re.compile(r'"[^"]*"')
_INNERMOST = re.compile(r"\[[^\[\]{}]*\]|\{[^\[\]{}]*\}")
_BRACKET = re.compile(r"[\[\]{}]")


def json_depth_exceeds(text: str, limit: int) -> bool:
    """Whether JSON ``text`` nests arrays/objects deeper than ``limit``: escapes dropped, strings blanked, then
    innermost pairs removed ``limit`` times, each a linear regular-expression pass (no pattern here can backtrack
    over more than the span it fails on); brackets left over mean deeper (or unbalanced, which the parser reports).
    On valid JSON the answer is exact; past the first invalid character the parser stops anyway."""
    # escaped backslashes first (left to right, as the parser reads them), then escaped quotes: what is left of a
    # string holds no quote; other escapes cannot hold a bracket outside a string
    flat = _STRING.sub('""', text.replace("\\\\", "").replace('\\"', ""))
    for _ in range(limit):
        flat, n = _INNERMOST.subn("0", flat)
        if not n:
            break
    return _BRACKET.search(flat) is not None


def encode_intent(pod: PodInfo) -> str:
    """The annotation's text. Raises PodSpecError when it would be longer than ``decode_intent`` reads."""
    doc = {
        "v": INTENT_VERSION,
        "qosClass": pod.qos_class,
        "cpuManager": pod.cpu_manager,
        "containers": [
            {
                "name": c.name,
                "role": c.role,
                "cpu": [c.cpu_request_milli, c.cpu_limit_milli],
                "memory": [c.memory_request, c.memory_limit],
                **({"hugepages": dict(c.hugepages)} if c.hugepages else {}),
            }
            for c in pod.containers
        ],
    }
    if pod.pod_level_resources:
        doc["podLevel"] = True
    text = _sorted_json(doc)
    if len(text) > MAX_INTENT_CHARS:
        raise PodSpecError(f"the CPU intent of pod {pod.ref} would take {len(text)} characters, more than the "
                           f"{MAX_INTENT_CHARS} numapin reads back ({len(pod.containers)} containers)")
    return text


_sorted_encoder = msgspec.json.Encoder(order="sorted")


def _sorted_json(doc: dict[str, Any]) -> str:
    """``json.dumps(doc, separators=(",", ":"), sort_keys=True)`` of an intent (strings, integers, null, booleans),
    by msgspec when that is the same text (perf, issue 37: it was a quarter of a /mutate): when the text is ASCII
    without DEL, the characters the standard library writes as ``\\u`` escapes and msgspec as they are."""
    raw = _sorted_encoder.encode(doc)
    if raw.isascii() and b"\x7f" not in raw:
        return raw.decode("ascii")
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode_intent(
    text: str, *, uid: str, namespace: str, name: str, annotations: Mapping[str, str] | None = None
) -> PodInfo:
    """Rebuild the pod model from the annotation. Raises PodSpecError saying what is wrong with it."""
    where = f"annotation {INTENT_ANNOTATION} of pod {namespace}/{name}"
    if not isinstance(text, str):
        raise PodSpecError(f"{where} must be a string")
    if len(text) > MAX_INTENT_CHARS:
        raise PodSpecError(f"{where} is {len(text)} characters long; at most {MAX_INTENT_CHARS} are read")
    try:
        qos, mode, containers, level = _stated(text) if len(text) <= _CACHED_CHARS else _stated.__wrapped__(text)
    except PodSpecError as e:
        raise PodSpecError(where + str(e)) from None
    bypass = is_bypassed(annotations or {})
    return PodInfo(uid=uid, namespace=namespace, name=name, qos_class=qos, cpu_manager=mode, bypass=bypass,
                   containers=containers, pod_level_resources=level)


# perf (issue 13): what an intent states depends on its text alone, and the pods of one workload share their text;
# the last texts read are remembered (bounded: 1,024 texts of at most _CACHED_CHARS; refusals are not remembered)
_CACHED_CHARS = 4096


@functools.lru_cache(maxsize=1024)
def _stated(text: str) -> tuple[Any, Any, tuple[ContainerInfo, ...], bool]:
    """QoS class, mode, containers and whether the pod has pod-level resources, as an intent text states.
    PodSpecError messages are to follow the annotation's name."""
    if json_depth_exceeds(text, MAX_INTENT_DEPTH):
        raise PodSpecError(f" is not JSON nested at most {MAX_INTENT_DEPTH} levels deep")
    try:
        doc = json.loads(text)
    except (TypeError, ValueError, RecursionError) as e:
        raise PodSpecError(f" is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise PodSpecError(" must be a JSON object")
    if doc.get("v") != INTENT_VERSION:
        raise PodSpecError(f" has version {doc.get('v')!r}; this numapin reads version {INTENT_VERSION}")
    qos = doc.get("qosClass")
    if qos not in _QOS:
        raise PodSpecError(f": qosClass must be one of {', '.join(_QOS)}, got {qos!r}")
    mode = doc.get("cpuManager")
    if mode is not None and mode not in CPU_MANAGER_VALUES:
        raise PodSpecError(f": cpuManager must be null or one of {', '.join(CPU_MANAGER_VALUES)}, got {mode!r}")
    raw = doc.get("containers")
    if not isinstance(raw, list) or not raw:
        raise PodSpecError(": containers must be a non-empty list")
    containers = tuple(_container(c, f": containers[{i}]") for i, c in enumerate(raw))
    if len({c.name for c in containers}) != len(containers):
        raise PodSpecError(": container names must be unique")
    level = doc.get("podLevel", False)
    if not isinstance(level, bool):
        raise PodSpecError(f": podLevel must be true or false, got {level!r}")
    return qos, mode, containers, level


def _pair(value: Any, field: str) -> tuple[int | None, int | None]:
    if not isinstance(value, list) or len(value) != 2 or not all(
        v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 0) for v in value
    ):
        raise PodSpecError(f"{field} must be [request, limit] with non-negative integers or null")
    return value[0], value[1]


def _container(c: Any, field: str) -> ContainerInfo:
    if not isinstance(c, dict):
        raise PodSpecError(f"{field} must be an object")
    name = c.get("name")
    if not isinstance(name, str) or not name:
        raise PodSpecError(f"{field}.name must be a non-empty string")
    role = c.get("role")
    if role not in _ROLES:
        raise PodSpecError(f"{field}.role must be one of {', '.join(_ROLES)}, got {role!r}")
    cpu = _pair(c.get("cpu"), f"{field}.cpu")
    mem = _pair(c.get("memory"), f"{field}.memory")
    pages = c.get("hugepages", {})
    if not isinstance(pages, dict) or not all(
        isinstance(k, str) and k.startswith("hugepages-") and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in pages.items()
    ):
        raise PodSpecError(f"{field}.hugepages must map hugepages-<size> to a non-negative number of bytes")
    return ContainerInfo(name=name, role=role, cpu_request_milli=cpu[0], cpu_limit_milli=cpu[1],
                         memory_request=mem[0], memory_limit=mem[1], hugepages=tuple(sorted(pages.items())))
