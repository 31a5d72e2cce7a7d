"""A kubeconfig file for one user of the lab's API server (kubectl and numapin's ``kubeapi`` client read it)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml

from webhook.https.certs import KeyPair

__all__ = ["write_kubeconfig"]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def write_kubeconfig(path: Path, *, server: str, ca_pem: bytes, user: str, credentials: KeyPair) -> Path:
    """Write a kubeconfig (mode 0600) whose current context is ``user`` on ``server``; returns ``path``."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "numapin-lab", "cluster": {"server": server,
                                                         "certificate-authority-data": _b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": _b64(credentials.cert_pem),
                                          "client-key-data": _b64(credentials.key_pem)}}],
        "contexts": [{"name": "numapin-lab", "context": {"cluster": "numapin-lab", "user": user}}],
        "current-context": "numapin-lab",
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path
