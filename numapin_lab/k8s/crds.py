"""numapin's CustomResourceDefinitions (manifests/) installed on a lab control plane, as an operator would."""

from __future__ import annotations

from pathlib import Path

from numapin_lab.k8s.control_plane import ControlPlane

__all__ = ["NRT_CRD", "install_nrt_crd"]

NRT_CRD = Path(__file__).resolve().parents[2] / "manifests/webhook/crd-noderesourcetopology.yaml"


def install_nrt_crd(cp: ControlPlane) -> None:
    """Apply the NodeResourceTopology CRD (idempotent) and wait until the API server serves it."""
    cp.kubectl("apply", "--validate=false", "-f", str(NRT_CRD))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s",
               "crd/noderesourcetopologies.topology.node.k8s.io")
