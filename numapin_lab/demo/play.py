"""The scenario ``numapin demo`` plays on a running ``LocalStack``: pods through the webhook (as kube-apiserver and
the scheduler send them), then through the proxy (as kubelet drives them), checked against the kernel."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from allocator.cpuset import CPUSet
from allocator.intent import INTENT_ANNOTATION
from allocator.pod import CPU_MANAGER_ANNOTATION
from allocator.topology import Topology
from numapin.cri_view import list_runtime_containers
from numapin.node_status import NodeStatus, check_runtime, fetch_proxy_status, from_proxy_status, marks_of, render_text
from numapin.proc_cpus import process_cpus
from numapin.render import render_topology
from numapin_lab.cri.client import CRIClient, pb

from .admission import AdmissionAnswer, AdmissionClient
from .pod_manifest import make_pod
from .pod_runner import PodRunner, RunningPod
from .stack import SERVER_NAME, LocalStack

__all__ = ["Demo", "make_pod", "say"]


def say(text: str = "") -> None:
    print(text, flush=True)


@dataclass(frozen=True)
class Row:
    pod: str
    container: str
    mode: str
    state_cpus: CPUSet
    state_mems: CPUSet
    real_cpus: CPUSet | None
    real_mems: CPUSet | None
    cgroup_cpus: CPUSet | None
    pid: int | None

    @property
    def ok(self) -> bool:
        return (self.real_cpus == self.state_cpus and self.real_mems == self.state_mems
                and self.cgroup_cpus in (None, self.state_cpus))


@dataclass(frozen=True)
class Snapshot:
    title: str
    status: NodeStatus
    rows: tuple[Row, ...]


async def webhook_sees_published(api: AdmissionClient, pod: Mapping[str, Any], nrt_file: Path,
                                 timeout: float = 15.0) -> bool | None:
    """Whether ``pod`` fits its node now according to the NodeResourceTopology in ``nrt_file`` (what the proxy last
    published), once the webhook says the same (a dry-run ``/validate``: nothing remembered); None if the webhook
    does not agree within ``timeout`` seconds. The webhook polls its NRT directory, so it lags a little."""
    from allocator.nrt import parse_nrt
    from allocator.pod import PodInfo
    from webhook.admission.simulate import Simulator

    node = parse_nrt(json.loads(nrt_file.read_text()))
    fits = Simulator().admit(node, PodInfo.from_pod(pod), occupied=True).admitted
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        answer = await api.validate(pod, dry_run=True)
        now = not any("right now" in w for w in answer.warnings)
        if answer.allowed and now == fits:
            return fits
        if loop.time() > deadline:
            return None
        await asyncio.sleep(0.1)


class Demo:
    def __init__(self, stack: LocalStack, topology: Topology, reserved: CPUSet) -> None:
        self.stack = stack
        self.topology = topology
        self.reserved = reserved
        self.node = stack.options.node_name
        self.pods: dict[str, RunningPod] = {}
        self.failures: list[str] = []
        self._log_mark = 0

    # -- entry points ---------------------------------------------------------------------------------------------
    def play(self, *, keep: bool = False) -> int:
        """Steps 2-6, then (unless ``keep``) step 7: the pods deleted as kubelet does. 1 if a check failed."""
        asyncio.run(self._play())
        if not keep:
            say("")
            say("7. Deleting the pods as kubelet does")
            asyncio.run(self.delete_and_check_release())
        return 1 if self.failures else 0

    def explain_keep(self) -> None:
        s = self.stack
        say("")
        say("The stack keeps running (--keep). Explore it from another terminal:")
        say(f"  numapin status --status-url {s.status_url} --runtime-endpoint unix://{s.lab.socket}")
        say(f"  numapin status --state-dir {s.state_dir} --nrt-file {s.nrt_file} --reserved-cpus {self.reserved} "
            f"--runtime-endpoint unix://{s.lab.socket}")
        say(f"  crictl --runtime-endpoint unix://{s.proxy_socket} ps      # kubelet's view, through the proxy")
        say(f"  curl -s {s.status_url.rsplit('/', 1)[0]}/metrics | grep numapin_")
        say(f"  curl -s --cacert {s.ca_file} --resolve {SERVER_NAME}:{s.webhook_url.rsplit(':', 1)[1]}:127.0.0.1 "
            f"https://{SERVER_NAME}:{s.webhook_url.rsplit(':', 1)[1]}/readyz")
        say(f"  cat {s.nrt_file}       # the published NodeResourceTopology")
        say(f"  cat {s.state_dir}/cpu_manager_state")
        say(f"  logs: {s.logs}/criproxy.log {s.logs}/webhook.log {s.lab.log}")
        say("Press Ctrl-C to stop everything and clean up.")

    def cleanup_pods(self) -> None:
        """Delete the demo's pods through the proxy (best effort; used after --keep)."""
        if self.pods:
            asyncio.run(self._delete_all(quiet=True))

    # -- helpers --------------------------------------------------------------------------------------------------
    def _check(self, ok: bool, what: str) -> None:
        say(f"   {'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failures.append(what)

    def _proxy_decisions(self) -> list[str]:
        """The proxy's decision/release log lines since the last call."""
        assert self.stack.proxy is not None
        text = self.stack.proxy.text()
        new = text[self._log_mark:]
        self._log_mark = len(text)
        out = []
        for line in new.splitlines():
            for key in ("decision ", "release ", "resize pod=", "shared pool -> ", "mode change "):
                if key in line:
                    out.append(line[line.index(key):])
                    break  # one line once (a resize's line names the shared pool too)
        return out

    def _show_proxy_log(self) -> None:
        for line in self._proxy_decisions():
            say(f"      proxy log: {line}")

    def _allocatable_per_numa(self) -> dict[int, int]:
        return {n: len(self.topology.cpus_in_numa(n) - self.reserved) for n in self.topology.cpu_numa_nodes}

    def _published(self) -> str:
        doc = json.loads(self.stack.nrt_file.read_text())
        zones = []
        for z in doc.get("zones", []):
            for r in z.get("resources", []):
                if r.get("name") == "cpu":
                    zones.append(f"{z['name']}: capacity {r['capacity']}, allocatable {r['allocatable']}, "
                                 f"available {r['available']}")
        return "; ".join(zones)

    # -- the API server and scheduler side -----------------------------------------------------------------------
    async def _admit(self, api: AdmissionClient, pod: dict[str, Any]) -> tuple[dict[str, Any], AdmissionAnswer]:
        """kube-apiserver's pods CREATE: /mutate, the patch applied, a uid given, /validate."""
        name = pod["metadata"]["name"]
        mutated, m = await api.mutate(pod)
        intent = (mutated["metadata"].get("annotations") or {}).get(INTENT_ANNOTATION)
        say(f"   /mutate   pod {name}: {'allowed' if m.allowed else 'DENIED'}, {len(m.patch)} patch operation(s); "
            f"{INTENT_ANNOTATION}: {intent}")
        for w in m.warnings:
            say(f"             warning: {w}")
        mutated = copy.deepcopy(mutated)
        mutated["metadata"]["uid"] = str(uuid.uuid4())  # the API server names the object before validation
        v = await api.validate(mutated)
        say(f"   /validate pod {name}: {'allowed' if v.allowed else 'DENIED: ' + v.message}")
        for w in v.warnings:
            say(f"             warning: {w}")
        if v.allowed:  # the API server stores the pod; the webhook reads it from there when judging its binding
            self.stack.store_pod(mutated)
        return mutated, v

    async def _bind(self, api: AdmissionClient, pod: Mapping[str, Any]) -> AdmissionAnswer:
        """The scheduler's pods/binding of the pod to this node."""
        meta = pod["metadata"]
        answer = await api.bind(meta["namespace"], meta["name"], self.node, pod_uid=meta["uid"])
        say(f"   binding   pod {meta['name']} -> node {self.node}: "
            f"{'allowed' if answer.allowed else 'DENIED: ' + answer.message}")
        for w in answer.warnings:
            say(f"             warning: {w}")
        return answer

    async def _sync(self, api: AdmissionClient, pod: Mapping[str, Any]) -> bool:
        """Wait until the webhook judges ``pod`` on the topology the proxy last published (as the scheduler's next
        attempt would); returns whether the pod fits the node now."""
        fits = await webhook_sees_published(api, pod, self.stack.nrt_file)
        if fits is None:
            self._check(False, "the webhook reads the node's published topology within 15 s")
            return False
        return fits

    # -- the kubelet side -----------------------------------------------------------------------------------------
    async def _run(self, runner: PodRunner, pod: Mapping[str, Any]) -> RunningPod:
        name = pod["metadata"]["name"]
        running = await runner.run(pod)
        self.pods[name] = running
        say(f"   kubelet   pod {name}: RunPodSandbox, CreateContainer, StartContainer through the proxy: running")
        self._show_proxy_log()
        return running

    async def _delete(self, runner: PodRunner, name: str) -> None:
        running = self.pods.pop(name)
        await runner.delete(running)
        say(f"   kubelet   pod {name} deleted: StopContainer, StopPodSandbox, RemoveContainer, RemovePodSandbox")
        self._show_proxy_log()

    async def _delete_all(self, *, quiet: bool = False) -> None:
        async with CRIClient(self.stack.proxy_socket) as kubelet:
            runner = PodRunner(kubelet, self.stack.cgroup_root)
            for name in list(self.pods):
                if quiet:
                    await runner.delete(self.pods.pop(name))
                else:
                    await self._delete(runner, name)

    # -- checks ---------------------------------------------------------------------------------------------------
    async def _snapshot(self, title: str) -> Snapshot:
        status = from_proxy_status(await asyncio.to_thread(fetch_proxy_status, self.stack.status_url),
                                   f"proxy status {self.stack.status_url}")
        containers = await list_runtime_containers(f"unix://{self.stack.lab.socket}")
        assigned = {(a.pod_uid, a.container): a for a in status.assignments}
        rows = []
        for c in containers:
            if not c.running:
                continue
            a = assigned.get((c.pod_uid, c.name))
            cpus = a.cpus if a is not None else status.shared_pool
            mode = a.mode if a is not None else "shared"
            real = None
            if c.pid is not None:
                try:
                    real = process_cpus(c.pid)
                except (OSError, LookupError, ValueError):
                    real = None
            rows.append(Row(c.pod, c.name, mode, cpus, self.topology.numa_of(cpus),
                            real.cpus if real else None, real.mems if real else None,
                            real.cgroup_cpus if real else None, c.pid))
        status.assignments = [a if a.pod else type(a)(a.pod_uid, a.container, a.cpus, a.mode,
                                                      next((c.pod for c in containers if c.pod_uid == a.pod_uid), ""))
                              for a in status.assignments]
        return Snapshot(title, status, tuple(rows))

    def _show(self, snap: Snapshot) -> None:
        s = snap.status
        say(f"   {snap.title}")
        marks, legend = marks_of(s)
        for line in render_topology(self.topology, marks=marks, legend=legend).splitlines():
            say("     " + line)
        say(f"     shared pool: CPUs {s.shared_pool}; free CPUs per NUMA node: "
            + ", ".join(f"node {n}: {k}" for n, k in sorted(s.free_per_numa.items())))
        say("     container                 mode       proxy state (CPUs / NUMA)   kernel: Cpus_allowed_list / "
            "Mems_allowed_list / cpuset cgroup")
        for r in snap.rows:
            real = (f"{r.real_cpus} / {r.real_mems} / {r.cgroup_cpus if r.cgroup_cpus is not None else '-'}"
                    if r.real_cpus is not None else "unreadable")
            say(f"     {r.pod + ' ' + r.container:25} {r.mode:10} {str(r.state_cpus) + ' / ' + str(r.state_mems):27} "
                f"{real}  {'ok' if r.ok else 'MISMATCH'}")
        self._check(all(r.ok for r in snap.rows) and bool(snap.rows),
                    f"every running container's real CPUs and memory nodes are what the proxy decided "
                    f"({len(snap.rows)} container(s))")

    def _row(self, snap: Snapshot, pod: str) -> Row | None:
        return next((r for r in snap.rows if r.pod == f"default/{pod}"), None)

    def _side_by_side(self, share: Snapshot, exclusive: Snapshot) -> None:
        def column(snap: Snapshot, pod: str) -> list[str]:
            r, web = self._row(snap, pod), self._row(snap, "web")
            return [f"{pod} ({r.mode if r else '?'}): CPUs {r.real_cpus if r else '?'}",
                    f"shared pool: {snap.status.shared_pool}",
                    f"web (shared) runs on: {web.real_cpus if web else '?'}",
                    f"free for new pins: {sum(snap.status.free_per_numa.values())} CPU(s)"]

        left, right = column(share, "cache"), column(exclusive, "db")
        say("   share and exclusive side by side (real Cpus_allowed_list):")
        say(f"     {'share: qos.gocrane.io/cpu-manager=share':44} | exclusive: qos.gocrane.io/cpu-manager=exclusive")
        for a, b in zip(left, right, strict=True):
            say(f"     {a:44} | {b}")
        r_share, r_excl = self._row(share, "cache"), self._row(exclusive, "db")
        web_s, web_e = self._row(share, "web"), self._row(exclusive, "web")
        if r_share and web_s and r_share.real_cpus is not None and web_s.real_cpus is not None:
            self._check(r_share.real_cpus.issubset(web_s.real_cpus),
                        "the share pod's CPUs stay in the shared pool: the shared container still runs on them")
        else:
            self._check(False, "share pod and shared container found")
        if r_excl and web_e and r_excl.real_cpus is not None and web_e.real_cpus is not None:
            self._check(not (r_excl.real_cpus & web_e.real_cpus),
                        "the exclusive pod's CPUs left the shared pool: the shared container no longer runs on them")
        else:
            self._check(False, "exclusive pod and shared container found")

    async def _live_transition(self, api: AdmissionClient, db: dict[str, Any]) -> None:
        """db exclusive -> share while it runs (kubectl annotate; the node told on its control socket, as
        `numapin mode` does), with the real Cpus_allowed_list before and after; then back to exclusive."""
        from nodeagent.serve.control import call_control

        say("")
        say("   A live change of mode, without restarting db: kubectl annotate pod db "
            "qos.gocrane.io/cpu-manager=share --overwrite")
        pods = {name: self.pods[name] for name in ("db", "web") if name in self.pods}
        pids = {name: await self._pid(p) for name, p in pods.items()}
        before = {name: process_cpus(pid).cpus for name, pid in pids.items()}
        changed = copy.deepcopy(db)
        changed["metadata"]["annotations"][CPU_MANAGER_ANNOTATION] = "share"
        updated, m, v = await api.update(db, changed)
        intent = json.loads(updated["metadata"]["annotations"][INTENT_ANNOTATION])
        say(f"   /mutate   UPDATE pod db: intent stamped again, cpuManager={intent['cpuManager']}; "
            f"/validate UPDATE: {'allowed' if v.allowed else 'DENIED: ' + v.message}")
        self._check(m.allowed and v.allowed and intent["cpuManager"] == "share",
                    "the webhook allows the change of mode and stamps the intent again")
        control = str(Path(self.stack.proxy_socket).with_name("control.sock"))
        answer = await call_control(control, {"op": "set-mode", "pod": "default/db", "mode": "share"})
        say(f"   proxy     {answer.get('message')}")
        after = {name: process_cpus(pid).cpus for name, pid in pids.items()}
        for name in pids:
            say(f"   kernel    {name}: Cpus_allowed_list {before[name]} -> {after[name]}")
        self._check(answer.get("outcome") == "changed" and after.get("db") == before.get("db"),
                    "db keeps its CPUs, now in share mode (same process, not restarted)")
        if "web" in after and "db" in after:
            self._check(bool(before["db"]) and not (before["db"] & before["web"]) and before["db"] <= after["web"],
                        "the shared container web now runs on db's CPUs too (share keeps them in the pool)")
        self._show_proxy_log()
        back = await call_control(control, {"op": "set-mode", "pod": "default/db", "mode": "exclusive"})
        web_back = process_cpus(pids["web"]).cpus if "web" in pids else None
        say(f"   and back: {back.get('message')}; web: Cpus_allowed_list {web_back}")
        self._check(back.get("outcome") == "changed" and web_back == before.get("web"),
                    "back to exclusive: web narrowed first, db alone on its CPUs again")
        self._show_proxy_log()

    async def _live_resize(self, api: AdmissionClient, kubelet: CRIClient, db: dict[str, Any], k: int) -> None:
        """kubectl patch pod db --subresource resize: judged by /validate (pods/resize), then kubelet's
        UpdateContainerResources through the proxy (new shares and quota, no cpuset), with the real
        Cpus_allowed_list of db and web before and after; a shrink, then the growth back."""
        from numapin_lab.demo.admission import pod_request

        if "db" not in self.pods or "web" not in self.pods:
            return
        say("")
        smaller = k - 1 if k >= 2 else 0
        small = f"{smaller}" if smaller else "500m"
        say(f"   A live resize of db, without restarting it: kubectl patch pod db --subresource resize "
            f"(cpu {k} -> {small} -> {k})")
        pids = {name: await self._pid(self.pods[name]) for name in ("db", "web")}
        cid = self.pods["db"].containers["app"]
        for target, milli in ((small, smaller * 1000 or 500), (str(k), k * 1000)):
            resized = copy.deepcopy(db)
            for c in resized["spec"]["containers"]:
                c["resources"]["requests"]["cpu"] = c["resources"]["limits"]["cpu"] = target
            request = pod_request(resized, operation="UPDATE", old=db)
            request["subResource"] = "resize"
            v = await api.review("/validate", request)
            verdict = "allowed" if v.allowed else "DENIED: " + v.message
            say(f"   /validate UPDATE pods/resize db cpu={target}: {verdict}")
            self._check(v.allowed, f"the webhook allows resizing db to {target} CPU(s) on this node")
            before = {name: process_cpus(pid).cpus for name, pid in pids.items()}
            await kubelet.update_container_resources(cid, pb.LinuxContainerResources(
                cpu_period=100000, cpu_quota=milli * 100, cpu_shares=milli * 1024 // 1000))
            after = {name: process_cpus(pid).cpus for name, pid in pids.items()}
            for name in pids:
                say(f"   kernel    {name}: Cpus_allowed_list {before[name]} -> {after[name]}")
            own = milli % 1000 == 0
            self._check(after["db"] is not None and (len(after["db"]) == milli // 1000 if own else
                                                      after["db"] == after["web"]),
                        f"db runs on {milli // 1000 if own else 'the shared pool'} CPU(s) as the kernel shows, "
                        "the same process")
            if own and after["db"] is not None and after["web"] is not None:
                self._check(not (after["db"] & after["web"]), "web is not on any of db's CPUs (narrowed first)")
            self._show_proxy_log()
            db = resized

    async def _pid(self, pod: RunningPod) -> int:
        async with CRIClient(self.stack.proxy_socket) as kubelet:
            return await PodRunner(kubelet, self.stack.cgroup_root).pid_of(pod.containers["app"])

    # -- the scenario ---------------------------------------------------------------------------------------------
    async def _play(self) -> None:
        s = self.stack
        say(f"   containerd: {s.lab.socket}   numapin criproxy: {s.proxy_socket} (status {s.status_url})")
        say(f"   numapin webhook: {s.webhook_url} (certificate for {SERVER_NAME}, CA {s.ca_file})")
        say(f"   topology manager: policy {s.options.topology_manager_policy}, scope "
            f"{s.options.topology_manager_scope}; reserved CPUs {self.reserved}")
        say(f"   NodeResourceTopology {self.node} published by the proxy: {self._published()}")
        self._proxy_decisions()
        async with AdmissionClient(s.webhook_url, s.ca_file, SERVER_NAME) as api, \
                CRIClient(s.proxy_socket) as kubelet:
            runner = PodRunner(kubelet, s.cgroup_root)
            for _ in range(100):  # the webhook has read the proxy's NodeResourceTopology
                code, _body = await api.get("/readyz")
                if code == 200:
                    break
                await asyncio.sleep(0.1)

            say("")
            say("2. A shared pod and a `share` pod: webhook (mutate, validate, binding), then kubelet via the proxy")
            for pod in (make_pod("web", cpu="250m"), make_pod("cache", cpu="1", limit="1", mode="share")):
                mutated, v = await self._admit(api, pod)
                b = await self._bind(api, mutated)
                self._check(v.allowed and b.allowed, f"pod {pod['metadata']['name']} admitted by the webhook")
                await self._run(runner, mutated)
            share_snap = await self._snapshot("after web and cache:")
            self._show(share_snap)

            say("")
            k = max(self._allocatable_per_numa().values())
            say(f"3. An `exclusive` pod asking {k} CPU(s): as many as this machine's largest NUMA node can pin")
            db, v = await self._admit(api, make_pod("db", cpu=str(k), limit=str(k), mode="exclusive"))
            self._check(v.allowed, "pod db passes /validate")
            fits = await self._sync(api, db)
            first = await self._bind(api, db)
            self._check(first.allowed == fits, "the binding is judged on the node's published free CPUs")
            if not first.allowed:
                self._check("single-numa-node" in first.message,
                            "the binding is denied naming the topology manager policy single-numa-node")
                say("   (the scheduler keeps db Pending instead of kubelet failing it after binding; "
                    "the `share` pod cache goes away to make room)")
                await self._delete(runner, "cache")
                self._check(await self._sync(api, db), "the node publishes the freed CPUs")
                b = await self._bind(api, db)
                self._check(b.allowed, "the binding of db is allowed once the node published its freed CPUs")
            await self._run(runner, db)
            excl_snap = await self._snapshot("after db:")
            self._show(excl_snap)
            self._side_by_side(share_snap, excl_snap)
            await self._live_transition(api, db)
            await self._live_resize(api, kubelet, db, k)

            say("")
            say(f"4. More `exclusive` pods of {k} CPU(s) until this node has no NUMA node left that holds one")
            denied = False
            for i in range(2, 2 + len(self.topology.cpu_numa_nodes) + 1):
                more, v = await self._admit(api, make_pod(f"db{i}", cpu=str(k), limit=str(k), mode="exclusive"))
                fits = await self._sync(api, more)
                b = await self._bind(api, more)
                self._check(b.allowed == fits, "the binding is judged on the node's published free CPUs")
                if not b.allowed:
                    self._check("single-numa-node" in b.message and "would reject" in b.message,
                                f"the binding of db{i} is denied under single-numa-node, with the node's reason")
                    denied = True
                    break
                await self._run(runner, more)
            self._check(denied, "a binding was denied once the node was full")

            say("")
            big_n = k + 1
            say(f"5. A pod asking {big_n} exclusive CPUs: more than any NUMA node of this machine holds")
            big, v = await self._admit(api, make_pod("batch", cpu=str(big_n), limit=str(big_n), mode="exclusive"))
            self._check(not v.allowed and "single-numa-node" in v.message and "largest NUMA node" in v.message,
                        "/validate denies it, naming the policy single-numa-node and the largest NUMA node")
            say("   had it reached the node anyway (no webhook), kubelet's CreateContainer through the proxy:")
            running = await runner.run_sandbox(big)
            try:
                await runner.run_containers(big, running)
                self._check(False, "the proxy refuses the container")
            except grpc.aio.AioRpcError as e:
                say(f"   proxy answered {e.code().name}: {e.details()}")
                self._check(e.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED),
                            "the proxy refuses the container (kubelet would retry with back-off, no pod storm)")
            self._show_proxy_log()
            await kubelet.stop_pod_sandbox(running.sandbox_id)
            await kubelet.remove_pod_sandbox(running.sandbox_id)

            say("")
            say("6. What `numapin status` shows now (the proxy's /status, containers checked against containerd)")
            status = from_proxy_status(await asyncio.to_thread(fetch_proxy_status, s.status_url),
                                       f"proxy status {s.status_url}")
            check_runtime(status, await list_runtime_containers(f"unix://{s.lab.socket}"))
            for line in render_text(status).splitlines():
                say("     " + line)
            self._check(not status.disagreements, "numapin status finds no container whose real cpuset disagrees")

    async def delete_and_check_release(self) -> None:
        """Delete the pods as kubelet does and check the shared pool widens back."""
        async with CRIClient(self.stack.proxy_socket) as kubelet:
            runner = PodRunner(kubelet, self.stack.cgroup_root)
            web = self.pods.get("web")
            for name in [n for n in self.pods if n != "web"]:
                await self._delete(runner, name)
            if web is not None:
                pid = await runner.pid_of(web.containers["app"])
                allowed = process_cpus(pid).cpus
                self._check(allowed == self.topology.all_cpus,
                            f"with the pinned pods gone, web runs on every CPU again ({allowed})")
                await self._delete(runner, "web")
            doc = await asyncio.to_thread(fetch_proxy_status, self.stack.status_url)
            self._check(doc["assignments"] == [], "the proxy's state holds no assignment")
