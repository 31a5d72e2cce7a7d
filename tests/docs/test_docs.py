"""The operator's guide (docs/) is exercised: every ``numapin`` command in its ``sh`` blocks is parsed by numapin's
own command line, every repository file it names exists (manifests parse as YAML), ``sh test`` blocks run for real
in a scratch directory, and the error messages, metrics and annotations it lists are the ones the code has."""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from allocator.intent import INTENT_ANNOTATION
from allocator.pod import BYPASS_ANNOTATION, CPU_MANAGER_ANNOTATION
from numapin.cli import SUBCOMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SOURCES = ("allocator", "kubeapi", "nodeagent", "criproxy", "nriplugin", "webhook", "numapin", "numapin_lab")


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    info: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def blocks() -> list[Block]:
    out: list[Block] = []
    for md in sorted(DOCS.glob("*.md")):
        lines = md.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = re.match(r"^(\s*)```(\S*)\s*(.*)$", lines[i])
            if m and m.group(2):
                indent, start, body = len(m.group(1)), i + 1, []
                i += 1
                while i < len(lines) and not lines[i].strip().startswith("```"):
                    body.append(lines[i][indent:])
                    i += 1
                out.append(Block(md.name, start, (m.group(2) + " " + m.group(3)).strip(), "\n".join(body)))
            i += 1
    return out


def commands(block: Block) -> list[str]:
    """Shell command lines of a block, continuation lines joined, comments dropped."""
    out: list[str] = []
    for raw in block.text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


SH = [b for b in blocks() if b.info.split()[0] == "sh"]
SH_TEST = [b for b in SH if b.info.split()[1:] == ["test"]]
ALL_COMMANDS = [(b, c) for b in SH for c in commands(b)]


def test_the_guide_has_commands() -> None:
    assert len(SH) >= 10 and SH_TEST and len(ALL_COMMANDS) >= 30
    used = {shlex.split(c, comments=True)[1] for _, c in ALL_COMMANDS if c.startswith("numapin ")}
    assert used >= {name for name, _ in SUBCOMMANDS}, "every numapin subcommand appears in the guide"


@pytest.mark.parametrize(("block", "command"), [(b, c) for b, c in ALL_COMMANDS if c.startswith("numapin ")],
                         ids=lambda x: x.id if isinstance(x, Block) else "")
def test_numapin_commands_parse(block: Block, command: str) -> None:
    argv = shlex.split(command, comments=True)[1:]
    parser = build_parser()
    if "--help" in argv:
        with pytest.raises(SystemExit) as e:
            parser.parse_args(argv)
        assert e.value.code == 0
        return
    try:
        parser.parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{block.id}: `{command}` is not a valid numapin command (exit {e.code})")


_REPO_PATH = re.compile(r"(?<![\w/.])((?:manifests|examples|docs|scripts)/[\w./-]+)")


@pytest.mark.parametrize(("block", "command"), ALL_COMMANDS, ids=lambda x: x.id if isinstance(x, Block) else "")
def test_repository_files_named_exist(block: Block, command: str) -> None:
    for path in _REPO_PATH.findall(command):
        assert (ROOT / path).exists(), f"{block.id}: {path} does not exist"
        if path.startswith("manifests/") and path.endswith(".rules.yaml"):  # a Prometheus rules file
            assert yaml.safe_load((ROOT / path).read_text())["groups"], path
        elif path.startswith("manifests/") and path.endswith((".yaml", ".yml")):
            docs = [d for d in yaml.safe_load_all((ROOT / path).read_text()) if d is not None]
            assert docs and all(isinstance(d, dict) and d.get("kind") for d in docs), path
    words = shlex.split(command, comments=True)
    # annotate: changing a running pod's mode; label: a node opting in to the installer; deleting numapin's
    # NodeResourceTopology objects at uninstall
    named = words[0] == "kubectl" and (words[1] in ("annotate", "label") or words[1:] == [
        "delete", "noderesourcetopologies.topology.node.k8s.io", "--all"])
    if words[0] == "kubectl" and not named:
        targets = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-f", "-k")]
        if words[1] == "kustomize":
            targets = words[2:]
        assert targets, f"{block.id}: kubectl without -f, -k or a kustomization"
        for t in targets:
            assert t.startswith(("manifests/", "./numapin-certs/")), f"{block.id}: unexpected kubectl target {t}"
            if t.startswith("./numapin-certs/"):  # written by the `numapin certs` block (run below)
                assert Path(t).name in ("secret.yaml", "webhook-configurations.yaml")
    if words[0] == "systemctl" and words[1] != "daemon-reload":
        unit = words[-1]
        assert unit in ("kubelet", "containerd") or any((ROOT / "manifests" / door / unit).exists()
                                                       for door in ("criproxy", "nri")), f"{block.id}: {unit}"


@pytest.mark.parametrize("block", SH_TEST, ids=lambda b: b.id)
def test_sh_test_blocks_run(block: Block, tmp_path: Path) -> None:
    """Run the block with bash in a scratch directory holding the repository's manifests and examples, ``numapin``
    on PATH (this Python, this source tree)."""
    for d in ("manifests", "examples"):
        (tmp_path / d).symlink_to(ROOT / d)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "numapin"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m numapin "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, f"{block.id}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    if "numapin certs" in block.text:
        assert (tmp_path / "numapin-certs/secret.yaml").exists()
        assert "caBundle" in (tmp_path / "numapin-certs/webhook-configurations.yaml").read_text()


def test_yaml_blocks_parse() -> None:
    ys = [b for b in blocks() if b.info.split()[0] == "yaml"]
    assert ys
    for b in ys:
        assert isinstance(yaml.safe_load(b.text), dict), b.id
    kubelet = next(yaml.safe_load(b.text) for b in ys if "containerRuntimeEndpoint" in b.text)
    shipped = yaml.safe_load((ROOT / "manifests/criproxy/kubelet-config.yaml").read_text())
    assert kubelet.items() <= shipped.items(), "the kubelet change in node.md is the shipped one"


def _source_text() -> str:
    return "\n".join(p.read_text() for d in SOURCES for p in sorted((ROOT / d).rglob("*.py")))


def _table_fragments(md: str) -> list[str]:
    """The backticked fragment in the first column of every table row."""
    out = []
    for line in (DOCS / md).read_text().splitlines():
        m = re.match(r"^\| `([^`]+)` \|", line)
        if m:
            out.append(m.group(1))
    return out


def test_documented_error_messages_are_what_numapin_says() -> None:
    fragments = _table_fragments("errors.md")
    assert len(fragments) >= 30
    source = _source_text()
    missing = [f for f in fragments if f not in source]
    assert missing == [], f"errors.md quotes messages numapin does not say: {missing}"


def test_documented_metrics_are_the_metrics() -> None:
    from nodeagent.serve.metrics import ProxyMetrics
    from webhook.https.metrics import WebhookMetrics

    documented = set(_table_fragments("metrics.md"))
    real = {m.name for reg in (ProxyMetrics().registry, WebhookMetrics().registry) for m in reg.collect()}
    assert documented == real


def test_every_annotation_is_documented() -> None:
    documented = set(_table_fragments("annotations.md"))
    assert documented == {CPU_MANAGER_ANNOTATION, INTENT_ANNOTATION, BYPASS_ANNOTATION}


def test_links_between_guides_resolve() -> None:
    for md in DOCS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", md.read_text()):
            assert (DOCS / target).exists(), f"{md.name} links to missing {target}"
