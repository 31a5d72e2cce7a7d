"""A multi-NUMA VM whose PID 1 is systemd (this machine's ``/lib/systemd/systemd``) on pure cgroup v2, running one
command as a run-once unit: the node shape of kubeadm's default (systemd cgroup driver), where systemd owns the
cgroups of pods and containers.

numa-lab's ``numa-vm.sh`` runs its command under a busybox init; it cannot hand PID 1 to systemd. This module
reuses its pieces and boots QEMU itself:

* numa-lab's cached kernel (``vmlinux-<kver>``, booted through PVH) and initramfs (its stage 1 mounts the host's
  root over 9p under a tmpfs overlay and the per-run share at ``/mnt/numa-lab``, then ``switch_root``s to the
  ``/init2`` it carries), with a second cpio archive appended whose ``/init2`` replaces numa-lab's stage 2 (the
  kernel unpacks concatenated archives in order, later files replacing earlier ones). That ``init2`` mounts the
  extra shares and a tmpfs on ``/var/lib/containerd``, installs this run's unit files and ``exec``\\ s systemd;
* numa-vm.sh's ``qemu-args`` for the topology (the same ``-smp``/``-numa`` flags as every other shape);
* the kernel command line ``systemd.unified_cgroup_hierarchy=1 systemd.unit=numalab.target``: systemd starts only
  that target's tree, ``numalab-run.service`` (no default dependencies), which runs the command with stdout and
  stderr on two virtio-serial ports, reports ``start``/``exit`` (with PID 1's name) on a third, writes the exit
  code to the share and powers the VM off.

Honest failures: a boot whose command has not started within ``boot_timeout`` seconds is killed and booted again
(``boot_retries``), its console kept as ``boot-hang-*.console.log`` in the runs directory; a run longer than
``timeout`` is killed (124); a VM that ends without an exit code is 125 with QEMU's log and the console's tail on
stderr; the run directory (console, QEMU log, the share) is kept whenever the result is not the command's own.
A guest where PID 1 is not systemd fails with GUEST_NOT_SYSTEMD rather than running the command.

``run_in_systemd_vm`` has ``numapin_lab.numa_vm.run_in_vm``'s signature and result; ``run_vm`` runs a
``VMSpec`` with either (``init="systemd"`` here), so tests/numa's harness boots this shape like the others.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from numapin_lab.numa_vm import (
    GUEST_STALLED,
    HPET_PRELUDE,
    VM_FAILURE,
    VM_TIMEOUT,
    VMError,
    VMResult,
    VMSpec,
    find_numa_vm,
    reap,
    run_in_vm,
    topology_spec,
    with_parent_death_signal,
)

__all__ = ["GUEST_NOT_SYSTEMD", "THREAD_PREFIX", "LabAssets", "find_assets", "qemu_argv", "run_in_systemd_vm", "run_vm",
           "systemd_initramfs"]

GUEST_NOT_SYSTEMD = 127  # the command did not run: PID 1 in the guest was not systemd
# the names of the threads a boot runs beside QEMU (and of tests/numa/boots.py's boot lanes): a test that counts a
# process's threads can tell a VM booting in the background from its own
THREAD_PREFIX = "numapin-vm"
TARGET = "numalab.target"
SERVICE = "numalab-run.service"
CACHE_ENV = "NUMAPIN_SYSTEMD_VM_CACHE"
_KVER = re.compile(r"^initramfs-(.+)-[0-9a-f]{12}\.cpio\.gz$")

# PID 1 after numa-lab's stage 1 switch_root (busybox sh): shares, tmpfs, units, then systemd
INIT2 = r"""#!/.numa-lab/busybox sh
BB=/.numa-lab/busybox
SHARE=/mnt/numa-lab
fail() {
  echo "numapin systemd-vm init: FATAL: $*" > /dev/console
  $BB poweroff -f; $BB sleep 5; echo o > /proc/sysrq-trigger
}
$BB mount -t proc proc /proc
if [ -f $SHARE/mounts ]; then
  while read -r tag path; do
    $BB mkdir -p "$path" && $BB mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none "$tag" "$path" \
      || fail "cannot mount share $tag at $path"
  done < $SHARE/mounts
fi
$BB mkdir -p /var/lib/containerd /etc/systemd/system
$BB mount -t tmpfs -o mode=711 tmpfs /var/lib/containerd || fail "tmpfs on /var/lib/containerd"
$BB cp $SHARE/units/* /etc/systemd/system/ || fail "cannot install the unit files"
# no generators (fstab, getty, sysv, gpt-auto, ...: nothing of this guest's): each daemon-reload runs them all over
# 9p, which took it 15-20 s under emulation
$BB mkdir -p /etc/systemd/system-generators
for g in /lib/systemd/system-generators/* /usr/lib/systemd/system-generators/*; do
  [ -e "$g" ] && $BB ln -sf /dev/null /etc/systemd/system-generators/${g##*/}
