"""A private, throw-away containerd (CRI plugin + runc, cgroupfs; systemd's driver on request) for tests, the demo
and benchmarks.

Everything lives in one directory: config, root, state, logs and the socket. The busybox and pause images
are built offline from the static busybox binary (Debian's busybox-static) as a docker archive and
imported into the ``k8s.io`` namespace. Only host-network pods work, unless ``cni=True`` gives the lab a bridge network
of its own (``numapin_lab.cri.cni``, Debian's containernetworking-plugins); ``mirror`` sends every image pull to one
local registry (``numapin_lab.cri.registry``). ``stop()`` leaves no
process, mount, socket or cgroup behind: it kills the containers (and what ran in them), removes the shims' sockets
and, as kubelet does for its pods, the cgroups of the pods this containerd ran (runc never removes a pod's cgroup,
the parent of its containers') and the network's bridge; ``leftovers()`` says what stayed. Nothing else is touched.

Needs root and the Debian packages containerd, runc and busybox-static (``scripts/test.sh`` installs
them); ``LabError`` says what is missing. ``bin_dir`` runs another containerd (its ``containerd``,
``containerd-shim-runc-v2`` and ``ctr``; ``containerd_versions`` unpacks newer Debian suites' there) with the
system's runc; containerd 2.x gets its own configuration format (version 3: the CRI plugin split into
``io.containerd.cri.v1.runtime`` and ``io.containerd.cri.v1.images``). ``nri=True`` (containerd >= 1.7) switches
NRI on with its socket (``nri_socket``) and plugin directories in the lab's directory; without it NRI is switched off
on >= 1.7 (2.x would otherwise listen on the machine-wide ``/var/run/nri/nri.sock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from nodeagent.node.kernel import KernelRoots, cgroup_of_pid

from . import ledger
from .cgroups import existing_cgroup_dirs, processes_in, remove_cgroup
from .cni import CniNetwork, bridge_exists

__all__ = ["BUSYBOX_IMAGE", "PAUSE_IMAGE", "ContainerdLab", "LabError", "containerd_version", "scratch_lab",
           "shim_socket", "version_of"]

BUSYBOX_IMAGE = "localhost/busybox:latest"
PAUSE_IMAGE = "localhost/pause:latest"
MARKER = ".numapin-containerd-lab"
START_SECONDS = 60  # for containerd to answer after it was started (seconds on a loaded machine or under emulation)
CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")  # from bin_dir when given
SYSTEM_BINARIES = ("runc", "busybox")
NAMESPACE = "k8s.io"
SHIM_SOCKETS = Path("/run/containerd/s")  # where containerd-shim-runc-v2 puts its socket, whatever the lab's dir


class LabError(RuntimeError):
    """containerd could not be started or stopped (missing package, not root, CRI plugin broken)."""


def _busybox() -> Path:
    path = shutil.which("busybox") or "/bin/busybox"
    p = Path(path)
    if not p.exists():
        raise LabError("busybox not found: apt-get install busybox-static")
    if _has_interpreter(p.read_bytes()):
        raise LabError(f"{p} is dynamically linked; apt-get install busybox-static")
    return p


def _has_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF binary has a PT_INTERP program header (= dynamically linked)."""
    import struct

    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        return False
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 3 for i in range(phnum))


