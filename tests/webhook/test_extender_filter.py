"""/filter: numapin as kube-scheduler's extender filter, over the webhook's real HTTPS server. Each node is judged as
a binding to it is judged (its NodeResourceTopology, the same simulation); the answer is the scheduler's
ExtenderFilterResult (Go's field names). A table of pods and nodes, then bad input."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from tests.webhook.helpers import Client, container, make_pod
from tests.webhook.nrt_fixtures import machine, nrt, write_docs
from webhook.admission.extender_filter import ExtenderFilter
from webhook.admission.unjudged import UnjudgedRule
from webhook.app import WebhookApp

BIG = machine(2, 14)  # 2 NUMA nodes x 28 CPUs


@pytest.fixture
async def nodes(server: WebhookApp, nrt_dir: Path) -> WebhookApp:
    write_docs(nrt_dir / "empty.yaml", [nrt("empty", BIG, reserved="0,28")])
    # NUMA 0: 10 free, NUMA 1: 12 free
    write_docs(nrt_dir / "busy.yaml", [nrt("busy", BIG, reserved="0,28", busy="1-8,29-36,14-21,42-49")])
    for s in server.sources:
        await s.sync()
    return server


def _args(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """As kube-scheduler sends it with nodeCacheCapable: true (Go's field names, Nodes null)."""
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


NAMES = ["empty", "busy", "bare"]  # bare: a node without a NodeResourceTopology


# (pod's CPUs, nodes kept, nodes whose topology manager would reject it)
FITS = [
    ("12", ["empty", "busy", "bare"], []),       # NUMA 1 of busy has 12 free
    ("14", ["empty", "bare"], ["busy"]),         # fits no NUMA node of busy: single-numa-node rejects it
    ("500m", ["empty", "busy", "bare"], []),     # a shared-pool pod: no node judged
]


async def test_the_filter_passes_the_nodes_that_can_hold_the_pod(nodes: WebhookApp, client: Client,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    for cpus, passed, rejected in FITS:  # one server for the table (each costs its start and stop)
        caplog.clear()
        pod = make_pod("db", [container("db", cpus)])
        with caplog.at_level(logging.INFO, logger="numapin"):
            status, body = await client.post("/filter", _args(pod, NAMES))
        assert status == 200, (cpus, body)
        assert body["NodeNames"] == passed and body["FailedNodes"] == {} and body["Error"] == "", (cpus, body)
        assert sorted(body["FailedAndUnresolvableNodes"]) == rejected, (cpus, body)
        for name in rejected:
            why = body["FailedAndUnresolvableNodes"][name]
            assert why.startswith(f"numapin: node {name} would reject pod default/db (TopologyAffinityError"), why
            assert "single-numa-node" in why and "node-0=10, node-1=12" in why, why
        # the node without topology was passed, and the log says so (as a binding to it is allowed with a warning)
        assert (cpus != "500m") == any("not checked on 1 node(s) (bare): no NodeResourceTopology" in r.getMessage()
                                       for r in caplog.records), (cpus, caplog.text)
    assert nodes.metrics.count("filter", "passed") == 2 and nodes.metrics.count("filter", "filtered") == 1


async def test_with_unjudged_deny_a_node_without_topology_is_failed_not_unresolvable(nodes: WebhookApp) -> None:
    deny = ExtenderFilter(nodes.binding_validator, UnjudgedRule("deny", nodes.metrics))  # as --unjudged deny makes it
    result = await deny.filter(_args(make_pod("db", [container("db", "2")]), NAMES))
    assert result.passed == ("empty", "busy") and result.unresolvable == {} and list(result.failed) == ["bare"]
    assert "--unjudged=deny" in result.failed["bare"], result
    assert nodes.metrics.registry.get_sample_value(
        "numapin_webhook_unjudged_total", {"endpoint": "filter", "reason": "node_unknown", "action": "deny"}) == 1


BAD = [
    ([], "body must be a JSON object"),
    ({"NodeNames": ["empty"]}, "Pod must be an object"),
    ({"Pod": {"metadata": {}}, "NodeNames": ["empty"]}, "Pod must have metadata and spec"),
    ({"Pod": make_pod("p", [container("c", "1")]), "Nodes": {"items": []}}, "configure numapin's extender with "
                                                                             "nodeCacheCapable: true"),
    ({"Pod": make_pod("p", [container("c", "1")]), "NodeNames": "empty"}, "NodeNames must be a list"),
    ({"Pod": make_pod("p", [container("c", "1")]), "NodeNames": ["empty", 3]}, "NodeNames must be a list"),
]


async def test_bad_input_is_answered_400_and_logged(nodes: WebhookApp, client: Client,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    for body, says in BAD:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="numapin"):
            status, text = await client.post("/filter", body)
        assert status == 400 and isinstance(text, str), (body, text)
        assert "not an ExtenderArgs request: " in text and says in text, text
        assert any(r.getMessage().startswith("filter: answered 400: not an ExtenderArgs request: ")
                   for r in caplog.records), caplog.text
    status, text = await client.post("/filter", None, raw=b'{"Pod": ')  # not JSON
    assert status == 400, text
    assert nodes.metrics.count("filter", "bad_request") == len(BAD) + 1


async def test_field_names_are_read_in_any_case(nodes: WebhookApp, client: Client) -> None:
    status, body = await client.post("/filter", {"pod": make_pod("db", [container("db", "14")]),
                                                 "nodenames": ["busy", "empty", "busy"]})
    assert status == 200 and body["NodeNames"] == ["empty"] and list(body["FailedAndUnresolvableNodes"]) == ["busy"]