done
$BB hostname numa-lab
# the host's root is a container's (/.dockerenv): systemd would take itself for a container's init and ignore the
# kernel command line (the unit, the cgroup layout); the host's /run must not show either
$BB rm -f /.dockerenv /run/.containerenv
$BB mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs /run || fail "tmpfs on /run"
$BB umount /proc
[ -x /lib/systemd/systemd ] || fail "/lib/systemd/systemd is not in the guest's root"
exec /lib/systemd/systemd --unit=__TARGET__
fail "exec /lib/systemd/systemd failed"
"""

# numalab-run.service's ExecStart: the ports, PID 1's check, the command, the exit code, power off
RUNNER = r"""#!/bin/bash
SHARE=/mnt/numa-lab
BB=/.numa-lab/busybox
OUT=/dev/console ERR=/dev/console CTL=
for d in /sys/class/virtio-ports/vport*; do
  case $(cat $d/name 2>/dev/null) in
    numalab.out) OUT=/dev/${d##*/} ;;
    numalab.err) ERR=/dev/${d##*/} ;;
    numalab.ctl) CTL=/dev/${d##*/} ;;
  esac
done
ctl() { [ -n "$CTL" ] && echo "$*" > "$CTL"; }
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root USER=root LOGNAME=root SHELL=/bin/bash
[ -f $SHARE/env ] && . $SHARE/env
pid1=$(cat /proc/1/comm)
read up _ < /proc/uptime
ctl "start $up $pid1"
if [ "$pid1" = systemd ]; then
  /bin/bash $SHARE/cmd < /dev/null > "$OUT" 2> "$ERR"
  rc=$?
else
  echo "numapin systemd-vm: PID 1 is $pid1, not systemd" > "$ERR"
  rc=__NOT_SYSTEMD__
fi
read up _ < /proc/uptime
echo $rc > $SHARE/exitcode
ctl "exit $rc $up"
sync
$BB poweroff -f
"""

UNITS = {
    TARGET: f"""[Unit]
Description=numa-lab: run one command under systemd
Requires={SERVICE}
AllowIsolate=yes
""",
    SERVICE: """[Unit]
Description=numa-lab: the command
DefaultDependencies=no

[Service]
Type=oneshot
ExecStart=/bin/bash /mnt/numa-lab/runner
StandardInput=null
StandardOutput=null
StandardError=inherit
TimeoutStartSec=infinity
""",
}


class LabAssets:
    """numa-lab's cached kernel and initramfs, and the kernel release they are for."""

    def __init__(self, kernel: Path, initramfs: Path, kver: str) -> None:
        self.kernel, self.initramfs, self.kver = kernel, initramfs, kver


def _lab_cache() -> Path:
    return Path(os.environ.get("NUMA_VM_CACHE", "/var/cache/numa-lab"))


def find_assets(numa_vm: Path) -> LabAssets:
    """numa-lab's newest cached initramfs (``numa-vm.sh build`` makes one when there is none) and the kernel of its
    release (the cached uncompressed ``vmlinux``, else ``/boot/vmlinuz-<kver>``)."""
    cache = _lab_cache()
    found = sorted(cache.glob("initramfs-*.cpio.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        built = subprocess.run([str(numa_vm), "build"], capture_output=True, text=True, check=False)
        if built.returncode != 0:
            raise VMError(f"numa-vm.sh build failed ({built.returncode}): {built.stderr.strip()[-500:]}")
        found = [Path(built.stdout.strip().splitlines()[-1])]
    initramfs = found[-1]
    m = _KVER.match(initramfs.name)
    if not m:
        raise VMError(f"{initramfs}: not a numa-lab initramfs name (initramfs-<kver>-<hash>.cpio.gz)")
    kver = m.group(1)
    for kernel in (cache / f"vmlinux-{kver}", Path(f"/boot/vmlinuz-{kver}")):
        if kernel.is_file():
            return LabAssets(kernel, initramfs, kver)
    raise VMError(f"no kernel for {kver} (looked for {cache}/vmlinux-{kver} and /boot/vmlinuz-{kver})")


def _newc(entries: Sequence[tuple[str, int, bytes]]) -> bytes:
    """A cpio archive (the kernel's ``newc`` format) of regular files ``(name, mode, content)``."""
    out = bytearray()

    def member(name: str, mode: int, data: bytes, ino: int) -> None:
        raw = name.encode() + b"\0"
        fields = (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(raw), 0)
        out.extend(b"070701" + b"".join(b"%08X" % f for f in fields) + raw)
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))

    for i, (name, mode, data) in enumerate(entries, start=1):
        member(name, 0o100000 | mode, data, i)
    member("TRAILER!!!", 0, b"", 0)
    return bytes(out)


def systemd_initramfs(assets: LabAssets, cache: Path) -> Path:
    """numa-lab's initramfs with ``/init2`` replaced by INIT2 (built once per content, in ``cache``)."""
    base = assets.initramfs.read_bytes()
    init2 = INIT2.replace("__TARGET__", TARGET)
    extra = gzip.compress(_newc([("init2", 0o755, init2.encode())]), compresslevel=1, mtime=0)
    digest = hashlib.sha256(base + extra).hexdigest()[:12]
    out = cache / f"initramfs-systemd-{assets.kver}-{digest}.cpio.gz"
    if not out.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(base + extra)
        tmp.replace(out)
    return out


def _accel() -> tuple[list[str], str]:
    """numa-vm.sh's choice: hardware KVM only (not kvm_pvm), else TCG with ``$NUMA_VM_TCG_THREAD`` (single)."""
    accel = os.environ.get("NUMA_VM_ACCEL", "auto")
    if accel == "auto":
        hw = os.access("/dev/kvm", os.W_OK) and any(Path(f"/sys/module/{m}").is_dir() for m in ("kvm_intel",
                                                                                            "kvm_amd"))
        accel = "kvm" if hw and not Path("/sys/module/kvm_pvm").is_dir() else "tcg"
    if accel == "kvm":
        return ["-accel", "kvm"], "host,-arch-capabilities"
    thread = os.environ.get("NUMA_VM_TCG_THREAD", "single")
    if thread not in ("single", "multi"):
        raise VMError(f"$NUMA_VM_TCG_THREAD={thread!r}: expected single or multi")
    return ["-accel", f"tcg,thread={thread},tb-size=512"], "max,vendor=GenuineIntel"


def topology_args(numa_vm: Path, spec: VMSpec) -> list[str]:
    """numa-vm.sh's QEMU ``-smp``/``-m``/``-numa`` flags for the spec's topology and memory per node."""
    topology_spec(spec.topology)
    env = {**os.environ, **({"MEM_PER_NODE_MB": str(spec.mem_per_node_mib)} if spec.mem_per_node_mib else {})}
    got = subprocess.run([str(numa_vm), "qemu-args", "--topology", spec.topology], capture_output=True, text=True,
                         env=env, check=False)
    if got.returncode != 0 or not got.stdout.strip():
        raise VMError(f"numa-vm.sh qemu-args --topology {spec.topology} failed: {got.stderr.strip()[-500:]}")
    return shlex.split(got.stdout)


def qemu_argv(numa_vm: Path, spec: VMSpec, run: Path, initramfs: Path, kernel: Path) -> list[str]:
    accel, cpu = _accel()
    share = run / "share"
    argv = [os.environ.get("QEMU", "qemu-system-x86_64"), "-name", "numapin-systemd-vm", "-nodefaults",
            "-no-user-config", "-display", "none", "-no-reboot", "-machine", "q35,i8042=off", *accel, "-cpu", cpu,
            *topology_args(numa_vm, spec), "-kernel", str(kernel), "-initrd", str(initramfs),
            "-append", "console=ttyS0 loglevel=4 panic=-1 rdinit=/init mitigations=off tsc=reliable "
                       "numalab.ovlsize=50% systemd.unified_cgroup_hierarchy=1 "
                       f"systemd.unit={TARGET} systemd.show_status=1 systemd.log_target=console"
                       + (f" {spec.kernel_args}" if spec.kernel_args else ""),
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={share},mount_tag=numalab,security_model=none,multidevs=remap"]
    for i, d in enumerate(spec.shares):
        argv += ["-virtfs", f"local,path={d},mount_tag=rw{i},security_model=none,multidevs=remap"]
    argv += ["-chardev", f"file,id=con,path={run}/console.log", "-serial", "chardev:con",
             "-monitor", f"unix:{run}/monitor.sock,server=on,wait=off",
             "-device", "virtio-serial-pci,id=vser0,ioeventfd=off"]
    for port in ("out", "err", "ctl"):
        argv += ["-chardev", f"file,id={port},path={run}/{port}",
                 "-device", f"virtserialport,bus=vser0.0,chardev={port},name=numalab.{port}"]
    return [*argv, *spec.qemu_args]


def _write_share(spec: VMSpec, share: Path, command: Sequence[str], cwd: str | None) -> None:
    (share / "units").mkdir(parents=True)
    for name, text in UNITS.items():
        (share / "units" / name).write_text(text)
    (share / "runner").write_text(RUNNER.replace("__NOT_SYSTEMD__", str(GUEST_NOT_SYSTEMD)))
    if spec.hpet_clock:
        command = ["/bin/sh", "-c", HPET_PRELUDE, "numapin-vm", *command]
    (share / "cmd").write_text(f"#!/bin/bash\ncd -- {shlex.quote(cwd or os.getcwd())} 2>/dev/null || cd /\n"
                               f"exec {shlex.join(command)}\n")
    (share / "env").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in spec.env.items()))
    (share / "mounts").write_text("".join(f"rw{i} {d}\n" for i, d in enumerate(spec.shares)))


