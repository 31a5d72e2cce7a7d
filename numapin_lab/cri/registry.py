"""A read-only image registry on localhost for a lab with no way out: every repository name it is asked for is the
lab's busybox image (one layer, built offline), so a runtime's ``PullImage`` of any name succeeds.

For the CRI validation suite (critest ``-registry-prefix 127.0.0.1:<port>``): critest pulls its test images by name
before each spec, and containerd's CRI pulls from a registry even when the image is already there. Each repository
gets a config of its own (the same layer, a label naming the repository), so two names are two images (two image ids:
removing one does not remove the other) while two tags of one repository are one image; a repository whose name says
``nginx`` is a web server (busybox's ``httpd`` on port 80, or on critest's host-network port for ``hostnet-nginx``).
Digest references resolve only to digests this registry made. Plain HTTP on 127.0.0.1 (containerd pulls from
``localhost`` and loopback registries without TLS).

``python -m numapin_lab.cri.registry DIR`` serves until killed and writes its port to ``DIR/port``;
``RegistryProcess`` runs it as a child process.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from .proxy_process import stop_child

__all__ = ["ImageSet", "RegistryProcess", "main"]

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
HOSTNET_WEB_PORT = "12003"  # critest's host-network web server's port
NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class ImageSet:
    """The one layer and the base config (the busybox image's) every repository is made of."""

    layer: bytes
    base_config: dict[str, object]

    @classmethod
    def from_docker_archive(cls, archive: Path, tag: str) -> ImageSet:
        """The image ``tag`` of a docker archive with one layer (``containerd.build_image_archive``'s)."""
        with tarfile.open(archive) as tf:
            manifest = json.loads(_member(tf, "manifest.json"))
            entry = next((m for m in manifest if tag in m.get("RepoTags", [])), None)
            if entry is None or len(entry["Layers"]) != 1:
                raise ValueError(f"{archive} has no one-layer image {tag}")
            return cls(_member(tf, entry["Layers"][0]), json.loads(_member(tf, entry["Config"])))

    def config(self, repository: str) -> bytes:
        cfg = json.loads(json.dumps(self.base_config))
        inner = cfg.setdefault("config", {})
        inner["Labels"] = {"org.numapin.lab.repository": repository}
        if "nginx" in repository:
            port = HOSTNET_WEB_PORT if "hostnet" in repository else "80"
            inner["Entrypoint"] = ["/bin/httpd", "-f", "-p", port, "-h", "/"]
            inner.pop("Cmd", None)
        return json.dumps(cfg, sort_keys=True).encode()

    def manifest(self, repository: str) -> tuple[bytes, bytes]:
        """(the manifest, its config) of ``repository``."""
        cfg = self.config(repository)
        man = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": _digest(cfg), "size": len(cfg)},
            "layers": [{"mediaType": LAYER, "digest": _digest(self.layer), "size": len(self.layer)}],
        }, sort_keys=True).encode()
        return man, cfg


def _member(tf: tarfile.TarFile, name: str) -> bytes:
    f = tf.extractfile(name)
    if f is None:
        raise ValueError(f"{name} is not a file in the archive")
    return f.read()


class _Registry:
    def __init__(self, images: ImageSet) -> None:
        self.images = images
        self.blobs: dict[str, bytes] = {_digest(images.layer): images.layer}
        self.manifests: dict[str, bytes] = {}  # digest -> manifest, for pulls by digest

    def _manifest(self, repository: str) -> bytes:
        man, cfg = self.images.manifest(repository)
        self.blobs[_digest(cfg)] = cfg
        self.manifests[_digest(man)] = man
        return man

    async def root(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({})

    async def manifest(self, request: web.Request) -> web.StreamResponse:
        repository, ref = request.match_info["name"], request.match_info["ref"]
        if not NAME.match(repository):
            return web.json_response({"errors": [{"code": "NAME_INVALID", "message": repository}]}, status=400)
        man = self._manifest(repository)
        if ref.startswith("sha256:"):
            if ref not in self.manifests:
                return web.json_response({"errors": [{"code": "MANIFEST_UNKNOWN", "message": ref}]}, status=404)
            man = self.manifests[ref]
        headers = {"Docker-Content-Digest": _digest(man), "Content-Type": MANIFEST}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(man))})
        return web.Response(body=man, headers=headers)

    async def blob(self, request: web.Request) -> web.StreamResponse:
        digest = request.match_info["digest"]
        data = self.blobs.get(digest)
        if data is None:
            return web.json_response({"errors": [{"code": "BLOB_UNKNOWN", "message": digest}]}, status=404)
        headers = {"Docker-Content-Digest": digest, "Content-Type": "application/octet-stream"}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        return web.Response(body=data, headers=headers)


def app(images: ImageSet) -> web.Application:
    reg = _Registry(images)
    a = web.Application()
    a.router.add_route("GET", "/v2/", reg.root)
    for method in ("GET", "HEAD"):
        a.router.add_route(method, r"/v2/{name:.+}/manifests/{ref:[^/]+}", reg.manifest)
        a.router.add_route(method, r"/v2/{name:.+}/blobs/{digest:sha256:[0-9a-f]{64}}", reg.blob)
    return a


async def _serve(images: ImageSet, port_file: Path) -> None:
    runner = web.AppRunner(app(images), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    port = server.sockets[0].getsockname()[1] if server is not None and server.sockets else 0
    tmp = port_file.with_suffix(".tmp")
    tmp.write_text(f"{port}\n")
    tmp.rename(port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m numapin_lab.cri.registry",
                                description="Serve the lab's busybox image under every repository name on "
                                            "127.0.0.1 (plain HTTP, read-only); the port goes to DIR/port.")
    p.add_argument("dir", type=Path, help="a directory holding images.tar (the lab's docker archive)")
    p.add_argument("--tag", default="localhost/busybox:latest", help="the archive's image to serve")
    args = p.parse_args(argv)
    images = ImageSet.from_docker_archive(args.dir / "images.tar", args.tag)
    asyncio.run(_serve(images, args.dir / "port"))
    return 0


class RegistryProcess:
    """The registry as a child process serving ``directory/images.tar``; ``address`` is ``127.0.0.1:<port>``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self, timeout: float = 60.0) -> RegistryProcess:
        port_file = self.dir / "port"
        port_file.unlink(missing_ok=True)
        with open(self.dir / "registry.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "numapin_lab.cri.registry", str(self.dir)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log_text = (self.dir / "registry.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the lab's registry did not start: {log_text}")
            time.sleep(0.05)
        self.address = f"127.0.0.1:{port_file.read_text().strip()}"
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_child(self.proc)
            self.proc = None

    def __enter__(self) -> RegistryProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())
