"""Kubernetes' own binaries for the tests (crictl, critest; kubelet and the control plane), found as numapin finds
numa-vm.sh: the environment variable ``unpack.sh`` prints (``CRITEST_BIN``, ``CRICTL_BIN``, ``KUBELET_BIN``, ...),
else unpacked once from ``k8s-bin`` (``../shared/k8s-bin`` next to the source tree, else ``/work/shared/k8s-bin``)
into ``$NUMAPIN_K8S_BIN_CACHE`` (default ``/var/cache/numapin-k8s-bin``) by its ``unpack.sh``. A CI would download
the official release binaries instead; that directory stands in for the download. What cannot be had raises
``K8sBinError`` naming where it looked: the tests fail loudly, never skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CACHE_ENV", "K8sBinError", "find_binary"]

CACHE_ENV = "NUMAPIN_K8S_BIN_CACHE"
_SRC_ROOT = Path(__file__).resolve().parents[1]
_CANDIDATES = (_SRC_ROOT.parent / "shared/k8s-bin", Path("/work/shared/k8s-bin"))
_ENV = {"critest": "CRITEST_BIN", "crictl": "CRICTL_BIN", "kubelet": "KUBELET_BIN",
        "kube-apiserver": "KUBE_APISERVER_BIN", "kube-scheduler": "KUBE_SCHEDULER_BIN", "kubectl": "KUBECTL_BIN"}


class K8sBinError(RuntimeError):
    """A Kubernetes binary could not be found or unpacked."""


def _exports(line: str) -> dict[str, str]:
    """``export A=x B=y`` (unpack.sh's last line) as a dict."""
    words = line.split()
    if not words or words[0] != "export":
        raise K8sBinError(f"unexpected unpack.sh output: {line!r}")
    return dict(w.split("=", 1) for w in words[1:] if "=" in w)


def find_binary(name: str, env: Mapping[str, str] = os.environ) -> Path:
    """The path of ``name`` (``critest``, ``crictl``, ``kubelet``, ...), looked up in ``env`` first."""
    var = _ENV.get(name)
    if var is None:
        raise K8sBinError(f"unknown binary {name!r} (known: {', '.join(_ENV)})")
    given = env.get(var)
    if given:
        path = Path(given)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise K8sBinError(f"${var} is {given}, which is not an executable file")
        return path
    unpack = next((c / "unpack.sh" for c in _CANDIDATES if (c / "unpack.sh").is_file()), None)
    if unpack is None:
        raise K8sBinError(f"{name} not found: set ${var} to its path, or provide k8s-bin/unpack.sh (looked in "
                          f"{', '.join(map(str, _CANDIDATES))})")
    cache = env.get(CACHE_ENV, "/var/cache/numapin-k8s-bin")
    r = subprocess.run(["bash", str(unpack), cache], capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise K8sBinError(f"{unpack} {cache} failed ({r.returncode}): {r.stderr.strip()[-800:]}")
    found = _exports(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "").get(var)
    if not found or not os.access(found, os.X_OK):
        raise K8sBinError(f"{unpack} did not give {var} (output: {r.stdout.strip()[-400:]!r})")
    return Path(found)
