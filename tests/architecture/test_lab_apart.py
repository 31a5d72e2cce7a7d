"""The product packages hold product code: no module of allocator/, criproxy/, webhook/ or numapin/ imports the lab
(``numapin_lab``: the demo's and the tests' stack) at import time. ``numapin demo`` imports it inside its ``run``,
so the proxy, the webhook and every other command load without it (the container image ships without it)."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from tests.architecture.test_import_cycles import REPO, module_name

PRODUCT = ("allocator", "kubeapi", "criproxy", "webhook", "nriplugin", "numapin", "protos")
LAB = "numapin_lab"
# the one module allowed to import the lab, and only inside a function: the demo command
LAZY_USERS = {"numapin.cmd_demo"}


def _imports(tree: ast.AST, *, module_level_only: bool) -> list[tuple[int, str]]:
    """(line, imported module) of every import; with ``module_level_only`` those that run when the module is
    imported (module body, class bodies, ``if``/``try`` at that level), not those inside a function."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Import):
                found.extend((child.lineno, a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.extend([(child.lineno, child.module)] + [(child.lineno, f"{child.module}.{a.name}")
                                                             for a in child.names])
            visit(child)

    visit(tree)
    return found


def lab_imports(packages: tuple[str, ...], *, module_level_only: bool) -> dict[str, list[int]]:
    """product module -> lines importing the lab (relative imports cannot reach it: it is another package)."""
    out: dict[str, list[int]] = {}
    for pkg in packages:
        for path in sorted((REPO / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            lines = sorted({line for line, name in _imports(tree, module_level_only=module_level_only)
                            if name == LAB or name.startswith(LAB + ".")})
            if lines:
                out[module_name(path)] = lines
    return out


def test_the_checker_sees_a_module_level_import_and_skips_a_lazy_one() -> None:
    tree = ast.parse("import numapin_lab.cri\nif True:\n    from numapin_lab import demo\n"
                     "def f():\n    from numapin_lab.demo import play\n")
    eager = [name for _, name in _imports(tree, module_level_only=True)]
    every = [name for _, name in _imports(tree, module_level_only=False)]
    assert eager == ["numapin_lab.cri", "numapin_lab", "numapin_lab.demo"]
    assert "numapin_lab.demo.play" in every


def test_no_product_module_imports_the_lab_at_import_time() -> None:
    assert lab_imports(PRODUCT, module_level_only=True) == {}


def test_only_the_demo_command_imports_the_lab_at_all() -> None:
    assert set(lab_imports(PRODUCT, module_level_only=False)) <= LAZY_USERS


@pytest.mark.parametrize("module", ["criproxy.app", "webhook.app", "numapin.cli", "numapin.cmd_demo",
                                    "numapin.cmd_status", "numapin.cmd_plan"])
def test_product_entry_points_load_without_the_lab(module: str) -> None:
    """Imported in a fresh interpreter, the product's entry points leave the lab unloaded."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == {LAB!r}))"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_every_command_parser_loads_without_the_lab() -> None:
    """``numapin --help`` builds every subcommand's parser: none of them pulls the lab in."""
    code = ("import sys; from numapin.cli import build_parser; build_parser(); "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] == {LAB!r}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


@pytest.mark.parametrize(("missing", "argv"), [("numapin_lab", ["demo"]), ("jsonpatch", ["demo"]),
                                               ("numapin_lab", ["demo", "--topology", "2s4n"])])
def test_demo_without_the_lab_says_so(missing: str, argv: list[str]) -> None:
    """An installation without the lab or the ``demo`` extra (the container image) answers ``numapin demo`` with
    what to install, exit status 2, no traceback."""
    code = (f"import sys; sys.modules[{missing!r}] = None; from numapin.cli import main; "
            f"sys.exit(main({argv!r}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert f"this installation has no demo (module {missing} is missing): pip install 'numapin[demo]'" in r.stderr
