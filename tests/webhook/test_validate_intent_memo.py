"""/validate's check of the intent annotation after a match remembered by identity (perf, issue 37): the pods of
one workload bring the same two containers tuples (memos of the pod model and of the intent), and the last pair
found equal is not compared again; any other pair still is, so a stale or forged intent is denied after a match."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

from allocator.intent import INTENT_ANNOTATION
from allocator.pod import CPU_MANAGER_ANNOTATION
from tests.webhook.helpers import cluster_webhook, container, make_pod, pod_request, review
from webhook.admission.mutate import mutate_pod
from webhook.admission.review import parse_review


def test_an_intent_is_checked_against_each_pod_after_a_remembered_match(tmp_path: Path) -> None:
    webhook = cluster_webhook(tmp_path)

    async def verdict(pod: dict) -> bool:
        return (await webhook.validate(parse_review(review(pod_request(copy.deepcopy(pod)))))).allowed

    async def run() -> None:
        for s in webhook.sources:
            await s.sync()
        pod = make_pod("web", [container("app", "2", "2Gi"), container("log", "1", "1Gi")],
                       annotations={CPU_MANAGER_ANNOTATION: "exclusive"})
        stamped, _ = mutate_pod(pod)
        assert await verdict(stamped) and await verdict(stamped)  # the second from the remembered match
        for change in (lambda p: p["spec"]["containers"][1]["resources"]["limits"].__setitem__("cpu", "2"),
                       lambda p: p["spec"]["containers"].pop(),
                       lambda p: p["spec"]["containers"][0].__setitem__("name", "other")):
            forged = copy.deepcopy(stamped)
            change(forged)  # the pod changed, its intent not
            assert not await verdict(forged)
            assert await verdict(stamped)
        other, _ = mutate_pod(make_pod("db", [container("db", "4", "4Gi")],
                                       annotations={CPU_MANAGER_ANNOTATION: "exclusive"}))
        swapped = copy.deepcopy(stamped)
        swapped["metadata"]["annotations"][INTENT_ANNOTATION] = other["metadata"]["annotations"][INTENT_ANNOTATION]
        assert await verdict(other) and not await verdict(swapped)

    asyncio.run(run())
