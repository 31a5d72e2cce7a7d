"""The guest node's proxy as a warm ``numapin criproxy`` (numapin_lab.warm_start): started, it imports the
proxy's modules; ``launch(args)`` gives it the command line. A ManagedProcess from then on (``wait_for``,
``stop``, ``tail``): the same process, signals, logs and state as a cold start."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path

from numapin_lab.demo.stack import ManagedProcess
from numapin_lab.warm_start import PROXY_MODULES, discard, launch, spawn_warm

__all__ = ["NRI_MODULES", "WarmProxy"]

NRI_MODULES = ("numapin.cli", "nriplugin.cli", "nriplugin.app")  # what ``numapin nri`` imports before serving


class WarmProxy(ManagedProcess):
    """``WarmProxy(log).start()`` (imports, waits), ``launch(args)`` (``numapin ARGS``); ``stop()``
    before ``launch`` discards it."""

    def __init__(self, log: Path, modules: Sequence[str] = PROXY_MODULES) -> None:
        super().__init__(f"numapin {'nri' if modules != PROXY_MODULES else 'criproxy'}", [], log)
        self.modules = tuple(modules)
        self.launched = False

    def start(self) -> None:
        self.proc = spawn_warm(self.log, modules=self.modules, new_session=True)

    def launch(self, args: Sequence[str]) -> None:
        """``numapin ARGS`` (``criproxy ...``) in the waiting process. OSError if it is no longer there."""
        if self.proc is None or self.launched:
            raise OSError("the warm proxy was not started or was launched already")
        self.args = list(args)
        self.launched = True
        launch(self.proc, self.args)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.proc is not None and not self.launched:
            discard(self.proc)
            self.proc = None
            return None
        return super().stop(sig, timeout)
