"""The CRI validation suite's three critest runs, done in a background thread that starts when pytest has collected
the tests (tests/cri_validation/conftest.py), beside the rest of the suite: they mostly wait (for containerd, runc,
the pods), so on the session's critical path they cost only the checks that read their result, which run last.

``validate`` does the work: one local registry, three labs on containerd 2.1.9 with a CNI network each, (a) critest
on containerd's socket, (b) on ``numapin criproxy``'s (default flags) in front of the second, (c) on the third's
socket with ``numapin nri`` plugged into it; the three runs at once; everything stopped before it returns.
``Validation`` is the thread; ``close()`` (the session's end) cancels runs still going and waits for the tear-down,
so the session's leftover check finds nothing of theirs."""

from __future__ import annotations

import re
import shutil
import threading
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from numapin_lab.cri.containerd import ContainerdLab, _busybox, build_image_archive, scratch_lab
from numapin_lab.cri.containerd_versions import containerd_bin_dir
from numapin_lab.cri.critest import CritestRun, compare, run_critest
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.nri_process import NriProcess
from numapin_lab.cri.proxy_process import ProxyProcess
from numapin_lab.cri.registry import RegistryProcess
from numapin_lab.k8s_bin import find_binary
from tests.criproxy.test_e2e_containerd import SHARED

VERSION = "2.x"  # NRI on by default in Debian's 2.1.9: the runtime the plugin is for
DOORS = ("containerd", "criproxy", "nri")
# the labs and critest yield to the rest of the suite (its critical path), as the VM boots do (they run at 19); the
# proxy and the plugin run at the session's own priority, as on a node
NICENESS = 10
# the names of its threads: a test that counts the process's threads can tell these from its own
THREAD_PREFIX = "numapin-critest"


def _lab(stack: ExitStack, prefix: str, mirror: str, *, nri: bool = False) -> ContainerdLab:
    return stack.enter_context(scratch_lab(prefix, containerd_bin_dir(VERSION), cni=True, mirror=mirror, nri=nri,
                                            niceness=NICENESS))


@dataclass(frozen=True)
class Validated:
    """The three runs by door (``DOORS``), and how many containers each numapin door admitted meanwhile (its
    ``numapin_criproxy_allocations_total``, all modes: that critest's containers went through numapin)."""

    runs: dict[str, CritestRun]
    admitted: dict[str, float]
    # door -> specs that failed through it in the concurrent runs and passed when run again alone (their first
    # message): the three runs at once on a loaded machine lose a spec to containerd now and then ("ttrpc: closed"
    # between containerd and a shim); a spec that fails again through the door stays lost
    retried: dict[str, dict[str, str]] = field(default_factory=dict)


def _retry_lost(critest: Path, targets: dict[str, str], done: dict[str, CritestRun], work: Path,
                cancel: threading.Event) -> dict[str, dict[str, str]]:
    """Run once more, alone, each spec a door lost (passed directly, failed through the door); ``done`` gets the
    second outcome of each. Returns what passed the second time, by door, with the first failure's message."""
    retried: dict[str, dict[str, str]] = {}
    for door in ("criproxy", "nri"):
        lost = compare(done["containerd"], done[door]).lost
        if not lost:
            continue
        focus = tuple(re.escape(name.removeprefix("[It] ")) for name in lost)
        again = run_critest(critest, targets[door], work / f"{door}-again", f"{door} again", focus=focus,
                            cancel=cancel, niceness=NICENESS)
        specs = dict(done[door].specs)
        for name, first in lost.items():
            second = again.specs.get(name)
            if second is not None:
                specs[name] = second
                if second.outcome == "passed":
                    retried.setdefault(door, {})[name] = first
        done[door] = replace(done[door], specs=specs)
    return retried


def admitted(door: ProxyProcess) -> float:
    """The door's containers admitted so far, by its /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{door.port}/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("numapin_criproxy_allocations_total"))


def validate(cancel: threading.Event) -> Validated:
    """The three runs, and what the doors admitted."""
    critest = find_binary("critest")
    work = scratch_dir("crv-")
    try:
        with ExitStack() as stack:
            build_image_archive(work / "images.tar", _busybox())
            registry = stack.enter_context(RegistryProcess(work))
            direct = _lab(stack, "crv-a-", registry.address)
            proxied = _lab(stack, "crv-b-", registry.address)
            plugged = _lab(stack, "crv-c-", registry.address, nri=True)
            proxy = ProxyProcess(work / "proxy", proxied.socket, reserved_cpus=SHARED)
            stack.callback(proxy.stop)
            proxy.start()
            plugin = NriProcess(work / "nri", plugged.socket, plugged.nri_socket, reserved_cpus=SHARED)
            stack.callback(plugin.stop)
            plugin.start()
            targets = dict(zip(DOORS, (direct.socket, proxy.socket, plugged.socket), strict=True))
            with ThreadPoolExecutor(len(targets), thread_name_prefix=THREAD_PREFIX) as pool:
                futures = {k: pool.submit(run_critest, critest, sock, work / k, k, cancel=cancel,
                                          niceness=NICENESS)
                           for k, sock in targets.items()}
                done = {k: f.result() for k, f in futures.items()}
            for name, door in (("criproxy", proxy), ("nri", plugin)):
                if not door.running:
                    raise RuntimeError(f"numapin {name} died during critest:\n{door.log_tail()}")
            retried = _retry_lost(critest, targets, done, work, cancel)
            for name, door in (("criproxy", proxy), ("nri", plugin)):
                if not door.running:
                    raise RuntimeError(f"numapin {name} died during critest:\n{door.log_tail()}")
            return Validated(done, {"criproxy": admitted(proxy), "nri": admitted(plugin)}, retried)
    finally:
        shutil.rmtree(work, ignore_errors=True)


class Validation:
    """``validate`` in a thread of its own, started at once; ``result()`` waits for it."""

    def __init__(self) -> None:
        self.cancel = threading.Event()
        self.future: Future[Validated] = Future()
        self.thread = threading.Thread(target=self._run, name=THREAD_PREFIX, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.future.set_result(validate(self.cancel))
        except BaseException as e:  # handed to the checks that wait for it
            self.future.set_exception(e)

    def result(self) -> Validated:
        return self.future.result()

    def close(self) -> None:
        self.cancel.set()
        self.thread.join()
