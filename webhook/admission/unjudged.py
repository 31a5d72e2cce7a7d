"""What the webhook answers when it cannot judge a request: the operator's choice (``--unjudged allow|deny``).

A request cannot be judged when the webhook lacks what the decision needs or cannot read it:

- ``pod_unknown``: a binding names a pod that neither the pod cache nor a GET from the API server (bounded by
  ``--pod-lookup-timeout``) can provide;
- ``node_unknown``: the binding's node has no NodeResourceTopology;
- ``node_unsupported``: the node's configuration cannot be simulated;
- ``pod_unreadable``: numapin's pod model cannot read the pod (e.g. a quantity longer than numapin reads);
- ``internal_error``: deciding raised unexpectedly (a bug; logged with its traceback).

``allow`` (the default) admits the request with a warning saying what was not checked (the node proxy remains the
backstop at CreateContainer); ``deny`` refuses it with the same sentence. Either way it is logged and counted in
``numapin_webhook_unjudged_total{endpoint, reason, action}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from webhook.admission.review import Verdict
from webhook.https.metrics import WebhookMetrics

__all__ = ["UNJUDGED_ACTIONS", "UNJUDGED_REASONS", "UnjudgedAction", "UnjudgedRule"]

log = logging.getLogger("numapin.webhook.unjudged")

UnjudgedAction = Literal["allow", "deny"]
UNJUDGED_ACTIONS: tuple[UnjudgedAction, ...] = ("allow", "deny")
UNJUDGED_REASONS = ("pod_unknown", "node_unknown", "node_unsupported", "pod_unreadable", "internal_error")


@dataclass(frozen=True)
class UnjudgedRule:
    action: UnjudgedAction
    metrics: WebhookMetrics

    def verdict(self, endpoint: str, reason: str, what: str) -> Verdict:
        """The answer for a request that cannot be judged; ``what`` says what was not checked and why."""
        assert reason in UNJUDGED_REASONS, reason
        self.metrics.unjudged.labels(endpoint, reason, self.action).inc()
        if self.action == "deny":
            message = f"numapin: {what}; denied because the webhook runs with --unjudged=deny"
            log.warning("%s", message)
            return Verdict.deny(message, code=403, reason="Forbidden")
        message = f"numapin: {what}; allowed unchecked (--unjudged=allow)"
        log.warning("%s", message)
        return Verdict.allow(message)
