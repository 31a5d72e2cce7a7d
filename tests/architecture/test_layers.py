"""The arrows between numapin's packages point down (docs/architecture.md): ``numapin`` → ``criproxy``/``webhook``
→ ``kubeapi`` (the Kubernetes API client and watches) and ``allocator`` (→ ``protos`` for the CRI messages), the lab
(``numapin_lab``) above them all. No product imports another product: the proxy and the webhook share only the
packages below them. Lazy imports count (the graph of test_import_cycles); the lab's own rule is in
test_lab_apart."""

from __future__ import annotations

from tests.architecture.test_import_cycles import import_graph

PACKAGES = ("allocator", "kubeapi", "criproxy", "webhook", "nriplugin", "numapin", "numapin_lab", "protos")
PRODUCTS = ("criproxy", "webhook", "nriplugin")
# package -> the other packages its modules may import
MAY_IMPORT = {
    "protos": set(),
    "allocator": set(),
    "kubeapi": set(),
    "criproxy": {"allocator", "protos", "kubeapi"},
    "webhook": {"allocator", "kubeapi"},
    # the NRI door's transport and session: NRI's and ttrpc's messages only, no decisions
    "nriplugin": {"protos"},
    "numapin": {"allocator", "kubeapi", "criproxy", "webhook", "nriplugin", "protos", "numapin_lab"},
    "numapin_lab": {"allocator", "kubeapi", "criproxy", "webhook", "nriplugin", "numapin", "protos"},
}
# the subpackages of each product, by concern (docs/architecture.md): a module outside them is wiring (app, cli,
# config, package docs)
SUBPACKAGES = {
    "criproxy": {"relay", "decisions", "node", "serve"},
    "webhook": {"https", "admission", "cluster"},
}
WIRING = {"__init__", "app", "cli", "config"}


def _arrows() -> set[tuple[str, str]]:
    graph = import_graph(PACKAGES)
    return {(mod, dep) for mod, deps in graph.items() for dep in deps if mod.split(".")[0] != dep.split(".")[0]}


def test_arrows_point_down() -> None:
    wrong = sorted((m, d) for m, d in _arrows() if d.split(".")[0] not in MAY_IMPORT[m.split(".")[0]])
    assert wrong == [], f"imports against the layers: {wrong}"


def test_no_product_imports_another_product() -> None:
    across = sorted((m, d) for m, d in _arrows() if m.split(".")[0] in PRODUCTS and d.split(".")[0] in PRODUCTS)
    assert across == [], f"products import each other: {across}"


def test_every_product_module_lives_in_a_package_of_its_concern() -> None:
    graph = import_graph(PACKAGES)
    loose = sorted(m for m in graph if m.split(".")[0] in SUBPACKAGES and len(m.split(".")) == 2
                   and m.split(".")[1] not in WIRING | SUBPACKAGES[m.split(".")[0]])
    assert loose == [], f"modules outside the packages by concern (docs/architecture.md): {loose}"
