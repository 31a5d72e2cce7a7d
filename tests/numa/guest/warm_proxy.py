"""The guest node's proxy as a warm ``numapin criproxy`` (numapin_lab.warm_start): started, it imports the
proxy's modules; ``launch(args)`` gives it the command line. A ManagedProcess from then on (``wait_for``,
``stop``, ``tail``): the same process, signals, logs and state as a cold start."""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path

from numapin_lab.demo.stack import ManagedProcess
from numapin_lab.warm_start import discard, launch, spawn_warm

__all__ = ["WarmProxy"]


class WarmProxy(ManagedProcess):
    """``WarmProxy(log).start()`` (imports, waits), ``launch(args)`` (``numapin ARGS``); ``stop()``
    before ``launch`` discards it."""

    def __init__(self, log: Path) -> None:
        super().__init__("numapin criproxy", [], log)
        self.launched = False

    def start(self) -> None:
        self.proc = spawn_warm(self.log, new_session=True)

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