def _tar_bytes(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for info, data in members:
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _entry(name: str, kind: bytes, mode: int, data: bytes | None = None, link: str = "") -> tuple[
        tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.linkname = link
    if data is not None:
        info.size = len(data)
    return info, data


def build_image_archive(out: Path, busybox: Path) -> None:
    """A docker-archive with one layer (busybox + applet links) shared by the busybox and pause images."""
    applets = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True).stdout.split()
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for d in ("bin", "dev", "etc", "proc", "sys", "root", "run", "var", "tmp"):
        members.append(_entry(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
    members.append(_entry("bin/busybox", tarfile.REGTYPE, 0o755, busybox.read_bytes()))
    for a in sorted(set(applets) - {"busybox"}):
        if "/" not in a:
            members.append(_entry(f"bin/{a}", tarfile.SYMTYPE, 0o777, link="busybox"))
    members.append(_entry("etc/passwd", tarfile.REGTYPE, 0o644, b"root:x:0:0:root:/root:/bin/sh\n"))
    members.append(_entry("etc/group", tarfile.REGTYPE, 0o644, b"root:x:0:\n"))
    layer = _tar_bytes(members)
    layer_sum = hashlib.sha256(layer).hexdigest()
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)

    def config(extra: dict) -> bytes:
        return json.dumps({
            "architecture": arch, "os": "linux", "created": "1970-01-01T00:00:00Z",
            "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                       "WorkingDir": "/", **extra},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_sum}"]},
        }, sort_keys=True).encode()

    images = [(BUSYBOX_IMAGE, config({"Cmd": ["/bin/sh"]})),
              (PAUSE_IMAGE, config({"Entrypoint": ["/bin/sleep", "infinity"]}))]
    archive: list[tuple[tarfile.TarInfo, bytes | None]] = [
        _entry(f"{layer_sum}", tarfile.DIRTYPE, 0o755),
        _entry(f"{layer_sum}/layer.tar", tarfile.REGTYPE, 0o644, layer)]
    manifest = []
    for tag, cfg in images:
        name = hashlib.sha256(cfg).hexdigest() + ".json"
        archive.append(_entry(name, tarfile.REGTYPE, 0o644, cfg))
        manifest.append({"Config": name, "RepoTags": [tag], "Layers": [f"{layer_sum}/layer.tar"]})
    archive.append(_entry("manifest.json", tarfile.REGTYPE, 0o644, json.dumps(manifest).encode()))
    out.write_bytes(_tar_bytes(archive))


def containerd_version(bin_dir: Path | None = None) -> str:
    """``containerd --version``'s version (``1.6.20~ds1``, ``2.1.9+unknown``) of the one in ``bin_dir`` (or PATH)."""
    exe = str(bin_dir / "containerd") if bin_dir is not None else (shutil.which("containerd") or "containerd")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise LabError(f"{exe} --version failed: {e}") from None
    return version_of(out)


def version_of(text: str) -> str:
    """The version in ``containerd --version``'s line (its third field, without a leading ``v``)."""
    fields = text.split()
    if len(fields) < 3 or fields[0] != "containerd":
        raise LabError(f"unexpected `containerd --version` output: {text.strip()!r}")
    return fields[2].lstrip("v")


