"""The session's boots of the multi-NUMA shapes (tests/numa/shapes.py): one boot per shape, run in the background.

When the session's selection holds checks of tests/numa/test_multi_numa.py, tests/numa/conftest.py starts their
shapes' boots as soon as the collection is done (the longest first, one VM at a time: tests.numa.background) and
moves those checks to the end of the session, so the boots run while the rest of the suite does; each check then
waits for its shape's boot. The environment of the boots is the one the session started with (tests may change
the process's own meanwhile). A boot that raised (no numa-vm.sh, a checkout the guest cannot see) fails every
check of its shape with its error; the session's end stops a boot still running (its checks, if any still to run,
fail as cancelled).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from numapin_lab.cri.containerd import LabError
from numapin_lab.cri.containerd_versions import CACHE, CACHE_ENV, containerd_bin_dir
from numapin_lab.numa_vm import VMSpec, pci_device_args
from numapin_lab.systemd_vm import THREAD_PREFIX
from tests.numa.background import Background
from tests.numa.guest.node import OPLOG_ENV
from tests.numa.harness import GuestRun, run_pytest_in_vm
from tests.numa.shapes import SHAPE_ENV, SHAPES, Shape

__all__ = ["BOOT_LANES", "Boots", "VMJob", "boot_order", "ensure_containerds", "guest_files", "vm_spec"]

BOOT_LANES = 2  # VMs at once (tests.numa.background says why)
# The boots' threads (and so the VMs and builds they start, which inherit a thread's nice value on Linux) run at the
# lowest priority: the VMs are CPU-bound background work with minutes of slack, the rest of the suite is the
# session's critical path and mostly waits (for containerd, shims, sockets), so each of its wake-ups should get a
# core at once. At nice 5 the rest took 870-925 s beside two VMs (about 680 s beside one); nice 19 gives a VM about
# 1.5% of a core another task wants, and all of it when that task waits.
BOOT_NICE = 19

# A boot that is not a shape of tests/numa/shapes.py (e.g. tests/install/test_systemd_host.py's systemd host): its
# work directory, the cancel event and the session's environment in, its GuestRun out. A test module offers one
# as its ``VM_JOB = (name, make)``, ``make(config)`` giving the job; tests/numa/conftest.py queues it with the
# shapes' boots.
VMJob = Callable[[Path, threading.Event, Mapping[str, str]], GuestRun]

GUEST = Path(__file__).parent / "guest"
ROOT = Path(__file__).resolve().parents[2]


def guest_files(shape: Shape) -> list[Path]:
    return [GUEST / f for f in shape.guest_tests] + [ROOT / f for f in shape.more_tests]


def ensure_containerds(shape: Shape) -> list[Path]:
    """The bin directories of the containerds the shape's guest tests run (``Shape.containerds``), fetched into the
    host's cache now if missing: the guest sees this cache at the same path and never fetches
    (``containerd_bin_dir(..., fetch=False)``). Called where a boot begins; ``LabError`` when one cannot be had
    (every check of the shape then fails with it, and nothing is booted)."""
    out = []
    for version in shape.containerds:
        found = containerd_bin_dir(version)
        if found is None:
            raise LabError(f"{shape.name}: containerd {version} is the system's, not one of the cache's")
        out.append(found)
    return out


def boot_order(names: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """The shapes longest first (by ``Shape.seconds``), so that the lanes end close together (by the time limit,
    1s2n-systemd, the longest of the short ones, once went last and its lane ended up to 160 s after the other); the
    extra jobs right after the lanes' first boots: an extra job (the systemd host's install story) first waits for the
    session's node build, which those boots overlap instead of a lane standing idle for it (up to 170 s here)."""
    shapes = sorted(dict.fromkeys(n for n in names if n in SHAPES), key=lambda n: -SHAPES[n].seconds)
    jobs = [n for n in dict.fromkeys([*names, *extra]) if n not in SHAPES]
    return [*shapes[:BOOT_LANES], *jobs, *shapes[BOOT_LANES:]]


def vm_spec(shape: Shape) -> VMSpec:
    qemu = pci_device_args(shape.device_node) if shape.device_node is not None else ()
    return VMSpec(topology=shape.topology, cgroup=shape.cgroup, mem_per_node_mib=shape.mem_per_node_mib,
                  qemu_args=qemu, timeout=shape.timeout, init=shape.init, kernel_args=shape.kernel_args)


class Boots:
    """One boot per shape for the whole session, in a background thread; ``get`` waits for a shape's (starting
    it now if nothing started it). The boots' shared directories live in /var/tmp (the guest has its own tmpfs
    /tmp); ``close`` removes them unless a boot had a failure (the failures name their logs there) or a guest
    froze (the summary names its post-mortem there)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="numapin-vm-", dir="/var/tmp"))
        self.environ = dict(os.environ if environ is None else environ)
        self.runs: dict[str, GuestRun] = {}   # finished boots, in the order they finished
        self.t0 = time.monotonic()
        self.spans: dict[str, tuple[float, float]] = {}  # each boot's start and end, seconds after t0
        self.waited = 0.0  # how long the checks waited for boots still running (the part not overlapped)
        self.extra: dict[str, VMJob] = {}
        self._jobs: Background[str, GuestRun] = Background(self._boot, name=THREAD_PREFIX, lanes=BOOT_LANES)

    def start(self, names: Iterable[str], extra: Mapping[str, VMJob] | None = None) -> None:
        """Queue these shapes' boots and the ``extra`` jobs in ``boot_order``: each lane takes the next when its boot
        ends."""
        self.extra.update(extra or {})
        self._jobs.start(boot_order(names, extra or {}))

    def get_extra(self, name: str, job: VMJob) -> GuestRun:
        """An extra job's run (queued now if the collection did not start it), waiting for it."""
        self.extra.setdefault(name, job)
        return self.get(name)

    def get(self, name: str) -> GuestRun:
        t = time.monotonic()
        try:
            return self._jobs.result(name)
        finally:
            self.waited += time.monotonic() - t

    def timeline(self) -> str:
        """When each boot ran (seconds after the boots were set up) and how long the checks waited for them."""
        spans = ", ".join(f"{name} {a:.0f}-{b:.0f} s" for name, (a, b) in self.spans.items())
        return f"in the background beside the other tests: {spans}; the checks waited {self.waited:.0f} s for them"

    def close(self) -> None:
        self._jobs.close()
        if all(r.returncode == 0 and not r.stalls for r in self.runs.values()):
            shutil.rmtree(self.base, ignore_errors=True)

    def _boot(self, name: str, cancel: threading.Event) -> GuestRun:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BOOT_NICE)  # this thread only (Linux)
        work = self.base / name
        begin = time.monotonic() - self.t0
        if name not in SHAPES:
            run = self.extra[name](work, cancel, self.environ)
            self.spans[name] = (begin, time.monotonic() - self.t0)
            self.runs[name] = run
            return run
        shape = SHAPES[name]
        ensure_containerds(shape)
        env = {SHAPE_ENV: name, OPLOG_ENV: str(work / "operations.log")}
        if shape.containerds:
            env[CACHE_ENV] = str(CACHE)
        run = run_pytest_in_vm(vm_spec(shape), [str(f) for f in guest_files(shape)], work, env=env,
                               test_timeout=shape.timeout // 2, cancel=cancel, environ=self.environ)
        self.spans[name] = (begin, time.monotonic() - self.t0)
        self.runs[name] = run
        return run
