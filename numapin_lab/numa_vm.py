"""Running a command inside a throw-away multi-NUMA virtual machine: numa-lab's ``numa-vm.sh`` boots this
machine's Debian kernel in QEMU with a chosen socket/core/thread/NUMA-node topology (real ACPI SRAT/SLIT, so
sysfs, cpusets and memory policy are the kernel's own), with this machine's root filesystem read-only under a
throw-away overlay: the virtualenv and the source tree are at the same paths in the guest.

Used by the multi-NUMA end-to-end tests (tests/numa) and ``numapin demo --topology``. ``numa-vm.sh`` is found at
``$NUMAPIN_NUMA_VM``, else ``../shared/numa-lab/numa-vm.sh`` next to the source tree, else
``/work/shared/numa-lab/numa-vm.sh``; its Debian packages (qemu-system-x86, linux-image-amd64, busybox-static)
are installed by ``scripts/lib/setup.sh``.

Under software emulation (TCG) about one boot in 15-20 hangs in SMP bring-up: ``numa-vm.sh`` kills a boot that
has not reached the command within ``boot_timeout`` seconds and boots again; a VM that fails anyway (exit 125) is
booted once more here before the failure is reported.

The guest's clock: under TCG the guest kernel calibrates the TSC against the emulated PIT at boot, and on a
loaded host that calibration can come out wrong: one 2s4n boot's clock ran 2.8 times as fast as the host's, so
every timeout inside it (containerd's, ctr's, the tests') was 2.8 times shorter than written. The command
therefore runs with the guest's clocksource switched to the HPET (QEMU's, driven by the host's clock; a clock
read costs about 2 µs more than the TSC's under emulation), unless ``VMSpec.hpet_clock`` is False.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["VM_FAILURE", "VM_TIMEOUT", "VMError", "VMResult", "VMSpec", "find_numa_vm", "pci_device_args", "run_in_vm",
           "topology_spec"]

NUMA_VM_ENV = "NUMAPIN_NUMA_VM"
VM_FAILURE = 125  # numa-vm.sh: the VM failed (no exit code from the guest)
VM_TIMEOUT = 124
_SRC_ROOT = Path(__file__).resolve().parents[1]
_CANDIDATES = (_SRC_ROOT.parent / "shared/numa-lab/numa-vm.sh", Path("/work/shared/numa-lab/numa-vm.sh"))
_PRESETS = {"2s4n": "2s2c2t4n", "1s2n": "1s2c2t2n", "1s2n-nosmt": "1s4c1t2n", "2s2n": "2s2c2t2n",
            "1s1n": "1s2c2t1n"}
_SPEC = re.compile(r"^(\d+)s(\d+)c(\d+)t(\d+)n$")
# run first in the guest: the HPET as the clocksource when the kernel offers it, then the command
HPET_PRELUDE = ("cs=/sys/devices/system/clocksource/clocksource0; "
                "if grep -qw hpet $cs/available_clocksource 2>/dev/null; then echo hpet > $cs/current_clocksource; "
                "fi; exec \"$@\"")


class VMError(RuntimeError):
    """No VM could be run (numa-vm.sh missing, bad topology)."""


def find_numa_vm() -> Path:
    env = os.environ.get(NUMA_VM_ENV)
    candidates = (Path(env),) if env else _CANDIDATES
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise VMError(f"numa-vm.sh not found (looked at {', '.join(map(str, candidates))}); set ${NUMA_VM_ENV} "
                  f"to its path")


def topology_spec(topology: str) -> tuple[int, int, int, int]:
    """``(sockets, cores per socket, threads per core, NUMA nodes)`` of a numa-vm.sh preset or
    ``<S>s<C>c<T>t<N>n`` spec, with numa-vm.sh's rules (N a multiple of S, C a multiple of N/S)."""
    m = _SPEC.match(_PRESETS.get(topology, topology))
    if not m:
        raise VMError(f"topology {topology!r}: expected one of {', '.join(_PRESETS)} or <S>s<C>c<T>t<N>n "
                      f"(e.g. 2s4c1t8n)")
    s, c, t, n = (int(g) for g in m.groups())
    if min(s, c, t, n) < 1 or n % s or c % (n // s):
        raise VMError(f"topology {topology!r}: NUMA nodes must be a multiple of sockets and cores per socket a "
                      f"multiple of nodes per socket")
    return s, c, t, n


def pci_device_args(numa_node: int, *, bus_nr: int = 32, port_name: str = "numapin.dev") -> tuple[str, ...]:
    """QEMU arguments for a PCI device on NUMA node ``numa_node``: a PCIe expander bridge on that node, a root
    port behind it and a virtio-serial controller with one port named ``port_name``, whose character device
    (``/dev/vportNpM``) has the PCI device as its sysfs parent (``numa_node`` = ``numa_node``)."""
    return ("-device", f"pxb-pcie,id=numapin_pxb,bus_nr={bus_nr},numa_node={numa_node}",
            "-device", "pcie-root-port,id=numapin_rp,bus=numapin_pxb,chassis=9,slot=0",
            "-device", "virtio-serial-pci,id=numapin_vser,bus=numapin_rp",
            "-chardev", "null,id=numapin_null",
            "-device", f"virtserialport,bus=numapin_vser.0,chardev=numapin_null,name={port_name}")


@dataclass(frozen=True)
class VMSpec:
    topology: str = "2s4n"
    cgroup: str = "v1"                     # v1 (hybrid, like systemd's) or v2
    mem_per_node_mib: int | None = None    # default numa-vm.sh's (1024)
    qemu_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    shares: tuple[str, ...] = ()           # host directories mounted read-write at the same path
    timeout: int = 900                     # whole run, seconds
    boot_timeout: int = 60                 # a boot that has not reached the command by then is retried
    boot_retries: int = 2
    hpet_clock: bool = True                # the guest's clocksource switched to the HPET first (see above)
    init: str = "busybox"                  # PID 1: numa-vm.sh's busybox init, or "systemd" (numapin_lab.systemd_vm)
    kernel_args: str = ""                  # more of the guest kernel's command line (e.g. boot-time huge pages)

    def argv(self, numa_vm: Path, command: Sequence[str]) -> list[str]:
        topology_spec(self.topology)
        if self.cgroup not in ("v1", "v2"):
            raise VMError(f"cgroup {self.cgroup!r}: expected v1 or v2")
        out = [str(numa_vm), "run", "-q", "--topology", self.topology, "--cgroup", self.cgroup,
               "--timeout", str(self.timeout), "--boot-timeout", str(self.boot_timeout),
               "--boot-retries", str(self.boot_retries)]
        if self.mem_per_node_mib:
            out += ["--mem-per-node", str(self.mem_per_node_mib)]
        if self.kernel_args:
            out += ["--append", self.kernel_args]
        for a in self.qemu_args:
            out += ["--qemu-arg", a]
        for k, v in self.env.items():
            out += ["--env", f"{k}={v}"]
        for d in self.shares:
            out += ["--share", d]
        if self.hpet_clock:
            command = ["/bin/sh", "-c", HPET_PRELUDE, "numapin-vm", *command]
        return [*out, "--", *command]


def with_parent_death_signal(argv: list[str], signal_name: str = "TERM") -> list[str]:
    """``argv`` run so that it gets SIGTERM (or ``signal_name``) when the thread that started it dies (numa-vm.sh
    traps it and stops QEMU), so no VM outlives a killed test run: util-linux's ``setpriv --pdeathsig`` (always on
    Debian). Not a ``preexec_fn``: Python code run between fork and exec is unsafe in a process with other threads
    running (the boots run in a thread beside the other tests; a child crashed there with SIGSEGV before numa-vm.sh
    started)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", signal_name, "--", *argv] if setpriv else argv


GUEST_STALLED = 126  # run_in_vm's return code when ``stalled`` said the guest stopped making progress


@dataclass(frozen=True)
class VMResult:
    returncode: int     # the command's, or 124 (timeout), 125 (the VM failed), 126 (stalled), 130 (interrupted)
    boots: int          # how many times numa-vm.sh was started (1, or 2 after a failed VM)
    seconds: float
    cpu_seconds: float = 0.0   # CPU time of numa-vm.sh and QEMU (user + system): the work, whatever the host's load
    stall: str = ""     # why the VM was stopped as stalled (``stalled``'s answer)


class Heartbeat:
    """Whether a guest still lives, judged on the host from a file the guest rewrites every few seconds: stalled
    once the file was seen and has not changed for ``limit`` seconds of the host's clock (the guest's own clock
    and the file's timestamps are not trusted: under emulation they can run fast or stop)."""

    def __init__(self, path: Path, limit: float) -> None:
        self.path = path
        self.limit = limit
        self._seen: bytes | None = None
        self._since = 0.0

    def __call__(self, now: float | None = None) -> str | None:
        now = time.monotonic() if now is None else now
        try:
            content = self.path.read_bytes()
        except OSError:
            content = None
        if content is not None and content != self._seen:
            self._seen, self._since = content, now
            return None
        if self._seen is not None and now - self._since > self.limit:
            return f"the guest's heartbeat ({self.path.name}) stopped {now - self._since:.0f} s ago"
        return None


def run_in_vm(spec: VMSpec, command: Sequence[str], *, stdout: IO[bytes] | int | None = None,
              stderr: IO[bytes] | int | None = None, attempts: int = 2, cwd: str | None = None,
              stalled: Callable[[], str | None] | None = None,
              on_stall: Callable[[str], str] | None = None, runs_dir: Path | None = None,
              environ: Mapping[str, str] | None = None, check_every: float = 5.0) -> VMResult:
    """Run ``command`` in a VM of ``spec`` (in ``cwd``, the same path in the guest), its output to ``stdout`` /
    ``stderr`` (default: ours). A VM failure (125) is retried up to ``attempts`` runs in all. ``stalled`` (e.g. a
    ``Heartbeat``) is asked every ``check_every`` seconds; when it gives a reason the VM is stopped and the result is
    GUEST_STALLED with that reason (not retried here: the caller decides); ``on_stall`` (e.g. a post-mortem,
    numapin_lab.vm_postmortem) is called with it first, the VM still running, and what it returns is added to the
    reason; an exception raised by ``stalled`` (e.g. the caller cancelling) stops the VM and goes on. ``runs_dir``
    is numa-vm.sh's ``$NUMA_VM_RUNS`` (its run directory, with QEMU's monitor socket and the guest's console, goes
    there); ``environ`` is numa-vm.sh's environment (default: ours, as it is now). Ctrl-C stops the VM (numa-vm.sh
    kills QEMU) before the KeyboardInterrupt goes on; if this process (or the thread that called this) dies,
    numa-vm.sh gets SIGTERM and stops the VM too. Safe to call from a thread while the rest of the process runs
    other children: the CPU counted is numa-vm.sh's own process tree's (``wait4``)."""
    if not check_every > 0:  # 0 would ask the watchdog in a busy loop beside the tests
        raise ValueError(f"check_every must be a positive number of seconds, not {check_every!r}")
    if spec.init != "busybox":
        raise VMError(f"init {spec.init!r}: numa-vm.sh runs its busybox init (systemd as PID 1: "
                      f"numapin_lab.systemd_vm.run_in_systemd_vm, or numapin_lab.systemd_vm.run_vm for either)")
    argv = spec.argv(find_numa_vm(), command)
    t0 = time.monotonic()
    cpu = 0.0
    rc = VM_FAILURE
    boots = 0
    stall = ""
    env = dict(os.environ if environ is None else environ)
    if runs_dir is not None:
        env["NUMA_VM_RUNS"] = str(runs_dir)
    for _ in range(max(1, attempts)):
        boots += 1
        proc = subprocess.Popen(with_parent_death_signal(argv), stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=stderr, cwd=cwd, env=env, start_new_session=True)
        try:
            while True:
                used = reap(proc, check_every)
                if used is not None:
                    cpu += used
                    rc = proc.returncode
                    break
                why = stalled() if stalled is not None else None
                if why:
                    stall = why
                    if on_stall is not None:
                        stall += on_stall(why)
                    cpu += _stop(proc)
                    rc = GUEST_STALLED
                    break
        except BaseException:
            _stop(proc)
            raise
        if rc != VM_FAILURE:
            break
    return VMResult(rc, boots, time.monotonic() - t0, cpu, stall)


def _stop(proc: subprocess.Popen[bytes]) -> float:
    """Stop numa-vm.sh (it traps SIGTERM and stops QEMU), killing its group if it has not within 30 s; the CPU
    seconds its process tree used."""
    if proc.returncode is not None:
        return 0.0
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    used = reap(proc, 30.0)
    if used is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        used = reap(proc, None)
    return used or 0.0


def reap(proc: subprocess.Popen[bytes], timeout: float | None) -> float | None:
    """Wait up to ``timeout`` seconds (None: for ever) for ``proc`` to end; then set its returncode and return the
    CPU seconds (user + system) of it and the descendants it waited for (QEMU under numa-vm.sh); None while it
    runs. ``wait4`` on this one process: other children of the process ending meanwhile are not counted. The
    wait sleeps on a pidfd (no polling: the thread stays out of the way of the rest of the process), with poll(2):
    the process (a whole test session) may hold a thousand descriptors at the time, and select(2) takes none
    numbered past 1023 (a boot failed so beside tests/criproxy/test_relay_connections.py's 400 connections)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waiter = select.poll()
    try:
        pidfd = os.pidfd_open(proc.pid)
        waiter.register(pidfd, select.POLLIN)
    except OSError:  # already reaped, or no pidfd: poll
        pidfd = None
    try:
        while True:
            try:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its code is lost, as Popen.wait would say
                proc.returncode = proc.returncode if proc.returncode is not None else 0
                return 0.0
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return usage.ru_utime + usage.ru_stime
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            if pidfd is not None:
                waiter.poll(None if left is None else math.ceil(left * 1000))
            else:
                time.sleep(0.1 if left is None else min(0.1, left))
    finally:
        if pidfd is not None:
            os.close(pidfd)
