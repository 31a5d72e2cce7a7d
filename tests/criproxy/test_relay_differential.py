"""The two relays side by side: the same seeded random sequence of CRI calls (pods created, started, stopped,
updated, removed, asked about, exec'd into, calls on unknown ids) through ``numapin criproxy --relay frames`` and
``--relay grpc`` in front of one real containerd, with a GetContainerEvents stream open through the proxy all the
while. The answers (normalized: ids replaced by the pod's place in the sequence) and the kernel's cpusets of every
running container (``/proc/<pid>/status`` and the cgroup's cpuset.cpus) must be the same after every call, and no
running container may share an exclusive container's CPU at any point."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
from collections.abc import Iterator

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import ContainerdLab, scratch_lab
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.proxy_process import ProxyProcess

from .test_e2e_containerd import ALL, EXCL, SHARED, cpus_of, pid_of

pytestmark = pytest.mark.containerd

OPS = 22


@pytest.fixture(scope="module")
def lab() -> Iterator[ContainerdLab]:
    with scratch_lab("npx-diff-") as lab:
        yield lab


async def _answer(call: object) -> object:
    try:
        return ("ok", await call)  # type: ignore[misc]
    except grpc.aio.AioRpcError as e:
        return ("error", e.code().name)


async def _run(lab: ContainerdLab, relay: str, seed: int) -> list[object]:
    """The transcript of the sequence through ``--relay relay``."""
    rng = random.Random(seed)
    d = scratch_dir(f"npx-diff-{relay}-")
    proxy = ProxyProcess(d, lab.socket, reserved_cpus=SHARED, extra_args=("--relay", relay))
    await asyncio.to_thread(proxy.start)
    transcript: list[object] = []
    pods: list[tuple[int, str, str, bool]] = []  # (place, sandbox id, container id, exclusive)
    events: list[int] = []
    try:
        async with CRIClient(proxy.socket) as k:

            async def watch() -> None:
                async for ev in k.container_events():
                    events.append(ev.container_event_type)

            watcher = asyncio.ensure_future(watch())
            for step in range(OPS):
                op = rng.choice(["pod", "pod", "stop", "start", "status", "list", "update", "rm", "bogus", "exec"])
                if op == "pod" or not pods:
                    op = "pod" if len(pods) < 3 else "rm"
                place = rng.randrange(len(pods)) if pods else 0
                if op == "pod":
                    exclusive = rng.random() < 0.5
                    uid = f"diff-{relay}-{step}"
                    cfg = k.sandbox_config(f"p{step}", uid, qos="guaranteed" if exclusive else "burstable")
                    sid = await k.run_pod_sandbox(cfg)
                    cc = k.container_config("main", cpu_milli=1000 if exclusive else 200,
                                            limit_milli=1000 if exclusive else None)
                    created = await _answer(k.create_container(sid, cc, cfg))
                    if created[0] != "ok":  # rejected (no CPU left): the pod goes, as kubelet would see it
                        await k.stop_pod_sandbox(sid)
                        await k.remove_pod_sandbox(sid)
                        transcript.append((op, exclusive, created))
                    else:
                        cid = str(created[1])  # type: ignore[index]
                        start = await _answer(k.start_container(cid))
                        pods.append((step, sid, cid, exclusive))
                        transcript.append((op, exclusive, start))
                else:
                    born, sid, cid, _ = pods[place]
                    if op == "stop":
                        transcript.append((op, born, await _answer(k.stop_container(cid, timeout=0))))
                    elif op == "start":
                        transcript.append((op, born, await _answer(k.start_container(cid))))
                    elif op == "status":
                        st = await k.container_status(cid)
                        transcript.append((op, born, st.status.state, st.status.metadata.name))
                    elif op == "list":
                        names = {c: b for b, _, c, _ in pods}
                        listed = sorted((names.get(c.id, -1), c.state) for c in await k.list_containers())
                        transcript.append((op, listed))
                    elif op == "update":
                        res = pb.LinuxContainerResources(cpu_shares=rng.choice([2, 204, 1024]), cpu_period=100000,
                                                         cpu_quota=rng.choice([0, 50000, 100000]))
                        transcript.append((op, born, await _answer(k.update_container_resources(cid, res))))
                    elif op == "rm":
                        await k.stop_container(cid, timeout=0)
                        await k.stop_pod_sandbox(sid)
                        await k.remove_container(cid)
                        await k.remove_pod_sandbox(sid)
                        pods.pop(place)
                        transcript.append((op, born))
                    elif op == "bogus":
                        transcript.append((op, await _answer(k.container_status("no-such-container"))))
                    else:
                        r = await _answer(k.exec_sync(cid, ["echo", f"x{step}"]))
                        if r[0] == "ok":
                            r = ("ok", r[1].exit_code, r[1].stdout)  # type: ignore[index]
                        transcript.append((op, born, r))
                transcript.append(("kernel", await _kernel(k, pods)))
            # this machine's containerd may not implement the stream (UNIMPLEMENTED): then both relays say so
            ended = None
            if watcher.done():
                e = watcher.exception()
                ended = e.code().name if isinstance(e, grpc.aio.AioRpcError) else repr(e)
            else:
                assert events, "no container event came through the proxy"
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            transcript.append(("events stream", ended))
            for _, sid, cid, _ in pods:
                await k.stop_container(cid, timeout=0)
                await k.stop_pod_sandbox(sid)
                await k.remove_container(cid)
                await k.remove_pod_sandbox(sid)
    finally:
        proxy.stop()
        shutil.rmtree(d, ignore_errors=True)
    return transcript


async def _kernel(k: CRIClient, pods: list[tuple[int, str, str, bool]]) -> list[tuple[int, bool, str, str]]:
    """Every running container's (place, exclusive, Cpus_allowed_list, cpuset.cpus), from the kernel; an
    exclusive CPU seen in another running container's cpuset fails at once."""
    out = []
    for born, _, cid, exclusive in pods:
        if (await k.container_status(cid)).status.state != pb.CONTAINER_RUNNING:
            continue
        allowed, cg = cpus_of(await pid_of(k, cid))
        out.append((born, exclusive, allowed, cg))
    owners = [born for born, x, a, c in out if x and a == c == EXCL]
    assert len(owners) <= 1, f"two containers own CPU {EXCL}: {out}"
    for born, _, allowed, cg in out:
        if owners and born not in owners:
            assert ALL.max() not in CPUSet.parse(allowed) | CPUSet.parse(cg), \
                f"container {born} shares the exclusive CPU {EXCL} of container {owners[0]}: {out}"
    return out


