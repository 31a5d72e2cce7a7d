"""The Kubernetes API client numapin's parts use: from a kubeconfig file, or from the pod's in-cluster credentials."""

from __future__ import annotations

from typing import Any

__all__ = ["api_client"]


async def api_client(kubeconfig: str | None) -> Any:
    """A kubernetes-asyncio ApiClient from a kubeconfig file, or from the pod's in-cluster credentials."""
    from kubernetes_asyncio import client, config

    if kubeconfig:
        return await config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()
