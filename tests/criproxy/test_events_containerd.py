"""Events on pods (nodeagent.serve.events) from a real ``numapin criproxy`` process in front of a real containerd,
recorded on the session's real kube-apiserver v1.36.2 with the node agent's own RBAC (the ClusterRole of
manifests/criproxy/installer-daemonset.yaml, bound to a user of its own): ``kubectl describe pod`` and ``kubectl get
events`` show Pinned, Refused, Repaired and Resized; a flood of the same refusal stays one Event whose count the
pod's spam filter caps (the rest dropped and counted); an API server that hangs, then is gone, while the agent runs
changes nothing on the node (the same CPUs in the kernel while the Event is not done, the drop counted). One proxy
for the module, reaching the API server through a TCP relay of the test's that stalls, then cuts, every
connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import selectors
import shutil
import socket
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc.aio
import pytest
import yaml

from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.proxy_process import ProxyProcess
from numapin_lab.k8s.control_plane import ControlPlane

from . import test_e2e_containerd as e2e
from .test_converge_containerd import write_cgroup_cpus
from .test_e2e_containerd import EXCL, SHARED, cpus_of, pid_of

lab, machine_cpus = e2e.lab, e2e.machine_cpus  # the same containerd

pytestmark = [pytest.mark.containerd, pytest.mark.apiserver]

ROOT = Path(__file__).resolve().parents[2]
USER = "numapin-events-lab"
FLOOD = 30  # refused creates of one pod: more than the spam filter's burst of 25


def _grant_the_agents_role(cp: ControlPlane, *, check: bool = True) -> Path:
    """The node agent's ClusterRole as shipped, bound to ``USER``; that user's kubeconfig (``check``: it may create
    and patch events, neither delete nor list them)."""
    docs = yaml.safe_load_all((ROOT / "manifests/criproxy/installer-daemonset.yaml").read_text())
    role = next(d for d in docs if d and d["kind"] == "ClusterRole")
    cp.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(role))
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": USER},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": role["metadata"]["name"]},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}]}
    cp.kubectl("apply", "--validate=false", "-f", "-", input=yaml.safe_dump(binding))
    kubeconfig = cp.kubeconfig_for(USER)
    for verb, allowed in (("create", "yes"), ("patch", "yes"), ("delete", "no"), ("list", "no")) if check else ():
        got = cp.kubectl("auth", "can-i", verb, "events", "-n", "default", user_kubeconfig=kubeconfig, check=False)
        assert got.stdout.strip() == allowed, (verb, got.stdout, got.stderr)
    return kubeconfig


def _make_pod(cp: ControlPlane, namespace: str, name: str, cpu: str) -> str:
    """A Guaranteed Pod object (as the API server holds it; no kubelet runs it) of one container; its uid."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
           "spec": {"nodeName": "lab", "containers": [{
               "name": "main", "image": "busybox",
               "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}}]}}
    cp.kubectl("create", "--validate=false", "-f", "-", input=json.dumps(pod))
    return cp.kubectl("get", "pod", name, "-n", namespace, "-o", "jsonpath={.metadata.uid}").stdout.strip()


def _metrics(proxy: ProxyProcess) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{proxy.port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^(numapin_criproxy_events_\w+\{[^}]*\}) (\S+)$", text, re.M)}


def _events(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(cp.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    return items


async def _until(what: str, check: Any, timeout: float = 60.0) -> None:
    """Poll ``check()`` (in a thread) until it is true; a failure names ``what``."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout:g} s: {what}")
        await asyncio.sleep(0.2)


@pytest.fixture
async def namespace(control_plane: ControlPlane) -> AsyncIterator[str]:
    ns = f"numapin-events-{os.getpid()}-{time.monotonic_ns() % 100000}"
    await asyncio.to_thread(control_plane.kubectl, "create", "namespace", ns)
    yield ns
    await asyncio.to_thread(control_plane.kubectl, "delete", "namespace", ns, "--wait=false")


class ApiCut:
    """A TCP relay on 127.0.0.1 (the API server's certificate names it) to ``target``. ``stall()``: nothing is
    forwarded any more (the API server hangs); ``cut()`` closes the listener and every connection: from then on the
    API server is not there for whoever came through it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._cut = False
        self._stalled = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # cut
            upstream = socket.create_connection(self.target)
            with self._lock:
                if self._cut:
                    client.close()
                    upstream.close()
                    return
                self._open += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        try:
            while True:
                for key, _ in sel.select():
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    if not self._stalled.is_set():
                        key.data.sendall(data)
        except OSError:
            return
        finally:
            sel.close()
            a.close()
            b.close()

    def stall(self) -> None:
        self._stalled.set()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            self.listener.close()
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def cut_and_proxy(lab: ContainerdLab, control_plane: ControlPlane) -> Iterator[tuple[ApiCut, ProxyProcess]]:
    """The proxy process with the node agent's credential (its RBAC), reaching the API server through an ApiCut."""
    kubeconfig = _grant_the_agents_role(control_plane)
    url = urlsplit(control_plane.url)
    cut = ApiCut((url.hostname or "127.0.0.1", url.port or 443))
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{cut.port}"
    relayed = kubeconfig.with_name("kubeconfig-events-relayed.yaml")
    relayed.write_text(yaml.safe_dump(doc))
    p = ProxyProcess(scratch_dir("npx-ev-"), lab.socket, reserved_cpus=SHARED,
                     extra_args=("--kubeconfig", str(relayed)))
    p.start()
    try:
        yield cut, p
    finally:
        p.stop()
        cut.cut()
        asyncio.run(lab.remove_all_pods())
        shutil.rmtree(p.dir, ignore_errors=True)


async def _pinned_pod(kubelet: CRIClient, namespace: str, name: str, uid: str) -> tuple[str, str, int]:
    """Sandbox and running container of the pod (1 CPU, Guaranteed) as kubelet makes them; their ids, its pid."""
    cfg = kubelet.sandbox_config(name, uid, namespace=namespace)
    sid = await kubelet.run_pod_sandbox(cfg)
    cid = await kubelet.create_container(sid, kubelet.container_config("main", cpu_milli=1000, limit_milli=1000),
                                         cfg)
    await kubelet.start_container(cid)
    return sid, cid, await pid_of(kubelet, cid)


async def test_pinned_refused_repaired_resized_show_on_the_pod_and_a_flood_stays_one_event(
        cut_and_proxy: tuple[ApiCut, ProxyProcess], control_plane: ControlPlane, namespace: str,
        machine_cpus: str) -> None:
    cp, (_, proxy) = control_plane, cut_and_proxy
    db_uid = await asyncio.to_thread(_make_pod, cp, namespace, "db", "1")
    big_uid = await asyncio.to_thread(_make_pod, cp, namespace, "big", "2")
    async with CRIClient(proxy.socket) as kubelet:
        db_sid, db, db_pid = await _pinned_pod(kubelet, namespace, "db", db_uid)
        assert cpus_of(db_pid) == (EXCL, EXCL)
        write_cgroup_cpus(db_pid, machine_cpus)  # someone else moves it: the convergence puts it back
        await _until("db repaired", lambda: cpus_of(db_pid) == (EXCL, EXCL))
        bigger = kubelet.container_config("main", cpu_milli=2000, limit_milli=2000).linux.resources
        with pytest.raises(grpc.aio.AioRpcError):  # kubelet's in-place resize to 2 CPUs: no CPU for it
            await kubelet.update_container_resources(db, bigger)
        cfg = kubelet.sandbox_config("big", big_uid, namespace=namespace)
        sid = await kubelet.run_pod_sandbox(cfg)
        for _ in range(FLOOD):  # kubelet's retries of a create numapin refuses (2 CPUs, 1 allocatable)
            with pytest.raises(grpc.aio.AioRpcError):
                await kubelet.create_container(
                    sid, kubelet.container_config("main", cpu_milli=2000, limit_milli=2000), cfg)
        await e2e.delete_pod(kubelet, db_sid, db)  # its CPU back: the module's next test pins again
        await kubelet.stop_pod_sandbox(sid)
        await kubelet.remove_pod_sandbox(sid)

    def refused_counted() -> bool:
        got = [e for e in _events(cp, namespace) if e["reason"] == "Refused"]
        return len(got) == 1 and got[0]["count"] == 25

    await _until("one Refused Event of count 25 (the spam filter's burst)", refused_counted)
    events = {e["reason"]: e for e in _events(cp, namespace)}
    assert set(events) == {"Pinned", "Refused", "Repaired", "Resized"}, events
    repaired, resized = events["Repaired"], events["Resized"]
    assert repaired["type"] == "Warning" and repaired["involvedObject"]["uid"] == db_uid
    assert repaired["message"] == (f"container main (exclusive) ran on cgroup cpuset.cpus {machine_cpus}, not its "
                                   f"decision: put back on cpus {EXCL} mems 0 (periodic)"), repaired["message"]
    assert resized["type"] == "Warning" and resized["involvedObject"]["uid"] == db_uid
    assert resized["message"].startswith("container main: resize refused ("), resized["message"]
    pinned, refused = events["Pinned"], events["Refused"]
    assert pinned["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                                        "name": "db", "uid": db_uid}
    assert pinned["type"] == "Normal" and pinned["source"] == {"component": "numapin", "host": "lab"}
    assert pinned["message"].startswith(f"container main: exclusive cpus {EXCL} on NUMA node(s) ")
    assert refused["type"] == "Warning" and refused["involvedObject"]["uid"] == big_uid
    assert refused["message"].startswith("container main: UnexpectedAdmissionError: "), refused["message"]
    assert "requested=2, available=0" in refused["message"]  # numapin's numbers (db holds the one CPU)
    metrics = _metrics(proxy)
    assert metrics['numapin_criproxy_events_sent_total{action="created"}'] == 4
    assert metrics['numapin_criproxy_events_sent_total{action="patched"}'] == 24
    assert metrics['numapin_criproxy_events_dropped_total{why="rate-limited"}'] == FLOOD - 25
    described = (await asyncio.to_thread(cp.kubectl, "describe", "pod", "db", "-n", namespace)).stdout
    assert re.search(rf"Normal\s+Pinned\s+.*numapin\s+container main: exclusive cpus {EXCL}", described), described
    described = (await asyncio.to_thread(cp.kubectl, "describe", "pod", "big", "-n", namespace)).stdout
    assert re.search(r"Warning\s+Refused\s+.*\(x25 over .*\)\s+numapin\s+container main: ", described), described
    listed = (await asyncio.to_thread(cp.kubectl, "get", "events", "-n", namespace)).stdout
    assert re.search(r"Normal\s+Pinned\s+pod/db\s", listed) and re.search(r"Warning\s+Refused\s+pod/big\s",
                                                                            listed), listed


async def test_an_api_server_gone_changes_nothing_on_the_node(
        cut_and_proxy: tuple[ApiCut, ProxyProcess], machine_cpus: str) -> None:
    cut, proxy = cut_and_proxy
    before = _metrics(proxy)
    cut.stall()  # the API server hangs: the decision does not wait for its Event
    async with CRIClient(proxy.socket) as kubelet:
        sid, cid, pid = await _pinned_pod(kubelet, "default", "gone", f"uid-gone-{time.monotonic_ns()}")
        assert cpus_of(pid) == (EXCL, EXCL)  # the same decision as with the API server there
        assert _metrics(proxy) == before  # decided, started and in the kernel while its Event is not done
        cut.cut()  # the API server is gone for the agent, its connections with it
        await e2e.delete_pod(kubelet, sid, cid)

    def dropped() -> bool:
        return _metrics(proxy).get('numapin_criproxy_events_dropped_total{why="unreachable"}', 0) >= 1

    await _until("the Pinned Event dropped as unreachable", dropped)
    after = _metrics(proxy)
    sent = [k for k in after if k.startswith("numapin_criproxy_events_sent_total")]
    assert {k: after[k] for k in sent} == {k: before.get(k) for k in sent}
    assert "Event Pinned on pod default/gone dropped (unreachable)" in proxy.log.read_text()
