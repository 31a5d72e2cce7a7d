"""The numapin container image, as an operator builds and runs it.

``scripts/build-image.sh`` builds the OCI image from Debian packages (mmdebstrap) and Python wheels; the archive is
imported into the lab's containerd (``ctr images import``) and ``numapin webhook`` runs from it as a CRI container
(host network, the serving certificate mounted read-only, the image's own user 65532), answering ``/healthz`` over
TLS to a client that verifies the chain and the address (an IP SAN made by ``numapin certs --ip-address``).
Stopping the container stops the answers: it was the container that answered.

Cost: the image's base layer (Debian + numapin's dependencies) is cached under ``$NUMAPIN_IMAGE_CACHE``
(default /var/cache/numapin-image) keyed by the build script and the dependency list; building it cold takes about
4 minutes on 2 cores (downloads included); with it cached the build takes seconds and the whole test about 15 s.
The node install in the image is the session's (``tests.install.node_build.session_build``: built once for the
install tests, the systemd host's boot and this image, ``build-image.sh --node-install``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from numapin_lab.cri.client import CRIClient, pb
from numapin_lab.cri.containerd import ContainerdLab, scratch_lab
from numapin_lab.cri.ledger import scratch_dir
from tests.install.node_build import session_build

pytestmark = [pytest.mark.containerd, pytest.mark.timeout(900)]  # the session's node install may be built first

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/numapin:0.1.0"  # what manifests/ name and build-image.sh builds by default


@pytest.fixture(scope="module")
def image_archive(request: pytest.FixtureRequest) -> Iterator[Path]:
    # the session's node install (built once for the install tests and the systemd host's boot) goes in as it is
    node_install = session_build(request.config).get() / "opt/numapin"
    d = scratch_dir("numapin-image-test-")
    out = d / "numapin-image.tar"
    r = subprocess.run(["bash", str(ROOT / "scripts/build-image.sh"), "--out", str(out),
                        "--node-install", str(node_install)], cwd=ROOT,
                       capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, f"build-image.sh failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    try:
        yield out
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def lab() -> Iterator[ContainerdLab]:
    with scratch_lab("npx-img-") as lab:
        yield lab


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthz(port: int, ca: Path) -> str:
    ctx = ssl.create_default_context(cafile=str(ca))  # verifies the chain and the address (IP SAN)
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=5) as r:
        return f"{r.status} {r.read().decode().strip()}"


def _container_commands(pid: int) -> list[str]:
    """The command lines of every process in ``pid``'s cgroup (its container), in every hierarchy it has."""
    pids: set[str] = set()
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers in ("", "cpuset"):  # the unified hierarchy, or the v1 cpuset one
            mount = "/sys/fs/cgroup/unified" if controllers == "" and Path("/sys/fs/cgroup/unified").is_dir() \
                else "/sys/fs/cgroup" + ("/cpuset" if controllers == "cpuset" else "")
            procs = Path(mount + path, "cgroup.procs")
            if procs.exists():
                pids.update(procs.read_text().split())
    assert pids, f"no cgroup of process {pid} found"
    return sorted(Path(f"/proc/{p}/cmdline").read_bytes().rstrip(b"\0").replace(b"\0", b" ").decode()
                  for p in pids if Path(f"/proc/{p}").exists())


def test_archive_is_an_oci_image_named_as_the_manifests_say(image_archive: Path) -> None:
    with tarfile.open(image_archive) as tf:
        layout = json.load(tf.extractfile("./oci-layout"))  # type: ignore[arg-type]
        index = json.load(tf.extractfile("./index.json"))  # type: ignore[arg-type]
        assert layout["imageLayoutVersion"] == "1.0.0"
        [manifest_ref] = index["manifests"]
        assert manifest_ref["annotations"]["org.opencontainers.image.ref.name"] == IMAGE
        digest = manifest_ref["digest"].split(":", 1)[1]
        manifest = json.load(tf.extractfile(f"./blobs/sha256/{digest}"))  # type: ignore[arg-type]
        config = json.load(tf.extractfile(  # type: ignore[arg-type]
            "./blobs/sha256/" + manifest["config"]["digest"].split(":", 1)[1]))
    assert len(manifest["layers"]) == 2  # the cached base, numapin's own
    assert config["config"]["Entrypoint"] == ["/usr/local/bin/numapin"]
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["Labels"]["org.opencontainers.image.version"] == "0.1.0"


