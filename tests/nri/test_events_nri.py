"""The second door records the same Events: ``numapin nri`` (a real process, containerd's NRI plugin) with the node
agent's credential pins a pod, moves it to mode none (``numapin mode``), and the API server holds both Events on it
(the proxy's Events, the aggregation and the drops: tests/criproxy/test_events_containerd.py). One containerd (the
newest) keeps its CI cost to one plugin."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.nri_process import NriProcess
from numapin_lab.k8s.control_plane import ControlPlane
from tests.criproxy.test_e2e_containerd import EXCL, SHARED, cpus_of, pid_of
from tests.criproxy.test_events_containerd import _events, _grant_the_agents_role, _make_pod, _until, namespace

from .conftest import VERSIONS
from .test_plugin_containerd import _numapin

pytestmark = [pytest.mark.containerd, pytest.mark.apiserver]

__all__ = ["namespace"]  # the fixture, shared with the proxy's test


@pytest.mark.parametrize("nri_lab", [VERSIONS[-1]], indirect=True, ids=[f"containerd{VERSIONS[-1]}"])
async def test_the_nri_plugin_records_pinned_and_mode_changed_on_the_pod(
        nri_lab: ContainerdLab, control_plane: ControlPlane, namespace: str) -> None:
    cp = control_plane
    kubeconfig: Path = await asyncio.to_thread(_grant_the_agents_role, cp, check=False)
    uid = await asyncio.to_thread(_make_pod, cp, namespace, "db", "1")
    p = NriProcess(scratch_dir("npx-nri-ev-"), nri_lab.socket, nri_lab.nri_socket, reserved_cpus=SHARED,
                   extra_args=("--kubeconfig", str(kubeconfig)))
    await asyncio.to_thread(p.start)
    try:
        async with CRIClient(nri_lab.socket) as kubelet:  # kubelet talks to containerd itself
            cfg = kubelet.sandbox_config("db", uid, namespace=namespace)
            sid = await kubelet.run_pod_sandbox(cfg)
            cid = await kubelet.create_container(
                sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000), cfg)
            await kubelet.start_container(cid)
            assert cpus_of(await pid_of(kubelet, cid)) == (EXCL, EXCL)
        moved = await asyncio.to_thread(_numapin, "mode", f"{namespace}/db", "none", "--socket", p.control_socket)
        assert moved.returncode == 0, moved.stdout + moved.stderr

        def both() -> bool:
            return sorted(e["reason"] for e in _events(cp, namespace)) == ["ModeChanged", "Pinned"]

        await _until("Pinned and ModeChanged", both)
        events = {e["reason"]: e for e in _events(cp, namespace)}
        pinned, changed = events["Pinned"], events["ModeChanged"]
        assert pinned["involvedObject"]["uid"] == uid and pinned["source"] == {"component": "numapin", "host": "lab"}
        assert pinned["message"].startswith(f"container main: exclusive cpus {EXCL} on NUMA node(s) ")
        assert changed["type"] == "Normal" and changed["involvedObject"]["uid"] == uid
        assert changed["message"].startswith("mode kubelet -> none: main exclusive->shared"), changed["message"]
    finally:
        p.stop()
        await nri_lab.remove_all_pods()
        shutil.rmtree(p.dir, ignore_errors=True)
