"""Where ``numapin status --cluster`` reads the cluster: the NodeResourceTopology objects and the Node names from
the API server (kubeconfig, or the pod's in-cluster credentials), with numapin's ``kubeapi`` client."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from allocator.nrt import NRT_GROUP, NRT_PLURAL, NRT_VERSION
from kubeapi.client import api_client

__all__ = ["ClusterListing", "ClusterSourceError", "list_cluster", "pick_kubeconfig"]


class ClusterSourceError(RuntimeError):
    """The API server could not be asked (no credentials, unreachable, the CRD missing, access denied)."""


@dataclass(frozen=True)
class ClusterListing:
    nrts: tuple[Mapping[str, Any], ...]
    node_names: tuple[str, ...] | None  # None: Nodes could not be listed (``note`` says why)
    note: str = ""


def pick_kubeconfig(flag: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """``--kubeconfig``, else the first file of ``$KUBECONFIG`` that exists, else None (in-cluster)."""
    if flag:
        if not Path(flag).is_file():
            raise ClusterSourceError(f"--kubeconfig {flag}: no such file")
        return flag
    listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    for p in listed:
        if Path(p).is_file():
            return p
    if listed:
        raise ClusterSourceError(f"$KUBECONFIG={env['KUBECONFIG']}: no such file")
    if not env.get("KUBERNETES_SERVICE_HOST"):
        raise ClusterSourceError("no kubeconfig: pass --kubeconfig FILE or set $KUBECONFIG (or run in a pod, with "
                                 "its service account)")
    return None


def _api_error(e: Any, what: str) -> ClusterSourceError:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", "") or ""
    if status == 404:
        return ClusterSourceError(f"{what}: the API server does not serve {NRT_PLURAL}.{NRT_GROUP}/{NRT_VERSION} "
                                  "(install the CRD: manifests/webhook/crd-noderesourcetopology.yaml)")
    if status in (401, 403):
        return ClusterSourceError(f"{what}: {status} {reason} (the kubeconfig's user may not list "
                                  f"{NRT_PLURAL}.{NRT_GROUP})")
    return ClusterSourceError(f"{what}: {status} {reason}".strip())


async def list_cluster(kubeconfig: str | None, *, timeout: float = 30.0) -> ClusterListing:
    import aiohttp
    import yaml
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.rest import ApiException
    from kubernetes_asyncio.config import ConfigException

    try:
        api = await api_client(kubeconfig)
    except (ConfigException, OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError) as e:
        source = f"kubeconfig {kubeconfig}" if kubeconfig else "in-cluster credentials"
        raise ClusterSourceError(f"cannot use {source}: {e}") from None
    async with api:
        server = api.configuration.host
        try:
            listing = await client.CustomObjectsApi(api).list_cluster_custom_object(
                NRT_GROUP, NRT_VERSION, NRT_PLURAL, _request_timeout=timeout)
        except ApiException as e:
            raise _api_error(e, f"listing {NRT_PLURAL} on {server}") from None
        except (OSError, TimeoutError, aiohttp.ClientError) as e:
            raise ClusterSourceError(f"cannot reach the API server {server}: {e}") from None
        items = listing.get("items") if isinstance(listing, Mapping) else None
        nrts = tuple(i for i in items if isinstance(i, Mapping)) if isinstance(items, list) else ()
        try:
            nodes = await client.CoreV1Api(api).list_node(_request_timeout=timeout)
        except ApiException as e:
            return ClusterListing(nrts, None, f"Nodes not listed ({e.status} {e.reason}): nodes without a "
                                              "NodeResourceTopology are not shown")
        except (OSError, TimeoutError, aiohttp.ClientError) as e:
            return ClusterListing(nrts, None, f"Nodes not listed ({e}): nodes without a NodeResourceTopology are "
                                              "not shown")
        return ClusterListing(nrts, tuple(n.metadata.name for n in nodes.items))
