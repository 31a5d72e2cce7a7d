"""``/mutate``, pods CREATE and UPDATE: normalise ``qos.gocrane.io/cpu-manager`` and stamp the CPU intent annotation.

On UPDATE the intent is stamped again when the pod already had one or its cpu-manager annotation changes (a change
of mode while the pod runs, see docs/annotations.md), so it keeps saying what the pod says; any other UPDATE of a pod
numapin never stamped is left alone.

The mutated pod shares every subtree it does not change with the original, and the JSON patch is the diff of the
two, so a reinvocation on an already mutated pod yields an empty patch. A value of the cpu-manager annotation that
is not one of the allowed values once trimmed and lowercased is left as it is for ``/validate`` to deny; a pod the
pod model cannot read gets no intent (a stale one is removed) and a warning.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import msgspec

from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, encode_intent
from allocator.pod import CPU_MANAGER_ANNOTATION, CPU_MANAGER_VALUES
from webhook.admission.jsonpatch_diff import diff
from webhook.admission.pod_level import pod_level_warnings
from webhook.admission.pod_model import pod_info
from webhook.admission.review import AdmissionRequest, Verdict

__all__ = ["MEMO_SIZE", "is_pod_request", "mutate_pod", "mutate_review", "mutation"]

log = logging.getLogger("numapin.webhook.mutate")

MEMO_SIZE = 1024  # distinct pods whose patch is remembered (a few KiB each)

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


def is_pod_request(req: AdmissionRequest) -> bool:
    return req.group == "" and req.resource == "pods" and req.sub_resource == ""


def mutate_pod(pod: Mapping[str, Any], *, pod_level_managers: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The mutated pod (sharing unchanged parts with ``pod``) and warnings (``pod_level_managers``: the kubelets'
    ``PodLevelResourceManagers`` gate, for the warning about pod-level resources)."""
    warnings: list[str] = []
    meta_in = pod.get("metadata")
    meta: dict[str, Any] = dict(meta_in) if isinstance(meta_in, Mapping) else {}
    ann_in = meta.get("annotations")
    annotations: dict[str, Any] = dict(ann_in) if isinstance(ann_in, Mapping) else {}

    raw_mode = annotations.get(CPU_MANAGER_ANNOTATION)
    if isinstance(raw_mode, str):
        norm = raw_mode.strip().lower()
        if norm in CPU_MANAGER_VALUES and norm != raw_mode:
            annotations[CPU_MANAGER_ANNOTATION] = norm

    mutated: dict[str, Any] = dict(pod)
    mutated["metadata"] = meta
    try:
        info = pod_info(_with_annotations(mutated, meta, annotations))
        intent = encode_intent(info)
    except PodSpecError as e:
        annotations.pop(INTENT_ANNOTATION, None)
        warnings.append(f"numapin: CPU intent not recorded: {e}")
    else:
        annotations[INTENT_ANNOTATION] = intent
        warnings.extend(pod_level_warnings(replace(info, pod_level_managers=pod_level_managers)))

    if not annotations and not isinstance(ann_in, Mapping):
        return dict(pod), warnings  # nothing to record: the pod stays as it was
    meta["annotations"] = annotations
    return mutated, warnings


def _with_annotations(pod: dict[str, Any], meta: dict[str, Any], annotations: dict[str, Any]) -> dict[str, Any]:
    view = dict(pod)
    view["metadata"] = {**meta, "annotations": annotations}
    return view


def _annotation(obj: Any, key: str) -> Any:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    return ann.get(key) if isinstance(ann, Mapping) else None


def restamps_on_update(pod: Mapping[str, Any], old: Any) -> bool:
    """An UPDATE gets the intent stamped again: the old pod carried one, or the cpu-manager annotation changes."""
    return (_annotation(old, INTENT_ANNOTATION) is not None
            or _annotation(pod, CPU_MANAGER_ANNOTATION) != _annotation(old, CPU_MANAGER_ANNOTATION))


async def mutate_review(req: AdmissionRequest, *, pod_level_managers: bool = False) -> Verdict:
    if not is_pod_request(req) or req.operation not in ("CREATE", "UPDATE"):
        log.info("mutate: not handled, allowed unchanged: %s", req.describe())
        return Verdict.allow()
    pod = req.object
    if not isinstance(pod, Mapping):
        log.info("mutate: request.object is not a pod, allowed unchanged: %s", req.describe())
        return Verdict.allow()
    if req.operation == "UPDATE" and not restamps_on_update(pod, req.old_object):
        return Verdict.allow()
    warnings, patch = mutation(pod, pod_level_managers=pod_level_managers)
    return Verdict.allow(*warnings, patch=patch)


def mutation(pod: Mapping[str, Any], *, pod_level_managers: bool = False
             ) -> tuple[tuple[str, ...], tuple[Mapping[str, Any], ...]]:
    """The warnings and the JSON patch of ``mutate_pod`` for ``pod``, worked out once per distinct pod (perf, issue
    37). They are a pure function of the pod's JSON (nothing about a node, no time), and the pods of one Deployment,
    ReplicaSet or Job are created with the same one (no name, no uid yet). The key is the text the pod encodes to
    (msgspec, one C call) and the memo works them out again from that text, so it can never answer for another pod;
    a pod that does not encode as it is (a lone surrogate, a non-finite number written as ``null``) is worked out
    directly. The patch's operations are shared between the answers: nothing changes them once made."""
    try:
        key = _encoder.encode(pod)
    except (TypeError, ValueError, OverflowError):
        return _mutation(pod, pod_level_managers)
    if b"null" in key:  # a non-finite float encodes as null: only the pod itself says what it holds
        return _mutation(pod, pod_level_managers)
    return _mutation_of_text(key, pod_level_managers)


def _mutation(pod: Mapping[str, Any], pod_level_managers: bool
              ) -> tuple[tuple[str, ...], tuple[Mapping[str, Any], ...]]:
    mutated, warnings = mutate_pod(pod, pod_level_managers=pod_level_managers)
    return tuple(warnings), tuple(diff(pod, mutated))


@functools.lru_cache(maxsize=MEMO_SIZE)
def _mutation_of_text(key: bytes, pod_level_managers: bool
                      ) -> tuple[tuple[str, ...], tuple[Mapping[str, Any], ...]]:
    return _mutation(_decoder.decode(key), pod_level_managers)