class _Tail(threading.Thread):
    """Copies what QEMU appends to a chardev file to ``sink`` (an IO, a file descriptor, or None: ours)."""

    def __init__(self, path: Path, sink: IO[bytes] | int | None, fallback: int) -> None:
        super().__init__(daemon=True, name=f"{THREAD_PREFIX}-tail-{path.name}")
        self.path, self.sink, self.fallback = path, sink, fallback
        self.done = threading.Event()

    def _write(self, data: bytes) -> None:
        if isinstance(self.sink, int):
            os.write(self.sink, data)
        elif self.sink is None:
            os.write(self.fallback, data)
        else:
            self.sink.write(data)
            self.sink.flush()

    def run(self) -> None:
        pos = 0
        while True:
            finished = self.done.is_set()
            with contextlib.suppress(OSError), open(self.path, "rb") as f:
                f.seek(pos)
                data = f.read()
                if data:
                    pos += len(data)
                    self._write(data)
            if finished:
                return
            self.done.wait(0.3)


def _ctl(run: Path) -> list[str]:
    try:
        return (run / "ctl").read_text(errors="replace").splitlines()
    except OSError:
        return []


def _stop_qemu(proc: subprocess.Popen[bytes]) -> float:
    """Stop QEMU (SIGTERM, then SIGKILL after 10 s); the CPU seconds it used."""
    if proc.returncode is not None:
        return 0.0
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    used = reap(proc, 10.0)
    if used is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        used = reap(proc, None)
    return used or 0.0


