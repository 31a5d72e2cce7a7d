"""kubelet drift: real kubelet configuration files, state files, kubeadm-flags.env and a /proc-shaped directory with a
kubelet process read by ``check_kubelet``; then the proxy refusing new exclusive admissions while kubelet's CPU
Manager is static, reporting it in its log, /metrics, /status and ``numapin status``, and admitting again once
kubelet's configuration is back."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.request
from pathlib import Path

import grpc
import grpc.aio
import pytest

from allocator.cpuset import CPUSet
from criproxy.app import CriProxy
from nodeagent.node.kubelet_drift import CPU_STATIC, ENDPOINT, MEMORY_STATIC, KubeletPaths, check_kubelet, same_socket
from numapin.node_status import from_proxy_status, render_text
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.memory_runtime import MemoryRuntime
from tests.criproxy.inproc_proxy import proc_without_kubelet
from tests.criproxy.test_pinning import created_resources, proxy_config

LISTEN = "/run/numapin/criproxy.sock"


def kubelet_dir(tmp: Path, config: str | None = None, **files: str) -> KubeletPaths:
    root = tmp / "kubelet"
    root.mkdir(exist_ok=True)
    if config is not None:
        (root / "config.yaml").write_text(config)
    for name, text in files.items():
        (root / name.replace("_env", ".env").replace("kubeadm_flags", "kubeadm-flags")).write_text(text)
    (tmp / "proc").mkdir(exist_ok=True)
    return KubeletPaths(str(root / "config.yaml"), str(root), str(tmp / "proc"))


def fake_kubelet_process(proc: Path, pid: int, *args: str) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text("kubelet\n")
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in ("/usr/bin/kubelet", *args)) + b"\0")
    (d / "root").symlink_to("/")  # its file system: the paths of its flags are read through it


def kinds(report) -> list[str]:
    return sorted(p.kind for p in report.problems)


def test_nothing_to_see_is_no_drift(tmp_path: Path) -> None:
    report = check_kubelet(kubelet_dir(tmp_path), LISTEN)
    assert (report.problems, report.notes, report.refusal()) == ((), (), None)


def test_static_managers_and_a_foreign_endpoint_in_the_config_file(tmp_path: Path) -> None:
    paths = kubelet_dir(tmp_path, "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                                  "cpuManagerPolicy: static\nmemoryManagerPolicy: Static\n"
                                  "containerRuntimeEndpoint: unix:///run/containerd/containerd.sock\n")
    report = check_kubelet(paths, LISTEN)
    assert kinds(report) == sorted([CPU_STATIC, MEMORY_STATIC, ENDPOINT])
    assert [p.kind for p in report.fights] == [CPU_STATIC, MEMORY_STATIC]
    refusal = report.refusal()
    assert refusal and "CPU Manager policy is static" in refusal and "Memory Manager policy is Static" in refusal
    assert report.to_dict()["refusingExclusive"] is True


def test_the_proxy_s_socket_by_any_name_is_no_drift(tmp_path: Path) -> None:
    real = tmp_path / "run" / "numapin"
    real.mkdir(parents=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(real / "criproxy.sock"))
    try:
        (tmp_path / "var").mkdir()
        (tmp_path / "var" / "run").symlink_to(tmp_path / "run")
        listen = str(real / "criproxy.sock")
        via_link = f"unix://{tmp_path}/var/run/numapin/criproxy.sock"
        assert same_socket(via_link, listen) and not same_socket("unix:///run/containerd/containerd.sock", listen)
        paths = kubelet_dir(tmp_path, f"cpuManagerPolicy: none\ncontainerRuntimeEndpoint: {via_link}\n")
        assert check_kubelet(paths, listen).problems == ()
    finally:
        sock.close()


def test_state_files_tell_what_kubelet_last_ran_with(tmp_path: Path) -> None:
    paths = kubelet_dir(tmp_path, f"cpuManagerPolicy: none\ncontainerRuntimeEndpoint: unix://{LISTEN}\n",
                        cpu_manager_state=json.dumps({"policyName": "static", "defaultCpuSet": "0-3",
                                                      "checksum": 1}),
                        memory_manager_state=json.dumps({"policyName": "None", "checksum": 2}))
    report = check_kubelet(paths, LISTEN)
    assert kinds(report) == [CPU_STATIC] and "cpu_manager_state says static" in report.problems[0].detail
    (Path(paths.root_dir) / "memory_manager_state").write_text("{broken")
    assert any("memory_manager_state: cannot be read" in n for n in check_kubelet(paths, LISTEN).notes)


def test_flags_win_over_the_file_kubeadm_flags_then_the_process(tmp_path: Path) -> None:
    paths = kubelet_dir(tmp_path, f"cpuManagerPolicy: none\ncontainerRuntimeEndpoint: unix://{LISTEN}\n",
                        kubeadm_flags_env='KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///run/'
                                          'containerd/containerd.sock --pod-infra-container-image=pause"\n')
    report = check_kubelet(paths, LISTEN)
    assert kinds(report) == [ENDPOINT] and "kubeadm-flags.env" in report.problems[0].source
    # the running kubelet's own flags win over kubeadm-flags.env; its --config names the file read
    other = Path(paths.root_dir) / "other.yaml"
    other.write_text("memoryManagerPolicy: Static\n")
    fake_kubelet_process(Path(paths.proc_root), 4242, f"--config={other}", "--container-runtime-endpoint",
                         f"unix://{LISTEN}", "--cpu-manager-policy=static")
    report = check_kubelet(paths, LISTEN)
    assert kinds(report) == sorted([CPU_STATIC, MEMORY_STATIC])
    assert "pid 4242" in next(p.source for p in report.problems if p.kind == CPU_STATIC)
    assert str(other) in next(p.source for p in report.problems if p.kind == MEMORY_STATIC)


def test_a_config_without_an_endpoint_means_kubelet_s_default_when_its_flags_are_seen(tmp_path: Path) -> None:
    paths = kubelet_dir(tmp_path, "cpuManagerPolicy: none\n")
    report = check_kubelet(paths, LISTEN)  # flags not visible: not judged, said
    assert report.problems == () and any("runtime endpoint is neither" in n for n in report.notes)
    fake_kubelet_process(Path(paths.proc_root), 7, "--v=2")
    report = check_kubelet(paths, LISTEN)
    assert kinds(report) == [ENDPOINT] and "kubelet's default" in report.problems[0].detail


def test_an_unreadable_config_is_a_note(tmp_path: Path) -> None:
    report = check_kubelet(kubelet_dir(tmp_path, "cpuManagerPolicy: [static\n"), LISTEN)
    assert report.problems == () and "cannot be read as kubelet's configuration" in report.notes[0]


# -- the proxy ---------------------------------------------------------------------------------------------------

async def test_the_proxy_refuses_new_exclusive_admissions_while_kubelet_s_cpu_manager_is_static(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "numapin.criproxy")
    root = short_tmp / "kubelet"
    root.mkdir()
    config = root / "config.yaml"
    config.write_text("cpuManagerPolicy: static\n")
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs, kubelet_config=str(config), kubelet_root_dir=str(root),
                       kubelet_check_period="0", proc_root=proc_without_kubelet(short_tmp))
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        assert "kubelet drift: kubelet's CPU Manager policy is static" in caplog.text
        async with CRIClient(cfg.listen) as k:
            sb = k.sandbox_config("g", "uid-g")
            sid = await k.run_pod_sandbox(sb)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await k.create_container(sid, k.container_config("app", cpu_milli=2000, limit_milli=2000), sb)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "no new exclusive CPUs while kubelet would write cpusets too" in (e.value.details() or "")
            assert p.allocator.state.assignments == {}  # nothing kept of the refused admission
            shared = k.sandbox_config("s", "uid-s")
            sid_s = await k.run_pod_sandbox(shared)
            await k.create_container(sid_s, k.container_config("web", cpu_milli=100), shared)  # shared: admitted
            base = f"http://127.0.0.1:{p.metrics_port}"
            metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(f"{base}/metrics", timeout=10).read())
            text = metrics.decode()
            assert 'numapin_criproxy_kubelet_drift{kind="cpu-manager-static"} 1.0' in text
            assert 'numapin_criproxy_rejections_total{reason="KubeletDrift"} 1.0' in text
            doc = json.loads(await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"{base}/status", timeout=10).read()))
            assert doc["kubeletDrift"]["refusingExclusive"] is True
            shown = render_text(from_proxy_status(doc, "test"))
            assert "note: KUBELET DRIFT: kubelet's CPU Manager policy is static" in shown
            assert "refuses new exclusive admissions" in shown

            config.write_text("cpuManagerPolicy: none\n")  # kubelet put back; the next check (each minute) sees it
            await p.kubelet.check()
            assert "kubelet drift: cleared" in caplog.text
            cid = await k.create_container(sid, k.container_config("app", cpu_milli=2000, limit_milli=2000), sb)
            assert len(CPUSet.parse(created_resources(runtime, cid).cpuset_cpus)) == 2
            metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(f"{base}/metrics", timeout=10).read())
            assert 'numapin_criproxy_kubelet_drift{kind="cpu-manager-static"} 0.0' in metrics.decode()
    finally:
        await p.stop()


async def test_a_mode_change_to_exclusive_is_refused_too_while_kubelet_drifts(
        short_tmp: Path, runtime: MemoryRuntime, two_numa_sysfs: Path) -> None:
    from allocator.pod import CPU_MANAGER_ANNOTATION
    from nodeagent.decisions.mode_request import ModeRequest

    root = short_tmp / "kubelet"
    root.mkdir()
    (root / "memory_manager_state").write_text(json.dumps({"policyName": "Static", "checksum": 1}))
    cfg = proxy_config(short_tmp, runtime, two_numa_sysfs, kubelet_config=str(root / "config.yaml"),
                       kubelet_root_dir=str(root), kubelet_check_period="0", proc_root=proc_without_kubelet(short_tmp))
    p = await CriProxy(cfg).start()
    try:
        await asyncio.wait_for(p.reconciled.wait(), 30)
        async with CRIClient(cfg.listen) as k:
            sb = k.sandbox_config("db", "uid-db", annotations={CPU_MANAGER_ANNOTATION: "none"})
            sid = await k.run_pod_sandbox(sb)
            cid = await k.create_container(sid, k.container_config("main", cpu_milli=2000, limit_milli=2000), sb)
            await k.start_container(cid)  # mode none: the shared pool, admitted while kubelet drifts
            answer = await p.modes.request(ModeRequest("default", "db", "exclusive", "local"))
            assert (answer.outcome, answer.reason) == ("refused", "KubeletDrift"), answer
            assert "Memory Manager state file" in answer.message and p.allocator.state.assignments == {}
            (root / "memory_manager_state").write_text(json.dumps({"policyName": "None", "checksum": 1}))
            await p.kubelet.check()
            answer = await p.modes.request(ModeRequest("default", "db", "exclusive", "local"))
            assert answer.outcome == "changed", answer
            assert len(p.allocator.container_cpus("uid-db", "main") or ()) == 2
    finally:
        await p.stop()
