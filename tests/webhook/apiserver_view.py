"""What kube-apiserver makes of a webhook's answer that is not 2xx, and what kubectl then shows: written from the
behaviour of k8s.io/apiserver's admission dispatchers and client-go's ``rest`` package (facts, not their code).

1. The webhook's REST client turns a status outside 200-206 into an error. Its message comes from the body only when
   the answer's content type is empty or ``text/*``: the body (at most 2,048 bytes, whitespace trimmed); otherwise
   the word ``unknown``. The status code then picks the sentence (``NewGenericServerResponse``): for 5xx (but 503)
   ``an error on the server ("<message>") has prevented the request from succeeding``; for 403 and 415 the message
   itself; for 400, 404, 503 and the rest a fixed sentence without it.
2. If that body decodes as a ``v1`` ``Status`` with ``status: Failure``, that Status's message replaces the error
   (``Result.Error``).
3. The dispatcher wraps it: ``failed calling webhook "<name>": failed to call webhook: <error>``. With
   ``failurePolicy: Ignore`` the request goes on (allowed); with ``Fail`` it is refused with
   ``Internal error occurred: <that>`` (``NewInternalError``, reason InternalError, code 500).
4. kubectl prints ``Error from server (InternalError): error when creating "<file>": <message>``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["Outcome", "call_error", "kubectl_line", "outcome"]

_FIXED = {400: "the server rejected our request for an unknown reason",
          401: "the server has asked for the client to provide credentials",
          404: "the server could not find the requested resource",
          405: "the server does not allow this method on the requested resource",
          409: "the server reported a conflict",
          422: "the server rejected our request due to an error in our request",
          429: "the server has received too many requests and has asked us to try again later",
          503: "the server is currently unable to handle the request",
          504: "the server was unable to return a response in the time allotted, but may still be processing the "
               "request"}


def _is_text(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "" or media.startswith("text/")


def _status_message(body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if (isinstance(doc, dict) and doc.get("kind") == "Status" and doc.get("apiVersion", "v1") == "v1"
            and doc.get("status") == "Failure"):
        return str(doc.get("message", ""))
    return None


def call_error(status: int, content_type: str, body: bytes) -> str | None:
    """The error of the webhook call for an answer (None when the status is 2xx: the AdmissionReview is read)."""
    if 200 <= status <= 206:
        return None
    message = body[:2048].decode("utf-8", "replace").strip() if _is_text(content_type) else "unknown"
    if status in (403, 415):
        text = message
    elif status in _FIXED:
        text = _FIXED[status]
    elif status >= 500:
        text = f'an error on the server ("{message}") has prevented the request from succeeding'
    else:
        text = f"the server responded with the status code {status} but did not return more information"
    structured = _status_message(body)
    return structured if structured is not None else text


@dataclass(frozen=True)
class Outcome:
    allowed: bool
    message: str | None  # what the API server answers the client when it refuses


def outcome(webhook: str, failure_policy: str, error: str) -> Outcome:
    """What the API server does after a failed call to ``webhook``."""
    if failure_policy == "Ignore":
        return Outcome(True, None)
    return Outcome(False, f'Internal error occurred: failed calling webhook "{webhook}": failed to call webhook: '
                          f"{error}")


def kubectl_line(message: str, file: str = "pod.yaml") -> str:
    return f'Error from server (InternalError): error when creating "{file}": {message}'
