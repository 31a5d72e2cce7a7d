"""In-place resize of a pinned container across a real multi-NUMA SMT kernel (2s4n: NUMA node n is core n, CPUs
2n and 2n+1; CPU 0 reserved), as kubelet drives it: ``UpdateContainerResources`` with the new CFS shares, quota and
period and no cpuset, through the proxy. Judged from the guest kernel (``/proc/<pid>/status`` Cpus_allowed_list and
Mems_allowed_list, the cpuset cgroup files, the CFS quota), with a shared container sampled while a growth is
applied: it is never on a CPU the resized container has as its own.

Three stories, one proxy configuration each (the last is the one test_single_numa_node.py starts with, so it follows
without a restart):

- best-effort with full-pcpus-only: an odd growth is refused with kubelet's SMT alignment wording and changes
  nothing; a growth adds a whole core, on the NUMA node of the preferred hint (across the sockets); a shrink gives
  that core back;
- best-effort: a container shrunk to one CPU of its node grows by its core's free sibling first, then by the NUMA
  nodes of the preferred hint (not by the lowest free CPUs); a shrink gives back the grown CPUs first (the CPU off
  its node first) and keeps the one it holds since; integer -> fractional puts it on the shared pool, fractional ->
  integer gives it CPUs of its own again;
- single-numa-node: a growth that fits its node is granted in that node (its free sibling, not the lowest free CPU,
  which is on another node); one that cannot stay in one node is refused with kubelet's reason, and the kernel
  shows nothing changed.

The expected sets were worked out with kubelet's rules (the narrowest preferred hint that holds the container's CPUs,
the lowest such) and checked against the allocator on this machine's model (tests.numa.shapes.expected_topology).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from allocator.cpuset import CPUSet
from tests.numa.guest.node import GuestNode, Kernel, NodeConfig

S = CPUSet.parse
FULL = "full-pcpus-only=true"
BEST_EFFORT_FULL = NodeConfig("best-effort", "0", cpu_options=FULL)
BEST_EFFORT = NodeConfig("best-effort", "0")
SINGLE = NodeConfig("single-numa-node", "0")  # test_single_numa_node.py's: it follows on the same proxy


def allowed(pid: int) -> CPUSet:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return S(line.split(":", 1)[1].strip())
    raise LookupError(f"/proc/{pid}/status has no Cpus_allowed_list")


class Sampler:
    """Reads the resized container's and a shared container's ``Cpus_allowed_list`` in a thread, as often as the
    guest lets it, while a resize is applied. A sample where the resized container runs on a set of CPUs of its own
    (one of ``exclusive``: its set before and after) and the shared container has one of those CPUs is an
    isolation window."""

    def __init__(self, node: GuestNode, resized: str, shared: str, *exclusive: CPUSet) -> None:
        self.pid, self.shared_pid = node.pids[(resized, "app")], node.pids[(shared, "app")]
        self.exclusive = exclusive
        self.samples: list[tuple[CPUSet, CPUSet]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((allowed(self.pid), allowed(self.shared_pid)))
            time.sleep(0.002)

    def __enter__(self) -> Sampler:
        self._thread.start()
        time.sleep(0.05)  # a first sample before the call
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((allowed(self.pid), allowed(self.shared_pid)))  # once the call has returned

    def windows(self) -> list[tuple[CPUSet, CPUSet]]:
        return [(m, o) for m, o in self.samples if m in self.exclusive and m & o]

    def check(self, after: CPUSet) -> None:
        assert self.samples, "no sample taken during the resize"
        assert self.windows() == [], f"the shared container shared the resized one's CPUs: {self.windows()[:5]}"
        seen = [m for m, _ in self.samples]
        assert after in seen, f"the sampler never saw the resized set {after} ({len(seen)} samples, last {seen[-1]})"


@dataclass(frozen=True)
class Snapshot:
    """The kernel's view of the pinned and the shared container, and the pinned one's CFS quota."""
    db: Kernel
    web: Kernel
    quota: str | None


def snapshot(node: GuestNode) -> Snapshot:
    return Snapshot(node.kernel("db"), node.kernel("web"), node.cfs_quota("db"))


def on(node: GuestNode, name: str, cpus: str, mems: str) -> None:
    """The container's process and cpuset cgroup are on ``cpus`` and ``mems``, read at once: the proxy answers a
    resize only once the kernel shows the new sets."""
    k = node.kernel(name)
    want = (S(cpus), S(mems))
    assert (k.cpus, k.mems) == want and (k.cgroup_cpus, k.cgroup_mems) == want, f"{name}: {k}, expected {want}"


def start(node: GuestNode, config: NodeConfig) -> None:
    """The story's node: a shared pod ``web`` and a Guaranteed pod ``db`` with 2 CPUs (the whole NUMA node 1: node 0
    has only CPU 1 beside the reserved CPU 0)."""
    node.configure(config)
    node.run("web", "250m")
    node.run("db", "2", limit="2")
    db = node.settled("db", S("2-3"), S("1"))
    assert (db.cpus, db.mems, db.cgroup_cpus, db.cgroup_mems) == (S("2-3"), S("1"), S("2-3"), S("1")), db
    web = node.settled("web", S("0-1,4-7"), S("0,2-3"))
    assert (web.cpus, web.mems) == (S("0-1,4-7"), S("0,2-3")), web
    assert node.cfs_quota("db") == "-1"  # pinned: no CFS quota


# -- best-effort, full-pcpus-only ---------------------------------------------------------------------------------
def test_full_pcpus_only_refuses_an_odd_growth_with_kubelets_smt_wording(node: GuestNode) -> None:
    start(node, BEST_EFFORT_FULL)
    before = snapshot(node)
    refusal = node.refuse_resize("db", "3")
    assert refusal.code == "FAILED_PRECONDITION", refusal
    assert "resize refused (SMTAlignmentError)" in refusal.message, refusal
    assert "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2" in refusal.message, refusal
    assert "keeps running as it was" in refusal.message, refusal
    assert snapshot(node) == before


def test_full_pcpus_only_grows_by_a_whole_core_across_the_sockets(node: GuestNode) -> None:
    # node 1 is full: the preferred hint holding CPUs 2-3 and 4 CPUs is nodes {1, 2} (node 0 has one free CPU,
    # half a core, which full-pcpus-only never hands out): node 2's core, on the other socket
    with Sampler(node, "db", "web", S("2-3"), S("2-5")) as s:
        node.resize("db", "4")
    s.check(S("2-5"))
    on(node, "db", "2-5", "1-2")
    on(node, "web", "0-1,6-7", "0,3")
    assert node.cfs_quota("db") == "-1"  # kubelet sent 400000: lifted


def test_full_pcpus_only_shrink_gives_the_grown_core_back(node: GuestNode) -> None:
    node.resize("db", "2")
    on(node, "db", "2-3", "1")
    on(node, "web", "0-1,4-7", "0,2-3")
    node.prepare_proxy()  # the next story's proxy imports meanwhile


# -- best-effort ----------------------------------------------------------------------------------------------------
def test_growth_takes_its_cores_sibling_first_then_the_preferred_nodes(node: GuestNode) -> None:
    start(node, BEST_EFFORT)
    node.resize("db", "1")  # below what it was admitted with: the thread of core 1 with the highest id goes back
    on(node, "db", "2", "1")
    # 1 -> 3: CPU 2 kept, its sibling 3, then the preferred hint {0, 1}'s free CPU 1
    with Sampler(node, "db", "web", S("2"), S("1-3")) as s:
        node.resize("db", "3")
    s.check(S("1-3"))
    on(node, "db", "1-3", "0-1")
    on(node, "web", "0,4-7", "0,2-3")
    assert node.cfs_quota("db") == "-1"


def test_shrink_gives_back_the_grown_cpus_first(node: GuestNode) -> None:
    # 3 -> 2: of the grown CPUs 1 and 3 the one off its node goes first (a highest-id rule would give back 3)
    node.resize("db", "2")
    on(node, "db", "2-3", "1")
    # 2 -> 1: the grown CPU 3 goes, CPU 2 (what it held before growing) stays
    node.resize("db", "1")
    on(node, "db", "2", "1")
    on(node, "web", "0-1,3-7", "0-3")


def test_growth_across_numa_nodes_by_the_preferred_hint_not_the_lowest_free_cpus(node: GuestNode) -> None:
    # 1 -> 4: CPU 2 kept, its sibling 3, then node 2's core (the preferred hint {1, 2}: nodes {0, 1} hold only
    # 3 CPUs beside the reserved one), not CPU 1, the lowest free
    with Sampler(node, "db", "web", S("2"), S("2-5")) as s:
        node.resize("db", "4")
    s.check(S("2-5"))
    on(node, "db", "2-5", "1-2")
    on(node, "web", "0-1,6-7", "0,3")


def test_integer_to_fractional_and_back(node: GuestNode) -> None:
    node.resize("db", "1500m")  # the shared pool, with kubelet's quota again; the pool widened back
    on(node, "db", "0-7", "0-3")
    on(node, "web", "0-7", "0-3")
    assert node.cfs_quota("db") == "150000"
    with Sampler(node, "db", "web", S("2-3")) as s:
        node.resize("db", "2")  # CPUs of its own again: decided as an admission (node 1, the lowest with 2 free)
    s.check(S("2-3"))
    on(node, "db", "2-3", "1")
    on(node, "web", "0-1,4-7", "0,2-3")
    assert node.cfs_quota("db") == "-1"
    node.prepare_proxy()


# -- single-numa-node -----------------------------------------------------------------------------------------------
def test_single_numa_node_grants_a_growth_that_fits_its_node_in_that_node(node: GuestNode) -> None:
    start(node, SINGLE)
    node.resize("db", "1")
    on(node, "db", "2", "1")
    # CPU 1 is the lowest free CPU, but on node 0: the growth stays on node 1
    with Sampler(node, "db", "web", S("2"), S("2-3")) as s:
        node.resize("db", "2")
    s.check(S("2-3"))
    on(node, "db", "2-3", "1")
    on(node, "web", "0-1,4-7", "0,2-3")


def test_single_numa_node_refuses_a_growth_that_cannot_stay_in_one_node(node: GuestNode) -> None:
    before = snapshot(node)
    refusal = node.refuse_resize("db", "3")  # nodes 2 and 3 have 2 free CPUs each, but one node holds only 2
    assert refusal.code == "FAILED_PRECONDITION", refusal
    assert "resize refused (TopologyAffinityError)" in refusal.message, refusal
    assert "single-numa-node" in refusal.message and "from 2 to 3 exclusive CPU(s)" in refusal.message, refusal
    assert "keeps running as it was" in refusal.message, refusal
    assert snapshot(node) == before  # CPUs, memory nodes (process and cgroup), the shared pod, the quota
