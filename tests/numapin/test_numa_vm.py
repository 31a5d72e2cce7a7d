"""numapin_lab.numa_vm's command line for numa-vm.sh and ``numapin demo --topology``'s bad input (no VM is booted
here: tests/numa boots them)."""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from numapin_lab.numa_vm import (
    GUEST_STALLED,
    NUMA_VM_ENV,
    Heartbeat,
    VMError,
    VMSpec,
    find_numa_vm,
    pci_device_args,
    reap,
    run_in_vm,
    topology_spec,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("topology", "want"), [
    ("2s4n", (2, 2, 2, 4)), ("1s2n-nosmt", (1, 4, 1, 2)), ("2s4c1t8n", (2, 4, 1, 8)), ("1s1c1t1n", (1, 1, 1, 1)),
])
def test_topology_spec(topology: str, want: tuple[int, int, int, int]) -> None:
    assert topology_spec(topology) == want


@pytest.mark.parametrize("bad", ["3s4n", "2s3c1t4n", "2s4c1t3n", "0s1c1t1n", "", "2s4c1t8n --x"])
def test_bad_topology_is_a_clear_error(bad: str) -> None:
    with pytest.raises(VMError, match="topology"):
        topology_spec(bad)


def test_argv_passes_every_option_to_numa_vm() -> None:
    spec = VMSpec(topology="2s4c1t8n", cgroup="v2", mem_per_node_mib=512, qemu_args=pci_device_args(3),
                  env={"A": "b c"}, shares=("/tmp/x",), timeout=60, kernel_args="hugepagesz=1G hugepages=1:1")
    argv = spec.argv(Path("/x/numa-vm.sh"), ["python3", "-c", "print(1)"])
    assert argv[:3] == ["/x/numa-vm.sh", "run", "-q"]
    assert argv[argv.index("--topology") + 1] == "2s4c1t8n" and argv[argv.index("--cgroup") + 1] == "v2"
    assert argv[argv.index("--mem-per-node") + 1] == "512" and argv[argv.index("--timeout") + 1] == "60"
    qemu = [argv[i + 1] for i, a in enumerate(argv) if a == "--qemu-arg"]
    assert qemu == list(pci_device_args(3)) and any("numa_node=3" in a for a in qemu)
    assert argv[argv.index("--env") + 1] == "A=b c" and argv[argv.index("--share") + 1] == "/tmp/x"
    assert argv[argv.index("--append") + 1] == "hugepagesz=1G hugepages=1:1"
    assert argv[argv.index("--"):][-3:] == ["python3", "-c", "print(1)"]
    assert "hpet" in " ".join(argv[argv.index("--"):])  # the guest's clocksource switched to the HPET first
    plain = VMSpec(hpet_clock=False).argv(Path("/x"), ["true"])
    assert plain[plain.index("--"):] == ["--", "true"] and "--append" not in plain
    with pytest.raises(VMError, match="cgroup"):
        VMSpec(cgroup="v3").argv(Path("/x"), ["true"])


def test_missing_numa_vm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NUMA_VM_ENV, "/nonexistent/numa-vm.sh")
    with pytest.raises(VMError, match=f"numa-vm.sh not found.*{NUMA_VM_ENV}"):
        find_numa_vm()


@pytest.mark.parametrize("every", [0, -1.0, float("nan")])
def test_a_watchdog_period_that_would_spin_is_refused(every: float) -> None:
    with pytest.raises(ValueError, match="check_every must be a positive number of seconds"):
        run_in_vm(VMSpec(), ["true"], stalled=lambda: None, check_every=every)


def _demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numapin", "demo", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


@pytest.mark.parametrize(("args", "message"), [
    (("--topology", "3s4n"), "topology '3s4n'"),
    (("--topology", "2s4n", "--keep"), "--keep cannot be combined with --topology"),
    (("--topology", "2s4n", "--sysfs", "/tmp"), "cannot be combined with --topology"),
])
def test_demo_topology_bad_input_exits_2_without_a_vm(args: tuple[str, ...], message: str) -> None:
    r = _demo(*args)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert "booting" not in r.stdout