@pytest.mark.parametrize("seed", [3, 8])
async def test_frames_and_grpc_relays_answer_and_pin_alike(lab: ContainerdLab, seed: int) -> None:
    frames = await _run(lab, "frames", seed)
    grpc_ = await _run(lab, "grpc", seed)
    for i, (a, b) in enumerate(zip(frames, grpc_, strict=True)):
        assert a == b, f"step {i} differs: frames {a} grpc {b}"


async def _long_calls(lab: ContainerdLab, relay: str) -> list[object]:
    """ExecSync past its deadline, then ExecSync cut by a containerd restart, through ``--relay relay``."""
    d = scratch_dir(f"npx-long-{relay}-")
    proxy = ProxyProcess(d, lab.socket, reserved_cpus=SHARED, extra_args=("--relay", relay))
    await asyncio.to_thread(proxy.start)
    out: list[object] = []
    try:
        async with CRIClient(proxy.socket) as k:
            cfg = k.sandbox_config("long", f"long-{relay}", qos="burstable")
            sid = await k.run_pod_sandbox(cfg)
            cid = await k.create_container(sid, k.container_config("main", cpu_milli=100), cfg)
            await k.start_container(cid)
            stub = k.channel.unary_unary(k.path("ExecSync"), request_serializer=pb.ExecSyncRequest.SerializeToString,
                                         response_deserializer=pb.ExecSyncResponse.FromString)
            out.append(await _answer(stub(pb.ExecSyncRequest(container_id=cid, cmd=["sleep", "5"], timeout=30),
                                          timeout=1.0)))
            out.append(await _answer(k.exec_sync(cid, ["echo", "after the deadline"])))
            call = asyncio.ensure_future(_answer(k.exec_sync(cid, ["sleep", "20"], timeout=30)))
            await asyncio.sleep(1.0)
            await asyncio.to_thread(lab.stop_containerd)
            try:
                out.append(await asyncio.wait_for(call, 60))  # cut: not left hanging on a half-dead connection
            finally:
                await asyncio.to_thread(lab.start_containerd)
            for _ in range(300):
                r = await _answer(k.exec_sync(cid, ["echo", "back"]))
                if r[0] == "ok":  # type: ignore[index]
                    out.append(("ok", r[1].stdout))  # type: ignore[index]
                    break
                await asyncio.sleep(0.1)
            await k.stop_container(cid, timeout=0)
            await k.stop_pod_sandbox(sid)
            await k.remove_container(cid)
            await k.remove_pod_sandbox(sid)
    finally:
        proxy.stop()
        shutil.rmtree(d, ignore_errors=True)
    return [("ok", x[1].exit_code, x[1].stdout) if isinstance(x, tuple) and isinstance(x[1], pb.ExecSyncResponse)
            else x for x in out]


async def test_long_calls_deadlines_and_a_containerd_restart_alike(lab: ContainerdLab) -> None:
    frames = await _long_calls(lab, "frames")
    grpc_ = await _long_calls(lab, "grpc")
    assert frames[0] == ("error", "DEADLINE_EXCEEDED"), frames
    assert frames[2] == ("error", "UNAVAILABLE"), frames
    assert frames[-1] == ("ok", b"back\n"), frames
    assert frames[1] == ("ok", 0, b"after the deadline\n"), frames
    assert frames == grpc_
