from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from criproxy.relay.grpc_relay import RelayHandler, Upstream
from criproxy.relay.relays import RELAYS, start_relay
from numapin_lab.cri.client import CRIClient
from numapin_lab.cri.containerd import ContainerdLab, scratch_lab
from numapin_lab.cri.containerd_versions import CONTAINERDS, containerd_bin_dir
from numapin_lab.cri.ledger import scratch_dir
from numapin_lab.cri.memory_runtime import MemoryRuntime


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory (unix socket paths are limited to 107 bytes)."""
    d = str(scratch_dir("npx-"))
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test on a real containerd runs on containerd 1.6 (the system's); those marked ``containerd_matrix``
    (the CI form: a representative set) also on 1.7 and 2.x, unpacked from newer Debian suites; or on the versions the
    marker names (``containerd_matrix("1.6", "2.x")``)."""
    if "containerd_name" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("containerd_matrix")
        names = ["1.6"] if marker is None else list(marker.args or CONTAINERDS)
        unknown = [n for n in names if n not in CONTAINERDS]
        if unknown:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: containerd_matrix{tuple(unknown)}: not one of "
                                    f"{', '.join(CONTAINERDS)}")
        metafunc.parametrize("containerd_name", names, indirect=True, scope="session",
                             ids=[f"containerd{n}" for n in names])


@pytest.fixture(scope="session")
def containerd_name(request: pytest.FixtureRequest) -> str:
    """Which containerd (a key of ``CONTAINERDS``), set by ``pytest_generate_tests``."""
    return str(request.param)


@pytest.fixture(scope="session")
def containerd_bin(containerd_name: str) -> Path | None:
    """The directory of that containerd's programs (None: the system's); fetched into the cache when missing, and
    a fetch that fails fails the test."""
    return containerd_bin_dir(containerd_name)


@pytest.fixture(scope="session")
def shared_lab(containerd_bin: Path | None) -> Iterator[ContainerdLab]:
    """One private containerd (of each version) for the modules on a real containerd that leave it empty (each
    module's ``lab`` fixture empties it when the module ends): one start and stop instead of one per module."""
    with scratch_lab("npx-lab-", containerd_bin) as lab:
        yield lab


@pytest.fixture
async def runtime(short_tmp: Path) -> AsyncIterator[MemoryRuntime]:
    rt = await MemoryRuntime(str(short_tmp / "rt.sock")).start()
    yield rt
    await rt.stop()


@pytest.fixture(params=RELAYS)
def relay_kind(request: pytest.FixtureRequest) -> str:
    """Each relay the proxy can run (``--relay``): tests using it run once with each."""
    return str(request.param)


@pytest.fixture
async def relay(short_tmp: Path, runtime: MemoryRuntime, relay_kind: str) -> AsyncIterator[str]:
    """A plain relay (no interceptors) in front of the in-process runtime; yields its socket path."""
    upstream = Upstream(runtime.socket_path)
    path = str(short_tmp / "proxy.sock")
    server = await start_relay(path, RelayHandler(upstream), relay_kind)
    yield path
    await server.stop(0)
    await upstream.close()


@pytest.fixture
async def client(relay: str) -> AsyncIterator[CRIClient]:
    c = CRIClient(relay)
    yield c
    await c.close()


def make_sysfs(root: Path, numa_cpus: dict[int, list[int]], distances: dict[int, list[int]] | None = None) -> Path:
    """A small sysfs tree: one socket per NUMA node, one thread per core."""
    cpu_root = root / "devices/system/cpu"
    all_cpus = sorted(c for cpus in numa_cpus.values() for c in cpus)
    cpu_root.mkdir(parents=True)
    (cpu_root / "online").write_text(f"{all_cpus[0]}-{all_cpus[-1]}\n")
    for node, cpus in numa_cpus.items():
        nd = root / f"devices/system/node/node{node}"
        nd.mkdir(parents=True)
        nd.joinpath("cpulist").write_text(",".join(map(str, cpus)) + "\n")
        if distances:
            nd.joinpath("distance").write_text(" ".join(map(str, distances[node])) + "\n")
        for c in cpus:
            t = cpu_root / f"cpu{c}/topology"
            t.mkdir(parents=True)
            t.joinpath("physical_package_id").write_text(f"{node}\n")
            t.joinpath("thread_siblings_list").write_text(f"{c}\n")
    return root


@pytest.fixture
def two_numa_sysfs(short_tmp: Path) -> Path:
    """8 CPUs on 2 NUMA nodes (0-3, 4-7), distances 10/20."""
    return make_sysfs(short_tmp / "sys", {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, {0: [10, 20], 1: [20, 10]})


@pytest.fixture
async def kubelet(proxy: Any) -> AsyncIterator[CRIClient]:
    """kubelet's CRI client on the in-process proxy of the module's ``proxy`` fixture (a module with another kind of
    proxy defines its own)."""
    c = CRIClient(proxy.config.listen)
    yield c
    await c.close()
