"""Which containers of a pod are init containers, learned from the order kubelet creates them on CRI.

kubelet's CPU manager lets app containers reuse the CPUs of the pod's *init* containers, and only theirs: it
reads the roles from the pod spec. Without the webhook's intent annotation the proxy sees only CRI, which
names no role on older kubelets (newer ones annotate each container with ``io.kubernetes.container.type``,
``init`` or ``container``; ``init`` covers restartable sidecars too). What kubelet does fixes the roles:

- regular init containers run one at a time, each to a successful exit, before the next container is
  created; sidecars (restartable init containers) and app containers keep running;
- so when a container name is created for the first time, every earlier container whose role is still open
  is decided from its state at that moment: **exited with code 0** (and not annotated ``container``) → an
  init container, whose CPUs may pass to later containers; **running or created** → a sidecar if kubelet
  annotated it ``init``, else an app container; **exited with another code** → an app (or sidecar) that
  crashed (a failed init container is retried before kubelet moves on);
- a decided role never changes, except that a name decided ``init`` which is created again *after* a later
  name was first created cannot be an init container (kubelet never re-runs an init container once it moved
  on, in the same sandbox): it was an app container that had exited 0 before its sibling's first create;
- a role still open counts as ``app``: its CPUs are never reused (a crashed container is re-created with
  attempt+1 and gets its own CPUs back).

The same rules replay from the runtime's record (creation and exit times, exit codes) after a restart of the
proxy (:func:`replay`), so init-container reuse keeps working then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["KIND_ANNOTATION", "Instance", "PodRoles", "Role", "replay"]

Role = Literal["init", "sidecar", "app"]
KIND_ANNOTATION = "io.kubernetes.container.type"  # kubelet's container annotation: init | container | ephemeral


@dataclass(frozen=True)
class Instance:
    """One container instance of the pod as the runtime shows it (times in ns since the epoch; 0 = unknown)."""

    name: str
    attempt: int
    created_at: int
    exited: bool
    exit_code: int | None = None  # None: not known (not exited, or not asked)
    finished_at: int = 0
    kind: str | None = None  # kubelet's io.kubernetes.container.type, when it sent one


def _decide(kind: str | None, exited: bool, exit_code: int | None) -> Role:
    if exited and exit_code == 0 and kind != "container":
        return "init"
    return "sidecar" if kind == "init" else "app"


@dataclass
class PodRoles:
    """The roles learned for one pod (one sandbox's life), and the order names were first created."""

    decided: dict[str, Role] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def role(self, name: str) -> Role:
        return self.decided.get(name, "app")

    def is_init(self, name: str) -> bool:
        return self.decided.get(name) == "init"

    def judges_others(self, name: str) -> bool:
        """Creating ``name`` decides earlier containers' roles (their states are needed): a first creation
        while some role is still open."""
        return name not in self.order and any(n not in self.decided for n in self.order)

    def on_create(self, name: str, kind: str | None, others: Mapping[str, Instance]) -> bool:
        """Record that kubelet asks to create ``name`` (annotated ``kind``) while the pod's other containers
        are ``others`` (the latest instance of each name). Returns True when ``name`` was taken for an init
        container and turns out to be an app container being re-created (its CPUs may have been passed on)."""
        if name in self.order:
            later = self.order[self.order.index(name) + 1:]
            if self.decided.get(name) == "init" and later:
                self.decided[name] = "sidecar" if kind == "init" else "app"
                return True
            return False
        for other in self.order:
            if other in self.decided:
                continue
            inst = others.get(other)
            if inst is None:
                continue  # never created successfully: nothing of it to judge
            self.decided[other] = _decide(inst.kind, inst.exited, inst.exit_code)
        self.order.append(name)
        if kind == "container":
            self.decided[name] = "app"
        return False


def replay(instances: Iterable[Instance]) -> PodRoles:
    """The roles :class:`PodRoles` would have learned, rebuilt from the runtime's record of a pod's containers
    (what a restarted proxy finds): first creations in time order, each earlier container judged by the state
    of its instance at that moment (an instance counts as exited then if it finished before, with its code)."""
    by_name: dict[str, list[Instance]] = {}
    for i in sorted(instances, key=lambda i: (i.created_at, i.attempt)):
        by_name.setdefault(i.name, []).append(i)
    firsts = sorted(by_name, key=lambda n: by_name[n][0].created_at)
    roles = PodRoles()
    for name in firsts:
        t = by_name[name][0].created_at
        state: dict[str, Instance] = {}
        for other in roles.order:
            before = [i for i in by_name[other] if i.created_at <= t]
            if not before:
                continue
            last = before[-1]
            done = last.exited and 0 < last.finished_at <= t
            state[other] = Instance(other, last.attempt, last.created_at, done, last.exit_code if done else None,
                                    last.finished_at, last.kind)
        roles.on_create(name, by_name[name][-1].kind, state)
    # a name taken for an init container with an instance created after a later first creation: an app
    for name in list(roles.order):
        if roles.decided.get(name) != "init":
            continue
        later = roles.order[roles.order.index(name) + 1:]
        if later and any(i.created_at > by_name[n][0].created_at for i in by_name[name] for n in later):
            roles.decided[name] = "sidecar" if by_name[name][-1].kind == "init" else "app"
    return roles
