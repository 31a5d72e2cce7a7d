"""numapin's node life on a real systemd host: a VM whose PID 1 is systemd on cgroup v2 (numapin_lab.systemd_vm)
runs tests/numa/guest/test_systemd_install.py with the tarball of the self-contained install built here
(scripts/build-node.sh): docs/node.md's runbooks played with the guest's systemctl (install, upgrade while pods run
and rollback, the checks of a node, the way back to kubelet's static policy, the removal), with a kill -9 (systemd
restarts the proxy) and a reboot-equivalent between them. Each guest check is reported as its own test here, and the
runbook commands the guest played are checked against docs/node.md.

Like every multi-NUMA VM test (``numa_vm``), it fails, never skips, when no VM can be run. Its VM time is printed
with each check. Measured (one boot, 1s2n-nosmt: 4 vCPUs, single-threaded TCG, the machine's load 1-6): 341 s of
VM, of which 329 s the guest's checks (install with the tarball's extraction and two proxy starts 124 s, upgrade
and rollback with the four ``numapin status`` 87 s, kill -9 20 s, reboot-equivalent 25 s, the way back 21 s, the
removal 6 s), plus about 70 s for the build; at load 8-10 the guest's checks took 565 s. That is over the 3 minutes
asked of a CI form: most of it is emulated work on the 161 MB install (gunzip of the tarball, install.sh's copy per
release) and the interpreter's start-up (seven proxy starts, one per ``numapin`` command).
"""

from __future__ import annotations

import ast
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from numapin_lab.numa_vm import VMSpec
from tests.install.node_build import BuildError, SessionBuild, session_build
from tests.numa.harness import GuestRun, run_pytest_in_vm

if TYPE_CHECKING:
    from tests.numa.boots import VMJob

pytestmark = [pytest.mark.numa_vm, pytest.mark.timeout(1800)]  # waits for the build and the boot

ROOT = Path(__file__).resolve().parents[2]
GUEST = ROOT / "tests/numa/guest/test_systemd_install.py"
TARBALL_ENV = "NUMAPIN_VM_TARBALL"
CHECKS = [n.name for n in ast.parse(GUEST.read_text()).body
          if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
SPEC = VMSpec(topology="1s2n-nosmt", cgroup="v2", init="systemd", timeout=900, boot_timeout=120, boot_retries=1)


def boot_systemd_host(work: Path, cancel: threading.Event, environ: Mapping[str, str], build: SessionBuild
                      ) -> GuestRun:
    """Play the story in one boot with the session's node build (built now if nothing did yet); the directory is
    kept when a check failed (the failures name its log)."""
    work.mkdir(parents=True, exist_ok=True)
    tarball = build.get() / "numapin-node.tar.gz"
    return run_pytest_in_vm(SPEC, [str(GUEST)], work / "vm", env={TARBALL_ENV: str(tarball)}, test_timeout=600,
                            cancel=cancel, environ=environ)


def vm_job(config: pytest.Config) -> VMJob:
    """The story as a tests.numa.boots.VMJob: the session's boots run it in the background, beside the rest of the
    suite, with the session's build (which the tests of this host's install wait for if they come first). The build
    starts now, in a thread of its own, so that it is done when the job's lane takes it (tests.numa.boots.boot_order
    queues it after the lanes' first boots); its failure is the job's (``SessionBuild.get`` raises it again)."""
    build = session_build(config)
    threading.Thread(target=_build_quietly, args=(build,), name="numapin-node-build", daemon=True).start()
    return lambda work, cancel, environ: boot_systemd_host(work, cancel, environ, build)


def _build_quietly(build: SessionBuild) -> None:
    with contextlib.suppress(BuildError):  # kept by the build, raised to whoever asks for it
        build.get()


VM_JOB = ("systemd-host", vm_job)


def _numa_conftest_loaded(config: pytest.Config) -> bool:
    return any(getattr(p, "__name__", "") == "tests.numa.conftest" for p in config.pluginmanager.get_plugins())


@pytest.fixture(scope="module")
def guest_run(request: pytest.FixtureRequest) -> Iterator[GuestRun]:
    """The story's one boot: the session's background boots' (tests/numa/conftest.py started it with the shapes'
    when the collection was done) or, when this module runs without tests/numa, one run here."""
    if _numa_conftest_loaded(request.config):
        from tests.numa.conftest import session_boots

        name, make_job = VM_JOB
        yield session_boots(request.config).get_extra(name, make_job(request.config))
        return
    work = Path(tempfile.mkdtemp(prefix="numapin-vm-install-", dir="/var/tmp"))
    run = boot_systemd_host(work, threading.Event(), dict(os.environ), session_build(request.config))
    yield run
    if run.returncode == 0 and all(c.outcome == "passed" for c in run.cases):
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("check", CHECKS)
def test_on_a_systemd_host(guest_run: GuestRun, check: str) -> None:
    print(f"VM: {guest_run.seconds:.0f} s on the host ({guest_run.guest_seconds or 0:.0f} s of guest tests), "
          f"{guest_run.watchdog}, QEMU's CPU {guest_run.cpu_seconds:.0f} s{guest_run.clock_note}")
    [case] = guest_run.of(f"{GUEST.name}::{check}") or [None]
    assert case is not None, (f"{check} did not run in the guest (guest pytest exit {guest_run.returncode}); "
                              f"log {guest_run.log}:\n{guest_run.tail()}")
    assert case.outcome == "passed", f"{case.outcome}: {case.message}\n(log {guest_run.log}; proxy log beside it)"


def test_the_guest_played_the_runbooks(guest_run: GuestRun) -> None:
    """What the guest ran is docs/node.md's commands as written (they are read there at run time)."""
    from tests.install.test_runbooks import guest_plays, node_commands

    played = (guest_run.log.parent / "played.txt").read_text().splitlines()
    commands = {c for _, c in node_commands()}
    assert played and all(line.split("\t", 1)[1] in commands for line in played), played
    assert {line.split("\t", 1)[1] for line in played} == {c for _, c in node_commands() if guest_plays(c)}


def test_the_guest_session_ended_clean(guest_run: GuestRun) -> None:
    """The guest's pytest exited 0: no check failed and its session's end check found nothing the story left
    behind (its pods, cgroups, processes), which the checks' own outcomes do not show."""
    assert guest_run.returncode == 0, (f"guest pytest exit {guest_run.returncode}; log {guest_run.log}:\n"
                                       f"{guest_run.tail()}")