def _say(msg: str, stderr: IO[bytes] | int | None) -> None:
    data = f"numapin systemd-vm: {msg}\n".encode()
    if isinstance(stderr, int):
        os.write(stderr, data)
    elif stderr is None:
        sys.stderr.write(data.decode())
        sys.stderr.flush()
    else:
        stderr.write(data)
        stderr.flush()


def _boot(argv: list[str], run: Path, spec: VMSpec, stdout: IO[bytes] | int | None, stderr: IO[bytes] | int | None,
          stalled: Callable[[], str | None] | None, on_stall: Callable[[str], str] | None,
          environ: Mapping[str, str] | None) -> tuple[str, int | None, str, float]:
    """One QEMU run: ("hung" | "timeout" | "stalled" | "ended", QEMU's return code, why stalled, QEMU's CPU
    seconds). Safe in a thread beside other children: no Python runs between fork and exec (the parent-death
    signal through setpriv), and the CPU counted is QEMU's own (wait4)."""
    for f in ("out", "err", "ctl", "console.log", "qemu.log"):
        (run / f).unlink(missing_ok=True)
    (run / "share" / "exitcode").unlink(missing_ok=True)
    tails = [_Tail(run / "out", stdout, 1), _Tail(run / "err", stderr, 2)]
    for t in tails:
        t.start()
    t0 = time.monotonic()
    with open(run / "qemu.log", "wb") as qlog:
        proc = subprocess.Popen(with_parent_death_signal(argv), stdin=subprocess.DEVNULL, stdout=qlog,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=None if environ is None else dict(environ))
    outcome, why, cpu = "ended", "", 0.0
    try:
        while True:
            used = reap(proc, 1.0)
            if used is not None:
                cpu += used
                break
            elapsed = time.monotonic() - t0
            started = any(line.startswith("start ") for line in _ctl(run))
            if not started and elapsed > spec.boot_timeout:
                outcome = "hung"
            elif elapsed > spec.timeout:
                outcome = "timeout"
            elif started and stalled is not None and int(elapsed) % 5 == 0 and (why := stalled() or ""):
                outcome = "stalled"
                if on_stall is not None:
                    why += on_stall(why)
            if outcome != "ended":
                cpu += _stop_qemu(proc)
                break
    except BaseException:
        _stop_qemu(proc)
        raise
    finally:
        for t in tails:
            t.done.set()
        for t in tails:
            t.join(timeout=10)
    return outcome, proc.returncode, why, cpu


