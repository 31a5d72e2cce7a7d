"""Who may bypass numapin: the operator's list of namespaces (and, for the webhook, service accounts) whose pods'
``numapin.io/bypass: "true"`` is honoured, and the namespaces whose bypassed pods may run on every CPU.

The annotation is the tenant's; the namespace is not (kubelet puts it in CRI's PodSandboxConfig, the API server in
the pod). So the privilege is the namespace's: a bypass annotation elsewhere is denied by the webhook and ignored by
the proxy (the pod is treated by its QoS class and mode). A honoured bypass still keeps the pod's containers on the
shared pool (they get no CPUs of their own, are never rejected, and are converged to the pool like any shared
container); only in a namespace of ``all_cpus_namespaces`` are they left wholly alone, exclusive CPUs included.
Shared by the proxy and the webhook, so both read the flags the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import ConfigError
from .pod import BYPASS_ANNOTATION, is_bypassed

__all__ = ["DEFAULT_BYPASS_NAMESPACE", "BypassPolicy", "parse_names", "parse_service_accounts"]

# the namespace of numapin's own manifests (manifests/webhook/namespace.yaml), where its webhook runs
DEFAULT_BYPASS_NAMESPACE = "numapin"


def parse_names(value: str | Iterable[str] | None, flag: str) -> frozenset[str]:
    """``"a,b"`` or a list -> ``{"a", "b"}``; a name that is not a Kubernetes namespace name is a ConfigError."""
    if value is None:
        return frozenset()
    items = value.split(",") if isinstance(value, str) else list(value)
    out: set[str] = set()
    for raw in items:
        if not isinstance(raw, str):
            raise ConfigError(f"{flag}: expected namespace names, got {raw!r}")
        name = raw.strip()
        if not name:
            continue
        if not _dns_label(name):
            raise ConfigError(f"{flag}: {name!r} is not a namespace name (lowercase letters, digits and '-', at most "
                              "63 characters)")
        out.add(name)
    return frozenset(out)


def parse_service_accounts(value: str | Iterable[str] | None, flag: str) -> frozenset[tuple[str, str]]:
    """``"ns:name,ns2:name2"`` -> ``{("ns", "name"), ...}``; ConfigError for anything else."""
    if value is None:
        return frozenset()
    items = value.split(",") if isinstance(value, str) else list(value)
    out: set[tuple[str, str]] = set()
    for raw in items:
        if not isinstance(raw, str):
            raise ConfigError(f"{flag}: expected NAMESPACE:SERVICEACCOUNT, got {raw!r}")
        text = raw.strip()
        if not text:
            continue
        ns, sep, name = text.partition(":")
        if not sep or not _dns_label(ns) or not name or len(name) > 253:
            raise ConfigError(f"{flag}: expected NAMESPACE:SERVICEACCOUNT, got {text!r}")
        out.add((ns, name))
    return frozenset(out)


def _dns_label(name: str) -> bool:
    return (0 < len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()
            and all(ch.isdigit() or ("a" <= ch <= "z") or ch == "-" for ch in name))


@dataclass(frozen=True)
class BypassPolicy:
    """``namespaces``: where ``numapin.io/bypass: "true"`` is honoured. ``service_accounts`` (webhook only: CRI does
    not carry a pod's service account): when not empty, a pod in one of ``namespaces`` must also run as one of these
    ``(namespace, name)`` service accounts. ``all_cpus_namespaces``: namespaces (among ``namespaces``) whose bypassed
    pods are left wholly alone and may run on every CPU, other pods' exclusive CPUs included."""

    namespaces: frozenset[str] = frozenset({DEFAULT_BYPASS_NAMESPACE})
    service_accounts: frozenset[tuple[str, str]] = frozenset()
    all_cpus_namespaces: frozenset[str] = frozenset()

    def asked(self, annotations: Mapping[str, str]) -> bool:
        """The pod asks to bypass numapin (the tenant's word, not yet a privilege)."""
        return is_bypassed(annotations)

    def allows(self, namespace: str, service_account: str | None = None) -> bool:
        """A pod of ``namespace`` (running as ``service_account``, when the caller knows it) may bypass numapin."""
        if namespace not in self.namespaces:
            return False
        if not self.service_accounts or service_account is None:
            return True
        return (namespace, service_account or "default") in self.service_accounts

    def all_cpus(self, namespace: str) -> bool:
        """A honoured bypass in ``namespace`` leaves the pod's containers on every CPU (the operator's opt-in)."""
        return namespace in self.all_cpus_namespaces and namespace in self.namespaces

    def denial(self, namespace: str, service_account: str | None, flag_prefix: str = "--") -> str:
        """Why a pod of ``namespace`` may not bypass numapin, naming the rule and the flag."""
        where = ", ".join(sorted(self.namespaces)) or "none"
        if namespace in self.namespaces and self.service_accounts:
            accounts = ", ".join(f"{n}:{a}" for n, a in sorted(self.service_accounts))
            return (f"{BYPASS_ANNOTATION}=true is a privilege: in namespace {namespace} only the service accounts "
                    f"listed by {flag_prefix}bypass-service-accounts ({accounts}) may set it, not "
                    f"{service_account or 'default'}; remove the annotation or ask the operator")
        return (f"{BYPASS_ANNOTATION}=true is a privilege: only pods in the namespaces listed by "
                f"{flag_prefix}bypass-namespaces ({where}) may set it, not namespace {namespace or '(none)'}; remove "
                "the annotation or ask the operator")
