"""``--record-events`` for both doors (the proxy and the NRI plugin share the node agent's flags and its wiring):
Events are recorded when the agent has API credentials unless told not to, and the agent of either door then has
its recorder; a config file's ``recordEvents`` that is not a boolean is refused naming the setting."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

import criproxy.cli
import criproxy.config
import nriplugin.cli
import nriplugin.config
from nodeagent.app import NodeAgent
from nodeagent.cli import agent_overrides
from nodeagent.config import ConfigError

DOORS = [(criproxy.cli, criproxy.config), (nriplugin.cli, nriplugin.config)]


@pytest.mark.parametrize(("cli", "config"), DOORS, ids=["criproxy", "nri"])
@pytest.mark.parametrize(("argv", "wanted"), [
    ([], False),
    (["--kubeconfig", "/k"], True),
    (["--kubeconfig", "/k", "--no-record-events"], False),
    (["--watch-pods"], True),  # in-cluster credentials
    (["--record-events"], True),
])
def test_events_are_recorded_with_credentials_unless_told_not_to(cli: Any, config: Any, argv: list[str],
                                                                  wanted: bool) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(argv)
    cfg = config.load_config(None, agent_overrides(args))
    assert cfg.events_wanted is wanted
    agent = NodeAgent(cfg, kubelet_endpoint="unix:///k.sock")
    assert (agent.events is not None) is wanted


def test_a_record_events_setting_that_is_not_a_boolean_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "c.yaml"
    file.write_text("recordEvents: sometimes\n")
    with pytest.raises(ConfigError, match="record-events: expected true or false"):
        criproxy.config.load_config(str(file), {})
