"""The CRI validation suite (critest v1.36.0, kubernetes-sigs/cri-tools) against REAL containerd 2.1.9 (Debian's)
three ways, compared spec by spec: (a) containerd directly, (b) through ``numapin criproxy`` with its default flags
(critest on the proxy's socket, as kubelet's ``containerRuntimeEndpoint``), (c) with ``numapin nri`` plugged into
containerd (critest on containerd's socket). Every spec that passes directly must pass through numapin; a spec that
fails directly is not ours: the session's summary names it with its reason.

Three labs, one per way, each with a CNI bridge network of its own (pods off the host's network) and every pull
served by one local registry (numapin_lab.cri.registry: no way out here); the three runs go at once (they mostly
wait), so the module costs about one run's wall time. The specs: ``numapin_lab.cri.critest.FOCUS``. critest comes
from ``$CRITEST_BIN`` or ``k8s-bin`` (numapin_lab.k8s_bin): missing, the tests fail, never skip.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import pytest

from numapin_lab.cri.containerd import ContainerdLab, _busybox, build_image_archive, scratch_lab
from numapin_lab.cri.containerd_versions import containerd_bin_dir
from numapin_lab.cri.critest import Comparison, CritestRun, compare, run_critest
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.nri_process import NriProcess
from numapin_lab.cri.proxy_process import ProxyProcess
from numapin_lab.cri.registry import RegistryProcess
from numapin_lab.k8s_bin import find_binary
from tests.cri_validation.conftest import report_lines
from tests.criproxy.test_e2e_containerd import SHARED

pytestmark = pytest.mark.containerd

VERSION = "2.x"  # NRI on by default in Debian's 2.1.9: the runtime the plugin is for
MIN_PASSED = 40  # of the 46 specs FOCUS selects, what passes directly here (a run that passes fewer is broken)


def _lab(stack: ExitStack, prefix: str, mirror: str, *, nri: bool = False) -> ContainerdLab:
    return stack.enter_context(scratch_lab(prefix, containerd_bin_dir(VERSION), cni=True, mirror=mirror, nri=nri))


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, CritestRun]]:
    """The three runs, done at once; each lab, the proxy and the plugin stopped afterwards."""
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
            targets = {"containerd": direct.socket, "criproxy": proxy.socket, "nri": plugged.socket}
            with ThreadPoolExecutor(len(targets)) as pool:
                futures = {k: pool.submit(run_critest, critest, sock, work / k, k) for k, sock in targets.items()}
                done = {k: f.result() for k, f in futures.items()}
            for door in (proxy, plugin):
                assert door.running, f"numapin died during critest:\n{door.log_tail()}"
            yield done
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_critest_runs_against_containerd_itself(runs: dict[str, CritestRun], critest_report: list[str]) -> None:
    """The baseline is a real run: enough specs passed directly (a broken lab or image would fail most)."""
    direct = runs["containerd"]
    passed = direct.outcome("passed")
    critest_report.extend(report_lines(direct, None))
    assert len(passed) >= MIN_PASSED, (f"only {len(passed)} specs passed against containerd itself:\n"
                                       + "\n".join(f"  {n}: {direct.specs[n].message}"
                                                   for n in direct.outcome("failed")))


@pytest.mark.parametrize("door", ["criproxy", "nri"])
def test_every_spec_that_passes_directly_passes_through_numapin(runs: dict[str, CritestRun], door: str,
                                                               critest_report: list[str]) -> None:
    c: Comparison = compare(runs["containerd"], runs[door])
    critest_report.extend(report_lines(runs[door], c))
    assert not c.missing, f"specs that passed directly did not run through {door}: {c.missing}"
    assert not c.lost, f"specs that pass against containerd fail through numapin {door}:\n" + "\n".join(
        f"  {n}: {m}" for n, m in c.lost.items())