def test_demo_topology_without_numa_vm_exits_2() -> None:
    r = _demo("--topology", "2s4n", env={NUMA_VM_ENV: "/nonexistent/numa-vm.sh"})
    assert r.returncode == 2 and "numa-vm.sh not found" in r.stderr, r.stderr


def test_heartbeat_stalls_only_once_seen_and_unchanged(tmp_path: Path) -> None:
    beat = Heartbeat(tmp_path / "heartbeat", limit=240)
    assert beat(now=0) is None and beat(now=10_000) is None  # not seen yet: the guest is still booting
    (tmp_path / "heartbeat").write_text("1\n")
    assert beat(now=10_000) is None
    assert beat(now=10_200) is None  # unchanged for 200 s: not yet
    (tmp_path / "heartbeat").write_text("2\n")
    assert beat(now=10_230) is None  # changed: alive again
    why = beat(now=10_471)
    assert why is not None and "stopped 241 s ago" in why


def test_a_frozen_guest_is_stopped_and_said_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's process handling, with a stand-in for numa-vm.sh that beats twice and then hangs (no VM is
    booted in this module): run_in_vm stops it and answers GUEST_STALLED with the reason, long before its limit."""
    vm = tmp_path / "numa-vm.sh"
    vm.write_text(f"#!/bin/sh\necho 1 > {tmp_path}/heartbeat; sleep 0.2; echo 2 > {tmp_path}/heartbeat\n"
                  f"echo started > {tmp_path}/started\nexec sleep 600\n")
    vm.chmod(0o755)
    monkeypatch.setenv(NUMA_VM_ENV, str(vm))
    result = run_in_vm(VMSpec(topology="2s4n", timeout=600), ["true"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, stalled=Heartbeat(tmp_path / "heartbeat", limit=1.0),
                       check_every=0.1)
    assert (tmp_path / "started").exists()
    assert result.returncode == GUEST_STALLED and result.boots == 1 and "heartbeat" in result.stall


def test_a_frozen_guest_is_examined_before_it_is_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``on_stall`` runs while numa-vm.sh (a stand-in here) still runs, with numa-vm.sh's $NUMA_VM_RUNS set to
    ``runs_dir``; what it returns is added to the reason."""
    vm = tmp_path / "numa-vm.sh"
    vm.write_text(f'#!/bin/sh\necho "$NUMA_VM_RUNS" > {tmp_path}/runs; echo $$ > {tmp_path}/pid\n'
                  f"echo 1 > {tmp_path}/heartbeat\nexec sleep 600\n")
    vm.chmod(0o755)
    monkeypatch.setenv(NUMA_VM_ENV, str(vm))
    seen: list[tuple[str, bool]] = []

    def examine(why: str) -> str:
        alive = Path(f"/proc/{(tmp_path / 'pid').read_text().strip()}").exists()
        seen.append((why, alive))
        return "; examined"

    result = run_in_vm(VMSpec(topology="2s4n", timeout=600), ["true"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, stalled=Heartbeat(tmp_path / "heartbeat", limit=1.0),
                       check_every=0.1, on_stall=examine, runs_dir=tmp_path / "qemu-runs")
    assert (tmp_path / "runs").read_text().strip() == str(tmp_path / "qemu-runs")
    assert len(seen) == 1 and "heartbeat" in seen[0][0] and seen[0][1]
    assert result.returncode == GUEST_STALLED and result.stall.endswith("; examined")


BURN = "import time\nwhile time.process_time() < {0}: pass\n"


def test_the_cpu_counted_is_the_vms_own_whatever_else_ends_meanwhile(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The boots run in a thread beside other tests (tests/numa/boots.py): the CPU seconds reported are numa-vm.sh's
    process tree's (a stand-in here, burning 0.3 s in a child it waits for, as QEMU under numa-vm.sh), not those of
    another child of this process that burned 3 s and ended while the VM ran."""
    done = tmp_path / "outsider-done"
    vm = tmp_path / "numa-vm.sh"
    vm.write_text(f"#!/bin/sh\nwhile [ ! -e {done} ]; do sleep 0.05; done\n"
                  f"{shlex.quote(sys.executable)} -c '{BURN.format(0.3)}'\n")
    vm.chmod(0o755)
    monkeypatch.setenv(NUMA_VM_ENV, str(vm))

    def outsider() -> None:
        subprocess.run([sys.executable, "-c", BURN.format(3.0)], check=True)
        done.touch()

    thread = threading.Thread(target=outsider)
    thread.start()
    try:
        result = run_in_vm(VMSpec(topology="2s4n", timeout=600), ["true"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    finally:
        thread.join()
    assert result.returncode == 0 and result.boots == 1
    assert 0.3 <= result.cpu_seconds < 3.0, result.cpu_seconds


def test_a_watchdog_that_raises_stops_the_vm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """How a session's end stops a boot running in the background (tests/numa/harness.py): the ``stalled`` callable
    raises, run_in_vm stops numa-vm.sh (a stand-in here) and lets the exception go on."""
    vm = tmp_path / "numa-vm.sh"
    vm.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid.tmp; mv {tmp_path}/pid.tmp {tmp_path}/pid\nexec sleep 600\n")
    vm.chmod(0o755)
    monkeypatch.setenv(NUMA_VM_ENV, str(vm))

    def cancelled() -> str | None:
        if (tmp_path / "pid").exists():
            raise KeyError("the session ended")
        return None

    with pytest.raises(KeyError, match="the session ended"):
        run_in_vm(VMSpec(topology="2s4n", timeout=600), ["true"], stdout=subprocess.DEVNULL,
                  stderr=subprocess.DEVNULL, stalled=cancelled, check_every=0.1)
    with pytest.raises(ProcessLookupError):
        os.kill(int((tmp_path / "pid").read_text()), 0)


def test_a_vm_goes_when_the_process_that_ran_it_is_killed(tmp_path: Path) -> None:
    """numa-vm.sh (a stand-in here, which stops on SIGTERM as the real one stops QEMU) gets SIGTERM when the process
    running run_in_vm is killed with SIGKILL (no clean-up of its own runs): the parent-death signal, set without
    running Python between fork and exec (the boots run in a thread beside other tests)."""
    vm = tmp_path / "numa-vm.sh"
    vm.write_text(f"#!/bin/sh\ntrap 'echo TERM > {tmp_path}/term; exit 143' TERM\necho $$ > {tmp_path}/pid.tmp\n"
                  f"mv {tmp_path}/pid.tmp {tmp_path}/pid\nwhile :; do sleep 0.1; done\n")
    vm.chmod(0o755)
    runner = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, threading\n"
         "from numapin_lab.numa_vm import VMSpec, run_in_vm\n"
         "t = threading.Thread(target=run_in_vm, args=(VMSpec(topology='2s4n', timeout=600), ['true']))\n"
         "t.start(); t.join()\n"],
        cwd=ROOT, env={**os.environ, NUMA_VM_ENV: str(vm)})
    try:
        for _ in range(600):
            if (tmp_path / "pid").exists() or runner.poll() is not None:
                break
            time.sleep(0.1)
        assert (tmp_path / "pid").exists(), "the stand-in never started"
    finally:
        runner.kill()
        runner.wait()
    try:
        for _ in range(600):
            if (tmp_path / "term").exists():
                break
            time.sleep(0.1)
        assert (tmp_path / "term").read_text() == "TERM\n"
    finally:  # a stand-in that outlived its parent goes anyway
        with contextlib.suppress(ProcessLookupError):
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)


def test_reap_waits_when_the_process_holds_descriptors_past_1023() -> None:
    """A boot thread waits for its VM while the rest of the session may hold a thousand descriptors (a relay test's
    400 connections): the wait works whatever the number its pidfd gets (select(2) took none past 1023: a boot of
    a whole CI run failed so)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"this check needs 1,200 open files and the hard limit is {hard} (raise it: ulimit -Hn 1200)")
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1100:  # every lower number taken: the next descriptor opened is past 1023
            held.append(os.open(os.devnull, os.O_RDONLY))
        proc = subprocess.Popen(["sleep", "0.3"])
        assert reap(proc, 0.05) is None and proc.returncode is None  # still running after the timeout
        used = reap(proc, 30)
        assert used is not None and proc.returncode == 0
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
