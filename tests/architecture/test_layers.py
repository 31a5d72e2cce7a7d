"""The arrows between numapin's packages point down (docs/architecture.md): ``numapin`` → ``criproxy``/``webhook``
→ ``allocator`` (→ ``protos`` for the CRI messages), the lab (``numapin_lab``) above them all. The one sideways
arrow: the proxy's pod watch uses the webhook's API client and list/watch loops (``webhook.sources``). Lazy imports
count (the graph of test_import_cycles); the lab's own rule is in test_lab_apart."""

from __future__ import annotations

from tests.architecture.test_import_cycles import import_graph

PACKAGES = ("allocator", "criproxy", "webhook", "numapin", "numapin_lab", "protos")
# package -> the other packages its modules may import
MAY_IMPORT = {
    "protos": set(),
    "allocator": set(),
    "criproxy": {"allocator", "protos", "webhook"},
    "webhook": {"allocator"},
    "numapin": {"allocator", "criproxy", "webhook", "protos", "numapin_lab"},
    "numapin_lab": {"allocator", "criproxy", "webhook", "numapin", "protos"},
}
# the sideways arrows, module by module: (importer, imported)
SIDEWAYS = {("criproxy.pod_watch", "webhook.sources")}


def _arrows() -> set[tuple[str, str]]:
    graph = import_graph(PACKAGES)
    return {(mod, dep) for mod, deps in graph.items() for dep in deps if mod.split(".")[0] != dep.split(".")[0]}


def test_arrows_point_down() -> None:
    wrong = sorted((m, d) for m, d in _arrows() if d.split(".")[0] not in MAY_IMPORT[m.split(".")[0]])
    assert wrong == [], f"imports against the layers: {wrong}"


def test_the_only_sideways_arrow_is_the_pod_watch_on_webhook_sources() -> None:
    sideways = {(m, d) for m, d in _arrows() if {m.split(".")[0], d.split(".")[0]} == {"criproxy", "webhook"}}
    assert sideways == SIDEWAYS