def run_in_systemd_vm(spec: VMSpec, command: Sequence[str], *, stdout: IO[bytes] | int | None = None,
                      stderr: IO[bytes] | int | None = None, attempts: int = 2, cwd: str | None = None,
                      stalled: Callable[[], str | None] | None = None,
                      on_stall: Callable[[str], str] | None = None, runs_dir: Path | None = None,
                      environ: Mapping[str, str] | None = None) -> VMResult:
    """``command`` as the run-once unit of a VM whose PID 1 is systemd; otherwise as ``numa_vm.run_in_vm``. The
    spec's ``cgroup`` must be v2 (systemd 252 on cgroup v1 is not this shape)."""
    if spec.cgroup != "v2":
        raise VMError(f"a systemd guest runs pure cgroup v2 (spec says {spec.cgroup!r})")
    if stderr == subprocess.STDOUT:
        stderr = stdout
    numa_vm = find_numa_vm()
    assets = find_assets(numa_vm)
    cache = Path(os.environ.get(CACHE_ENV, "/var/tmp/numapin-systemd-vm"))
    initramfs = systemd_initramfs(assets, cache)
    runs = runs_dir or Path(os.environ.get("NUMA_VM_RUNS", "/tmp/numa-lab-runs"))
    runs.mkdir(parents=True, exist_ok=True)
    run = Path(tempfile.mkdtemp(prefix="systemd-run.", dir=runs))
    _write_share(spec, run / "share", command, cwd)
    argv = qemu_argv(numa_vm, spec, run, initramfs, assets.kernel)
    (run / "qemu-cmdline").write_text(shlex.join(argv) + "\n")
    t0, cpu = time.monotonic(), 0.0
    boots, rc, stall = 0, VM_FAILURE, ""
    keep = False
    try:
        for _ in range(max(1, attempts)):
            for _hang in range(spec.boot_retries + 1):
                boots += 1
                outcome, qrc, stall, used = _boot(argv, run, spec, stdout, stderr, stalled, on_stall, environ)
                cpu += used
                if outcome != "hung":
                    break
                kept = runs / f"boot-hang-{time.strftime('%Y%m%d-%H%M%S')}-{boots}.console.log"
                with contextlib.suppress(OSError):
                    shutil.copy(run / "console.log", kept)
                _say(f"the command had not started after {spec.boot_timeout} s (boot hang; console kept as "
                     f"{kept})", stderr)
            exitcode = run / "share" / "exitcode"
            if outcome == "stalled":
                rc = GUEST_STALLED
            elif exitcode.is_file():
                rc = int(exitcode.read_text().strip() or VM_FAILURE)
            elif outcome == "timeout":
                rc = VM_TIMEOUT
                _say(f"timeout after {spec.timeout} s; VM killed; console: {run}/console.log", stderr)
            else:
                rc = VM_FAILURE
                con = (run / "console.log").read_text(errors="replace").splitlines()[-25:] \
                    if (run / "console.log").is_file() else []
                qlog = (run / "qemu.log").read_text(errors="replace") if (run / "qemu.log").is_file() else ""
                _say(f"VM ended without an exit code ({'hung at boot' if outcome == 'hung' else f'qemu rc={qrc}'})"
                     f"; qemu log:\n{qlog}\nlast console lines:\n" + "\n".join(con), stderr)
            if rc != VM_FAILURE:
                break
        keep = rc in (VM_FAILURE, VM_TIMEOUT, GUEST_STALLED, GUEST_NOT_SYSTEMD)
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            _say(f"run directory kept: {run}", stderr)
        else:
            shutil.rmtree(run, ignore_errors=True)
    return VMResult(rc, boots, time.monotonic() - t0, cpu, stall)


def run_vm(spec: VMSpec, command: Sequence[str], **kwargs: Any) -> VMResult:
    """``run_in_systemd_vm`` for ``VMSpec(init="systemd")``, numa-vm.sh's ``run_in_vm`` otherwise (same keywords)."""
    runner = run_in_systemd_vm if spec.init == "systemd" else run_in_vm
    return runner(spec, command, **kwargs)
