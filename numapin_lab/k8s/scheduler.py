"""kube-scheduler v1.36.2 for the lab's control plane: one replica (no leader election), authenticated as
``system:kube-scheduler`` (the API server's bootstrap RBAC gives that user what the scheduler needs), no serving
port. ``Scheduler(cp, directory).start()`` … ``stop()``; killed when the thread that started it dies.

A pod whose binding fails (an admission webhook denied it) goes back to the scheduler's queue with a back-off of
``podInitialBackoffSeconds`` doubled per consecutive failure up to ``podMaxBackoffSeconds`` (1 s and 10 s by
default); the lab sets both to ``backoff_seconds`` (1 s) so that a denied binding is tried again about a second
later, every time (the scheduler aligns back-offs to a 1 s window).

A second scheduler beside the default one: ``scheduler_name`` (its one profile's ``schedulerName``: it schedules only
the pods naming it, the default scheduler only the others) and ``extenders`` (KubeSchedulerConfiguration
``extenders`` entries, e.g. numapin's filter: ``manifests.scheduler_extender_by_url``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from numapin_lab.k8s.control_plane import ControlPlane
from numapin_lab.k8s.process import Daemon

__all__ = ["SCHEDULER_USER", "Scheduler", "SchedulerError"]

SCHEDULER_USER = "system:kube-scheduler"


class SchedulerError(RuntimeError):
    """kube-scheduler exited at start (the message quotes its log)."""


class Scheduler:
    def __init__(self, control_plane: ControlPlane, directory: Path, *, backoff_seconds: int = 1,
                 scheduler_name: str | None = None, extenders: Sequence[Mapping[str, Any]] = ()) -> None:
        self.cp = control_plane
        self.backoff_seconds = backoff_seconds
        self.scheduler_name = scheduler_name
        self.extenders = tuple(extenders)
        self.dir = directory
        self.log = directory / "kube-scheduler.log"
        self._daemon: Daemon | None = None

    def start(self, settle: float = 1.0) -> Scheduler:
        kubeconfig = self.cp.kubeconfig_for(SCHEDULER_USER)
        config = self.dir / "kube-scheduler.yaml"
        doc: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)}, "leaderElection": {"leaderElect": False},
            "podInitialBackoffSeconds": self.backoff_seconds, "podMaxBackoffSeconds": self.backoff_seconds}
        if self.scheduler_name is not None:
            doc["profiles"] = [{"schedulerName": self.scheduler_name}]
        if self.extenders:
            doc["extenders"] = [dict(e) for e in self.extenders]
        config.write_text(yaml.safe_dump(doc))
        self._daemon = Daemon("kube-scheduler", [
            str(self.cp.binaries.kube_scheduler), "--config", str(config), "--secure-port", "0", "--v", "2"],
            self.log)
        self._daemon.start()
        deadline = time.monotonic() + settle  # a bad flag or configuration ends it at once
        while time.monotonic() < deadline:
            if self._daemon.exit_code() is not None:
                raise SchedulerError(f"kube-scheduler exited ({self._daemon.exit_code()}):\n{self._daemon.tail()}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self._daemon is not None:
            self._daemon.stop()
            self._daemon = None