async def test_webhook_runs_from_the_image_and_answers_healthz_over_tls(image_archive: Path, lab: ContainerdLab,
                                                                        tmp_path: Path) -> None:
    r = subprocess.run(["ctr", "--address", lab.socket, "-n", "k8s.io", "images", "import", str(image_archive)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    tags = subprocess.run(["ctr", "--address", lab.socket, "-n", "k8s.io", "images", "ls", "-q"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert IMAGE in tags, tags

    certs = tmp_path / "tls"
    r = subprocess.run([sys.executable, "-m", "numapin", "certs", "--out-dir", str(certs), "--ip-address",
                        "127.0.0.1"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    os.chown(certs / "tls.key", 65532, 65532)  # as kubelet's fsGroup would make the Secret readable
    nrt = tmp_path / "nrt"
    nrt.mkdir()
    port = _free_port()

    async with CRIClient(lab.socket) as cri:
        uid = str(uuid.uuid4())
        sandbox = CRIClient.sandbox_config("numapin-webhook", uid, namespace="numapin", qos="burstable")
        sandbox.log_directory = str(tmp_path / "logs")  # the container's output, shown if it exits
        sid = await cri.run_pod_sandbox(sandbox)
        try:
            config = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="webhook", attempt=0), image=pb.ImageSpec(image=IMAGE),
                args=["webhook", "--cert=/etc/numapin/tls/tls.crt", "--key=/etc/numapin/tls/tls.key",
                      "--host=127.0.0.1", f"--port={port}", "--nrt-dir=/var/lib/numapin/nrt"],
                mounts=[pb.Mount(container_path="/etc/numapin/tls", host_path=str(certs), readonly=True),
                        pb.Mount(container_path="/var/lib/numapin/nrt", host_path=str(nrt), readonly=True)],
                labels={"io.kubernetes.container.name": "webhook"}, log_path="webhook.log")
            cid = await cri.create_container(sid, config, sandbox)
            await cri.start_container(cid)
            answer = ""
            for _ in range(300):
                try:
                    answer = await asyncio.to_thread(_healthz, port, certs / "ca.crt")
                    break
                except (OSError, urllib.error.URLError):
                    status = await cri.container_status(cid)
                    if status.status.state not in (0, 1):
                        log = tmp_path / "logs" / "webhook.log"
                        output = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
                        raise AssertionError(f"the container exited: {status.status}\noutput:\n{output}") from None
                    await asyncio.sleep(0.1)
            assert answer == "200 ok", answer
            status = await cri.container_status(cid)
            assert status.status.state == 1  # CONTAINER_RUNNING
            await cri.stop_container(cid, timeout=10)
            status = await cri.container_status(cid)
            assert status.status.exit_code == 0, status.status  # SIGTERM: a clean stop
            with pytest.raises((OSError, urllib.error.URLError)):
                await asyncio.to_thread(_healthz, port, certs / "ca.crt")
            await cri.remove_container(cid)
        finally:
            await cri.stop_pod_sandbox(sid)
            await cri.remove_pod_sandbox(sid)


async def test_the_installer_daemonsets_command_installs_from_the_image_and_sleeps(
        image_archive: Path, lab: ContainerdLab, tmp_path: Path) -> None:
    """The installer DaemonSet's own command line (manifests/criproxy/installer-daemonset.yaml) in a container of the
    image, against a fake host root mounted at /host: the node install the image carries lands on the host, the
    host's systemctl (a recording stand-in here, instead of nsenter into PID 1) is asked to enable and start the unit,
    and the container then sleeps. The pod runs as root in the cluster; here as the image's user, on a host root it
    may write."""
    import shlex

    import yaml

    from tests.install.node_host import FAKE_SYSTEMCTL

    r = subprocess.run(["ctr", "--address", lab.socket, "-n", "k8s.io", "images", "import", str(image_archive)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all((ROOT / "manifests/criproxy/installer-daemonset.yaml").read_text()))
    [ds] = [d for d in docs if d["kind"] == "DaemonSet"]
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    [c] = ds["spec"]["template"]["spec"]["containers"]
    [script] = c["args"]
    nsenter = shlex.split(script)[shlex.split(script).index("--systemctl") + 1]
    script = script.replace(f'"{nsenter}"', "/fake/systemctl")
    host, fake, settings = tmp_path / "host", tmp_path / "fake", tmp_path / "settings"
    for d in (host / "etc/systemd/system", host / "opt", fake, settings):
        d.mkdir(parents=True)
    (fake / "systemctl").write_text(FAKE_SYSTEMCTL.format(log="/host/systemctl.log", active="/host/active",
                                                          root="/host"))
    (fake / "systemctl").chmod(0o755)
    (settings / "criproxy.yaml").write_text(cm["data"]["criproxy.yaml"])
    for p in [host, *host.rglob("*")]:
        p.chmod(0o777)

    async with CRIClient(lab.socket) as cri:
        sandbox = CRIClient.sandbox_config("numapin-node-installer", str(uuid.uuid4()), namespace="kube-system")
        sandbox.log_directory = str(tmp_path / "logs")
        sid = await cri.run_pod_sandbox(sandbox)
        try:
            config = pb.ContainerConfig(
                metadata=pb.ContainerMetadata(name="install", attempt=0), image=pb.ImageSpec(image=IMAGE),
                command=c["command"], args=[script],
                mounts=[pb.Mount(container_path="/host", host_path=str(host)),
                        pb.Mount(container_path="/fake", host_path=str(fake), readonly=True),
                        pb.Mount(container_path="/etc/numapin-node", host_path=str(settings), readonly=True)],
                labels={"io.kubernetes.container.name": "install"}, log_path="install.log")
            cid = await cri.create_container(sid, config, sandbox)
            await cri.start_container(cid)
            log = tmp_path / "logs/install.log"
            for _ in range(1200):
                if (host / "active").exists():
                    break
                status = await cri.container_status(cid)
                if status.status.state not in (0, 1):
                    raise AssertionError(f"the installer exited: {status.status}\n"
                                         f"{log.read_text(errors='replace')[-3000:] if log.exists() else ''}")
                await asyncio.sleep(0.1)
            calls = (host / "systemctl.log").read_text().splitlines()
            assert calls == ["daemon-reload", "enable numapin-criproxy.service",
                             "is-active --quiet numapin-criproxy.service", "start numapin-criproxy.service"]
            status = await cri.container_status(cid, verbose=True)
            assert status.status.state == 1  # CONTAINER_RUNNING: it sleeps
            # and then all it runs is `sleep infinity` (once install.sh has returned): no proxy in the pod
            pid = int(json.loads(status.info["info"])["pid"])
            seen: list[list[str]] = []
            for _ in range(300):
                seen.append(_container_commands(pid))
                if seen[-1] == ["sleep infinity"]:
                    break
                await asyncio.sleep(0.1)
            assert seen[-1] == ["sleep infinity"], seen[-1]
            assert not any("criproxy" in c.split() for commands in seen for c in commands), seen
            release = os.readlink(host / "opt/numapin")
            installed = host / release.lstrip("/")
            assert (installed / "share/numapin/RELEASE").read_text().strip() == Path(release).name
            assert (host / "etc/numapin/criproxy.yaml").read_text() == cm["data"]["criproxy.yaml"]
            assert (host / "etc/systemd/system/numapin-criproxy.service").read_bytes() == \
                (ROOT / "manifests/criproxy/numapin-criproxy.service").read_bytes()
            # the release it put on the host runs there
            r = subprocess.run([str(installed / "bin/numapin"), "wait-socket", "--help"], cwd="/",
                               env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            await cri.stop_container(cid, timeout=1)
            await cri.remove_container(cid)
        finally:
            await cri.stop_pod_sandbox(sid)
            await cri.remove_pod_sandbox(sid)