class ContainerdLab:
    """``ContainerdLab(directory).start()`` … ``.stop()``; ``.socket`` is the CRI endpoint. ``bin_dir``: where
    this lab's containerd, shim and ctr are (None: the system's, from PATH)."""

    def __init__(self, directory: str | os.PathLike[str], bin_dir: str | os.PathLike[str] | None = None, *,
                 systemd_cgroup: bool = False, nri: bool = False, cni: bool = False, mirror: str | None = None,
                 niceness: int = 0, nri_time_scale: float = 1.0) -> None:
        self.dir = Path(directory).resolve()
        # containerd started under ``nice -n niceness`` (its shims, runc and the containers inherit it): for labs
        # working in the background of a test session
        self.niceness = niceness
        # ``host:port`` of a plain-HTTP registry every pull goes to, whatever registry the image names
        # (numapin_lab.cri.registry); None: pulls go where the name says (nowhere reachable here)
        self.mirror = mirror
        # a CNI bridge network of the lab's own (numapin_lab.cri.cni) for pods off the host's network; without it
        # the CNI directories are empty and only host-network pods run
        self.cni = cni
        self.network: CniNetwork | None = None
        # NRI (containerd >= 1.7): on with ``nri``, its socket ``nri_socket`` and plugin dirs in the lab's directory;
        # otherwise switched off explicitly on >= 1.7 (2.x turns it on by default, on the machine-wide
        # /var/run/nri/nri.sock, running /opt/nri/plugins)
        self.nri = nri
        self.nri_socket = str(self.dir / "nri.sock")
        # containerd's NRI timeouts (registration 5 s, a plugin's answer 2 s) times this: under software emulation
        # (the multi-NUMA VMs) a Python plugin's answer takes seconds, where containerd would drop the plugin
        self.nri_time_scale = nri_time_scale
        # runc's systemd cgroup driver (``SystemdCgroup = true``): pods' cgroup parents are slices
        # (``kubepods-burstable-pod<uid>.slice``), containers systemd scopes made through its D-Bus API; needs
        # systemd as PID 1
        self.systemd_cgroup = systemd_cgroup
        self.bin_dir = Path(bin_dir).resolve() if bin_dir is not None else None
        self.env = dict(os.environ)
        if self.bin_dir is not None:  # containerd finds its shim in PATH
            self.env["PATH"] = f"{self.bin_dir}:{self.env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        self.version = ""  # containerd --version's, read at start
        self.socket = str(self.dir / "containerd.sock")
        self.config = self.dir / "config.toml"
        self.log = self.dir / "containerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pod_cgroups: set[str] = set()  # the pods' cgroups this containerd ran (found at stop, removed by it)

    # -- set-up ---------------------------------------------------------------------------------------
    def exe(self, name: str) -> str:
        """The path of one of containerd's programs (``containerd``, ``ctr``) this lab runs."""
        return str(self.bin_dir / name) if self.bin_dir is not None else name

    @staticmethod
    def check_prerequisites(bin_dir: Path | None = None) -> None:
        if os.geteuid() != 0:
            raise LabError("the containerd lab needs root")
        missing = [b for b in SYSTEM_BINARIES if shutil.which(b) is None]
        if bin_dir is None:
            missing += [b for b in CONTAINERD_BINARIES if shutil.which(b) is None]
        else:
            missing += [str(bin_dir / b) for b in CONTAINERD_BINARIES if not (bin_dir / b).exists()]
        if missing:
            raise LabError(f"missing {', '.join(missing)}: apt-get install containerd runc busybox-static")
        _busybox()

    @property
    def major(self) -> int:
        """containerd's major version (1 or 2), read at start."""
        try:
            return int(self.version.split(".")[0])
        except ValueError:
            raise LabError(f"containerd's version {self.version!r} has no major number") from None

    @property
    def minor(self) -> int:
        try:
            return int(self.version.split(".")[1])
        except (IndexError, ValueError):
            raise LabError(f"containerd's version {self.version!r} has no minor number") from None

    @property
    def has_nri(self) -> bool:
        """Whether this containerd has NRI (1.7 and later)."""
        return (self.major, self.minor) >= (1, 7)

    def _write_config(self) -> None:
        if self.nri and not self.has_nri:
            raise LabError(f"containerd {self.version} has no NRI (1.7 and later have): nri=True needs a newer one")
        self.config.write_text((self._config_v3() if self.major >= 2 else self._config_v2()) + self._config_nri())

    def _config_nri(self) -> str:
        """The NRI plugin's section (the same plugin id in both formats; nothing for 1.6, which has none)."""
        if not self.has_nri:
            return ""
        d = self.dir
        for sub in ("nri/plugins", "nri/conf.d"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        return f"""  [plugins."io.containerd.nri.v1.nri"]
    disable = {"false" if self.nri else "true"}
    disable_connections = false
    socket_path = "{self.nri_socket}"
    plugin_path = "{d}/nri/plugins"
    plugin_config_path = "{d}/nri/conf.d"
    plugin_registration_timeout = "{5 * self.nri_time_scale:g}s"
    plugin_request_timeout = "{2 * self.nri_time_scale:g}s"
"""

    def _disabled(self) -> str:
        return ", ".join(f'"{p}"' for p in (
            "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"))

    def _config_head(self, title: str, version: int, *subdirs: str) -> str:
        """What both formats start with (the lab's directories made, ``subdirs`` too): the config ``version``, root
        and state, the disabled plugins, the socket, no metrics, a patient shim reload, and the ``[plugins]`` table
        opened."""
        d = self.dir
        for sub in ("root", "state", "opt", "cni/bin", "cni/net.d", *subdirs):
            (d / sub).mkdir(parents=True, exist_ok=True)
        return f"""# {title}
version = {version}
root = "{d}/root"
state = "{d}/state"
disabled_plugins = [{self._disabled()}]

[grpc]
  address = "{self.socket}"

[metrics]
  address = ""

# containerd gives a shim 5 s to answer when it reloads its tasks at start; one slower than that (a loaded test
# machine: two VMs beside the suite) is taken for dead and its container killed (containerd/containerd#3378), which
# the tests' containerd restarts must not see
[timeouts]
  "io.containerd.timeout.shim.load" = "60s"

[plugins]
"""

    def _cni_dirs(self) -> tuple[str, str]:
        """(bin dir, conf dir) for containerd's CNI: Debian's plugins and the lab's conflist with a network,
        empty directories of the lab's without."""
        d = self.dir
        if self.network is not None:
            return str(self.network.plugins), f"{d}/cni/net.d"
        return f"{d}/cni/bin", f"{d}/cni/net.d"

    def _registry_config(self, table: str) -> str:
        """The registry section (hosts directories with one ``_default`` entry: the mirror) under ``table``."""
        if self.mirror is None:
            return ""
        hosts = self.dir / "certs.d"
        (hosts / "_default").mkdir(parents=True, exist_ok=True)
        (hosts / "_default/hosts.toml").write_text(
            f'[host."http://{self.mirror}"]\n  capabilities = ["pull", "resolve"]\n')
        return f"""    [{table}.registry]
      config_path = "{hosts}"
"""

    def _config_v3(self) -> str:
        """containerd 2.x's format: the same settings as ``_config_v2``, in the split CRI plugins; CDI looks only in
        the lab's own directory."""
        d = self.dir
        rt, img = "plugins.'io.containerd.cri.v1.runtime'", "plugins.'io.containerd.cri.v1.images'"
        return self._config_head("numapin containerd lab (containerd 2.x)", 3, "cdi") + f"""  [{img}]
    snapshotter = "overlayfs"
    [{img}.pinned_images]
      sandbox = "{PAUSE_IMAGE}"
{self._registry_config(img)}  [{rt}]
    disable_apparmor = true
    restrict_oom_score_adj = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = ["{d}/cdi"]
    [{rt}.cni]
      bin_dirs = ["{self._cni_dirs()[0]}"]
      conf_dir = "{self._cni_dirs()[1]}"
    [{rt}.containerd]
      default_runtime_name = "runc"
      [{rt}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [{rt}.containerd.runtimes.runc.options]
          SystemdCgroup = {"true" if self.systemd_cgroup else "false"}
          Root = "{d}/state/runc"
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  [plugins.'io.containerd.internal.v1.opt']
    path = "{d}/opt"
"""

    def _config_v2(self) -> str:
        """containerd 1.6's and 1.7's format."""
        d = self.dir
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return self._config_head("numapin containerd lab", 2) + f"""  [{cri}]
    sandbox_image = "{PAUSE_IMAGE}"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    disable_apparmor = true
    restrict_oom_score_adj = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    netns_mounts_under_state_dir = true
    [{cri}.cni]
      bin_dir = "{self._cni_dirs()[0]}"
      conf_dir = "{self._cni_dirs()[1]}"
    [{cri}.containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [{cri}.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [{cri}.containerd.runtimes.runc.options]
          SystemdCgroup = {"true" if self.systemd_cgroup else "false"}
          Root = "{d}/state/runc"
{self._registry_config(cri)}  [plugins."io.containerd.internal.v1.opt"]
    path = "{d}/opt"
"""

    def _ctr(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.exe("ctr"), "--address", self.socket, *args], capture_output=True, text=True,
                              check=check, timeout=timeout, env=self.env)

    def start(self) -> ContainerdLab:
        self.check_prerequisites(self.bin_dir)
        if self.dir.exists() and any(self.dir.iterdir()) and not (self.dir / MARKER).exists():
            raise LabError(f"{self.dir} is not empty and not a containerd lab directory")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / MARKER).touch()
        ledger.note("lab", str(self.dir))
        self.version = containerd_version(self.bin_dir)
        if self.cni and self.network is None:
            self.network = CniNetwork.create(self.dir)
        self._write_config()
        if self.network is not None:
            (self.dir / "cni/net.d/10-numapin-lab.conflist").write_text(self.network.conflist(self.dir / "cni/ipam"))
        image = self.dir / "images.tar"
        if not image.exists():
            build_image_archive(image, _busybox())
        self.start_containerd()
        self._ctr("-n", "k8s.io", "images", "import", str(image), timeout=60)
        tags = self._ctr("-n", "k8s.io", "images", "ls", "-q").stdout.split()
        if BUSYBOX_IMAGE not in tags or PAUSE_IMAGE not in tags:
            raise LabError(f"image import failed: {tags}")
        return self

    def start_containerd(self) -> None:
        """Start (or restart) only the containerd daemon; running containers keep running in their shims."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        log = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        try:
            nice = ["nice", "-n", str(self.niceness)] if self.niceness else []
            self.proc = subprocess.Popen([*nice, self.exe("containerd"), "--config", str(self.config)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                         env=self.env)
        finally:
            log.close()
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabError(f"containerd exited ({self.proc.returncode}): {self._log_tail()}")
            if os.path.exists(self.socket) and self._answers():
                break
            time.sleep(0.05)
        else:
            raise LabError(f"containerd did not answer within {START_SECONDS} s: {self._log_tail()}")
        while self.nri and not os.path.exists(self.nri_socket):
            if time.monotonic() > deadline:
                raise LabError(f"containerd's NRI socket {self.nri_socket} did not appear: {self._log_tail()}")
            time.sleep(0.05)
        plugins = self._ctr("plugins", "ls").stdout
        if not any(line.split()[:2] == ["io.containerd.grpc.v1", "cri"] and line.split()[-1] == "ok"
                   for line in plugins.splitlines() if line.strip()):
            raise LabError(f"containerd's CRI plugin is not ok: {self._log_tail()}")

    def _answers(self) -> bool:
        """Whether containerd answers ``ctr version`` (a ctr that does not finish in 10 s, as on a starved machine or
        under emulation, is asked again rather than failing the start)."""
        try:
            return self._ctr("version", check=False, timeout=10).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def stop_containerd(self, sig: int = signal.SIGTERM) -> None:
        """Stop only the daemon (SIGTERM, or SIGKILL with ``sig``); containers keep running."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return ""

    # -- tear-down ------------------------------------------------------------------------------------
    def _shim_pids(self) -> list[int]:
        return [pid for pid, _ in self._shims()]

    def _shims(self) -> list[tuple[int, str]]:
        """(pid, container id) of every shim of this lab (found by ``-address <its socket>``, alive or not)."""
        out = []
        needle = f"-address\0{self.socket}\0".encode()
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                cmd = (p / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmd and needle in cmd:
                args = cmd.split(b"\0")
                cid = args[args.index(b"-id") + 1].decode() if b"-id" in args[:-1] else ""
                out.append((int(p.name), cid))
        return out

    def _shim_socket(self, container_id: str) -> Path:
        return shim_socket(self.socket, container_id)

    def _container_pids(self, shims: list[tuple[int, str]]) -> list[tuple[int, str]]:
        """(pid, the shim's container id) of the processes the shims run (the containers' init processes), as the
        kernel says (``PPid``)."""
        parents = dict(shims)
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                status = (p / "status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("PPid:"):
                    if int(line.split()[1]) in parents:
                        out.append((int(p.name), parents[int(line.split()[1])]))
                    break
        return out

    async def remove_all_pods(self) -> None:
        """Leave containerd empty as kubelet would: every sandbox stopped and removed (its containers with it) and
        its pod's cgroup removed, whoever ran it."""
        from .client import CRIClient

        known = await asyncio.to_thread(self._sandboxes)
        async with CRIClient(self.socket) as direct:
            for sb in await direct.list_pod_sandbox():
                await direct.stop_pod_sandbox(sb.id)
                await direct.remove_pod_sandbox(sb.id, cgroup_parent=known.get(sb.id))

    def _sandboxes(self) -> dict[str, str | None]:
        """Every container containerd knows -> its pod's cgroup (None but for sandboxes)."""
        out: dict[str, str | None] = {}
        listing = self._ctr("-n", NAMESPACE, "containers", "ls", check=False).stdout.splitlines()[1:]
        for line in listing:
            fields = line.split()
            if not fields:
                continue
            out[fields[0]] = None
            if len(fields) >= 2 and fields[1] == PAUSE_IMAGE:
                info = self._ctr("-n", NAMESPACE, "containers", "info", fields[0], check=False).stdout
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    out[fields[0]] = _pod_cgroup(json.loads(info)["Spec"]["linux"]["cgroupsPath"], fields[0])
        return out

    def stop(self) -> None:
        """Kill every container, stop containerd, unmount, delete the lab directory, remove the pods' cgroups and
        the shims' sockets."""
        shims = self._shims()
        ids = {cid for _, cid in shims if cid}
        for pid, sandbox_id in self._container_pids(shims):  # a sandbox's pause process: <pod cgroup>/<sandbox id>
            pod = _pod_cgroup(cgroup_of_pid(KernelRoots(), pid) or "", sandbox_id)
            if pod:
                self.pod_cgroups.add(pod)
        if self.proc is not None and self.proc.poll() is None:
            known = self._sandboxes()
            ids |= set(known)
            self.pod_cgroups |= {c for c in known.values() if c}
            for task in self._ctr("-n", NAMESPACE, "tasks", "ls", "-q", check=False).stdout.split():
                self._ctr("-n", NAMESPACE, "tasks", "kill", "-a", "-s", "SIGKILL", task, check=False)
            for task in self._ctr("-n", NAMESPACE, "tasks", "ls", "-q", check=False).stdout.split():
                for _ in range(25):
                    if self._ctr("-n", NAMESPACE, "tasks", "delete", "-f", task, check=False).returncode == 0:
                        break
                    time.sleep(0.2)
            for c in self._ctr("-n", NAMESPACE, "containers", "ls", "-q", check=False).stdout.split():
                self._ctr("-n", NAMESPACE, "containers", "delete", c, check=False)
        self.stop_containerd()
        for pid, _ in self._shims():  # shims containerd could not shut down
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for cgroup in self.pod_cgroups:  # what still runs in the lab's pods (a container whose shim went): killed
            for pid in processes_in(cgroup):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for cid in ids:  # a killed shim leaves its socket
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._shim_socket(cid))
        prefix = str(self.dir) + "/"
        with open("/proc/mounts") as f:
            mounts = [line.split()[1] for line in f]
        for m in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
            subprocess.run(["umount", "-l", m], check=False, capture_output=True)
        if (self.dir / MARKER).exists():
            shutil.rmtree(self.dir, ignore_errors=True)
        for p in (self.socket, self.socket + ".ttrpc", self.nri_socket):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
        for cgroup in sorted(self.pod_cgroups):
            remove_cgroup(cgroup)
        if self.network is not None:
            self.network.remove()

    def leftovers(self) -> list[str]:
        """What ``stop()`` should have removed but did not (for the clean-up test)."""
        out = [f"shim pid {p}" for p in self._shim_pids()]
        with open("/proc/mounts") as f:
            out += [f"mount {line.split()[1]}" for line in f if line.split()[1].startswith(str(self.dir) + "/")]
        out += [f"path {p}" for p in (self.socket, self.socket + ".ttrpc", str(self.dir)) if os.path.exists(p)]
        if self.proc is not None and self.proc.poll() is None:
            out.append(f"containerd pid {self.proc.pid}")
        out += [f"cgroup {d}" for c in sorted(self.pod_cgroups) for d in existing_cgroup_dirs(c)]
        if self.network is not None and bridge_exists(self.network.bridge):
            out.append(f"link {self.network.bridge}")
        return out

    def __enter__(self) -> ContainerdLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def shim_socket(address: str, container_id: str, namespace: str = NAMESPACE) -> Path:
    """A shim's socket: containerd-shim-runc-v2 names it by the sha256 of ``<address>/<namespace>/<id>``."""
    return SHIM_SOCKETS / hashlib.sha256(os.path.join(address, namespace, container_id).encode()).hexdigest()


def _pod_cgroup(sandbox_cgroup: str, sandbox_id: str) -> str | None:
    """The pod's cgroup from its sandbox container's (cgroupfs ``<cgroup_parent>/<sandbox id>``; the sandbox's own
    when it has no parent); None unless the path is that of this sandbox (the lab removes nothing else)."""
    path = sandbox_cgroup.rstrip("/")
    if not sandbox_id or os.path.basename(path) != sandbox_id:
        return None
    parent = os.path.dirname(path)
    return parent if parent.strip("/") else path


@contextlib.contextmanager
def scratch_lab(prefix: str, bin_dir: Path | None = None, *, nri: bool = False,
                cni: bool = False, mirror: str | None = None, niceness: int = 0) -> Iterator[ContainerdLab]:
    """A started lab in a new directory ``/tmp/<prefix>*`` (short: unix socket paths), stopped and the directory
    removed afterwards; ``bin_dir``, ``nri``, ``cni``, ``mirror`` and ``niceness`` as for ``ContainerdLab``."""
    d = ledger.scratch_dir(prefix)
    try:
        with ContainerdLab(d / "ctrd", bin_dir, nri=nri, cni=cni, mirror=mirror, niceness=niceness) as lab:
            yield lab
    finally:
        shutil.rmtree(d, ignore_errors=True)
