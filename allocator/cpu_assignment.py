"""kubelet's take-by-topology: which ``count`` CPUs out of ``available`` a container gets.

Two algorithms, as kubelet's CPU manager static policy (cpu_assignment.go) runs them:

* **NUMA-packed** (default). Hierarchy: NUMA nodes above sockets when the machine has at least as many
  sockets as NUMA nodes ("NUMA-first"), sockets above NUMA nodes otherwise. Every list of elements is
  sorted by number of free CPUs, then id, and lower levels are sorted inside each sorted upper element.
  Steps, stopping as soon as the request is met: whole free first-level elements, whole free
  second-level elements, (``prefer-align-cpus-by-uncorecache``) whole free L3 groups then the first L3
  group that fits the rest exactly, whole free cores (not with ``distribute-cpus-across-cores``), then
  single CPUs: core by core in the sorted core order ("packed"), or socket by socket in CPU id order
  ("spread", ``distribute-cpus-across-cores``).
* **NUMA-distributed** (``distribute-cpus-across-numa``): the smallest number of NUMA nodes over which
  the request splits evenly in groups (the SMT width with ``full-pcpus-only``, else 1 CPU), the NUMA
  combination and remainder placement chosen by the lowest standard deviation of free CPUs per NUMA
  node afterwards, each part taken with the packed algorithm; packed over everything when no
  combination works.

Sets are int bitmasks throughout: the free CPUs of an element is ``element_mask & free``, its count a
popcount, so sorting a 384-CPU machine's cores is cheap.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping

from .cpuset import CPUSet
from .errors import AllocationError
from .policy_options import StaticPolicyOptions
from .topology import Topology

__all__ = ["CPUTaker", "take_by_topology"]


def take_by_topology(
    topology: Topology,
    available: CPUSet,
    count: int,
    options: Mapping[str, str] | StaticPolicyOptions | None = None,
) -> CPUSet:
    """Pick ``count`` CPUs from ``available`` as kubelet's static policy would.

    ``options`` are kubelet static-policy option names (``{"full-pcpus-only": "true"}``); only the ones
    that steer the algorithm matter here. Raises AllocationError when it cannot be done, ConfigError for
    bad options.
    """
    opts = options if isinstance(options, StaticPolicyOptions) else StaticPolicyOptions.parse(options)
    return CPUTaker(topology).take(available, count, opts)


class CPUTaker:
    """take-by-topology bound to one topology, whose per-element masks are computed once."""

    __slots__ = (
        "all_mask",
        "core_mask",
        "cores_in_numa",
        "cores_in_socket",
        "cores_in_uncore",
        "cpus_per_core",
        "cpus_per_socket",
        "cpus_per_uncore",
        "num_cpus",
        "numa_first",
        "numa_mask",
        "numas_in_socket",
        "socket_mask",
        "sockets_in_numa",
        "topology",
        "uncore_mask",
        "uncores_in_numa",
    )

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        numa: dict[int, int] = {}
        socket: dict[int, int] = {}
        core: dict[int, int] = {}
        uncore: dict[int, int] = {}
        rel: dict[str, dict[int, set[int]]] = {k: {} for k in ("sn", "ns", "cs", "cn", "un", "cu")}
        for c in topology.cpus:
            bit = 1 << c.cpu
            numa[c.numa] = numa.get(c.numa, 0) | bit
            socket[c.socket] = socket.get(c.socket, 0) | bit
            core[c.core] = core.get(c.core, 0) | bit
            uncore[c.uncore] = uncore.get(c.uncore, 0) | bit
            rel["sn"].setdefault(c.numa, set()).add(c.socket)
            rel["ns"].setdefault(c.socket, set()).add(c.numa)
            rel["cs"].setdefault(c.socket, set()).add(c.core)
            rel["cn"].setdefault(c.numa, set()).add(c.core)
            rel["un"].setdefault(c.numa, set()).add(c.uncore)
            rel["cu"].setdefault(c.uncore, set()).add(c.core)

        def frozen(d: dict[int, set[int]]) -> dict[int, tuple[int, ...]]:
            return {k: tuple(sorted(v)) for k, v in d.items()}

        self.numa_mask = dict(sorted(numa.items()))
        self.socket_mask = dict(sorted(socket.items()))
        self.core_mask = dict(sorted(core.items()))
        self.uncore_mask = dict(sorted(uncore.items()))
        self.sockets_in_numa = frozen(rel["sn"])
        self.numas_in_socket = frozen(rel["ns"])
        self.cores_in_socket = frozen(rel["cs"])
        self.cores_in_numa = frozen(rel["cn"])
        self.uncores_in_numa = frozen(rel["un"])
        self.cores_in_uncore = frozen(rel["cu"])
        self.all_mask = topology.all_cpus.mask
        self.num_cpus = len(topology.cpus)
        # kubelet's per-element sizes are machine-wide averages (CPUsPerCore = NumCPUs / NumCores, ...)
        self.cpus_per_core = self.num_cpus // len(core) if core else 0
        self.cpus_per_socket = self.num_cpus // len(socket) if socket else 0
        self.cpus_per_uncore = self.num_cpus // len(uncore) if uncore else 0
        self.numa_first = len(socket) >= len(numa)

    # -- entry points -----------------------------------------------------------------------
    def take(self, available: CPUSet, count: int, options: StaticPolicyOptions | None = None) -> CPUSet:
        """The static policy's dispatch: distributed with ``distribute-cpus-across-numa`` (group size = SMT
        width with ``full-pcpus-only``), packed otherwise; spread single CPUs with
        ``distribute-cpus-across-cores``."""
        opts = options or StaticPolicyOptions()
        spread = opts.distribute_cpus_across_cores
        if opts.distribute_cpus_across_numa:
            group = self.cpus_per_core if opts.full_pcpus_only and self.cpus_per_core > 0 else 1
            return self.take_distributed(available, count, group, spread=spread)
        return self.take_packed(available, count, spread=spread, uncore=opts.prefer_align_cpus_by_uncorecache)

    def take_packed(self, available: CPUSet, count: int, *, spread: bool = False, uncore: bool = False) -> CPUSet:
        return CPUSet.from_mask(self._packed(available.mask, len(available), count, spread, uncore))

    def take_distributed(self, available: CPUSet, count: int, group: int = 1, *, spread: bool = False) -> CPUSet:
        return CPUSet.from_mask(self._distributed(available.mask, len(available), count, group, spread))

    def accumulator(self, available: CPUSet, count: int = 0) -> _Accumulator:
        """An accumulator over ``available`` (exposed so tests can check kubelet's element orderings)."""
        return _Accumulator(self, available.mask, count)

    # -- packed -------------------------------------------------------------------------------
    def _packed(self, avail: int, avail_size: int, count: int, spread: bool, uncore: bool) -> int:
        _check_count(count)
        acc = _Accumulator(self, avail, count)
        if acc.satisfied():
            return 0
        if acc.failed():
            raise AllocationError(
                f"not enough cpus available to satisfy request: requested={count}, available={avail_size}"
            )
        if self.numa_first:
            acc.take_full_numa_nodes()
            if acc.satisfied():
                return acc.result
            acc.take_full_sockets()
        else:
            acc.take_full_sockets()
            if acc.satisfied():
                return acc.result
            acc.take_full_numa_nodes()
        if acc.satisfied():
            return acc.result
        if uncore:
            acc.take_uncore_caches()
            if acc.satisfied():
                return acc.result
        if not spread:
            acc.take_full_cores()
            if acc.satisfied():
                return acc.result
        acc.take_remaining_cpus(spread)
        if acc.satisfied():
            return acc.result
        raise AllocationError("failed to allocate cpus")

    # -- distributed ----------------------------------------------------------------------------
    def _distributed(self, avail: int, avail_size: int, count: int, group: int, spread: bool) -> int:
        _check_count(count)
        if group < 1:
            raise AllocationError(f"invalid CPU group size {group}")
        if count % group != 0:
            return self._packed(avail, avail_size, count, spread, False)
        acc = _Accumulator(self, avail, count)
        if acc.satisfied():
            return 0
        if acc.failed():
            raise AllocationError(
                f"not enough cpus available to satisfy request: requested={count}, available={avail_size}"
            )
        numas = acc.sort_numa_nodes()
        free_of = {n: acc.count(self.numa_mask[n]) for n in numas}
        min_k, max_k = self._numa_range(acc, group)
        for k in range(min_k, max_k + 1):
            best = self._best_combination(numas, free_of, k, count, group)
            if best is None:
                continue
            combo, remainder_set = best
            distribution = (count // len(combo) // group) * group
            for n in combo:
                part = self._packed_quiet(acc.free & self.numa_mask[n], distribution, spread)
                acc.take(part)
            remainder = count - distribution * len(combo)
            while remainder > 0:
                progressed = False
                for n in remainder_set:
                    if remainder == 0:
                        break
                    if acc.count(self.numa_mask[n]) < group:
                        continue
                    acc.take(self._packed_quiet(acc.free & self.numa_mask[n], group, spread))
                    remainder -= group
                    progressed = True
                if not progressed:
                    break
            if acc.needed > 0:
                raise AllocationError(f"accounting error, not enough CPUs allocated, remaining: {acc.needed}")
            if acc.needed < 0:
                raise AllocationError(f"accounting error, too many CPUs allocated, remaining: {acc.needed}")
            return acc.result
        return self._packed(avail, avail_size, count, spread, False)

    def _packed_quiet(self, avail: int, count: int, spread: bool) -> int:
        """A packed take whose failure yields no CPUs (kubelet ignores errors of these inner takes)."""
        try:
            return self._packed(avail, avail.bit_count(), count, spread, False)
        except AllocationError:
            return 0

    def _numa_range(self, acc: _Accumulator, group: int) -> tuple[int, int]:
        """kubelet's rangeNUMANodesNeededToSatisfy: the least and most NUMA nodes worth trying."""
        num_numa = len(self.numa_mask)
        num_numa_free = len(acc.present(self.numa_mask))
        groups = (self.num_cpus - 1) // group + 1
        groups_per_numa = (groups - 1) // num_numa + 1
        groups_needed = (acc.needed - 1) // group + 1
        return (groups_needed - 1) // groups_per_numa + 1, min(groups_needed, num_numa_free)

    @staticmethod
    def _best_combination(
        numas: list[int], free_of: dict[int, int], k: int, count: int, group: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        best_balance = math.inf
        best: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        for combo in itertools.combinations(numas, k):
            if best_balance == 0:
                break
            if sum(free_of[n] for n in combo) < count:
                continue
            if sum(free_of[n] // group for n in combo) * group < count:
                continue
            distribution = (count // k // group) * group
            if any(free_of[n] < distribution for n in combo):
                continue
            after = dict(free_of)
            for n in combo:
                after[n] -= distribution
            remainder = count - distribution * k
            candidates = [n for n in combo if after[n] >= group]
            local_balance = math.inf
            local_subset: tuple[int, ...] = ()
            if remainder == 0:
                local_balance = _stddev(after.values())
            size = len(candidates)
            while remainder > 0 and size >= 1:
                for subset in itertools.combinations(candidates, size):
                    if sum(after[n] for n in subset) < remainder:
                        continue
                    trial = dict(after)
                    left = remainder
                    while left > 0:
                        progressed = False
                        for n in subset:
                            if left == 0:
                                break
                            if trial[n] < group:
                                continue
                            trial[n] -= group
                            left -= group
                            progressed = True
                        if not progressed:
                            break
                    if left > 0:
                        continue  # kubelet would spin here forever; such a subset cannot take the remainder
                    balance = _stddev(trial.values())
                    if balance < local_balance:
                        local_balance = balance
                        local_subset = subset
                size -= 1
            if local_balance < best_balance:
                best_balance = local_balance
                best = (combo, local_subset)
        return best


class _Accumulator:
    """kubelet's cpuAccumulator: the free CPUs (``free``), the CPUs taken so far, and how many are still needed."""

    __slots__ = ("free", "needed", "result", "t")

    def __init__(self, taker: CPUTaker, available: int, needed: int) -> None:
        self.t = taker
        self.free = available & taker.all_mask
        self.result = 0
        self.needed = needed

    # -- bookkeeping ------------------------------------------------------------------------------
    def count(self, mask: int) -> int:
        return (mask & self.free).bit_count()

    def present(self, masks: Mapping[int, int]) -> list[int]:
        free = self.free
        return [i for i, m in masks.items() if m & free]

    def take(self, cpus: int) -> None:
        new = cpus & ~self.result
        self.result |= new
        self.free &= ~new
        self.needed -= new.bit_count()

    def satisfied(self) -> bool:
        return self.needed < 1

    def failed(self) -> bool:
        return self.needed > self.free.bit_count()

    def _sorted(self, ids: Iterable[int], masks: Mapping[int, int]) -> list[int]:
        free = self.free
        return sorted(ids, key=lambda i: ((masks[i] & free).bit_count(), i))

    def _within(self, ids: Iterable[int], masks: Mapping[int, int], outer: int) -> list[int]:
        """Ids whose element has a free CPU inside ``outer`` (kubelet: details.XInY(outer))."""
        live = self.free & outer
        return [i for i in ids if masks[i] & live]

    # -- kubelet's orderings -----------------------------------------------------------------------
    def sort_numa_nodes(self) -> list[int]:
        t = self.t
        if t.numa_first:
            return self._sorted(self.present(t.numa_mask), t.numa_mask)
        out: list[int] = []
        for s in self.sort_sockets():
            out += self._sorted(self._within(t.numas_in_socket[s], t.numa_mask, t.socket_mask[s]), t.numa_mask)
        return out

    def sort_sockets(self) -> list[int]:
        t = self.t
        if not t.numa_first:
            return self._sorted(self.present(t.socket_mask), t.socket_mask)
        out: list[int] = []
        for n in self.sort_numa_nodes():
            out += self._sorted(self._within(t.sockets_in_numa[n], t.socket_mask, t.numa_mask[n]), t.socket_mask)
        return out

    def sort_cores(self) -> list[int]:
        t = self.t
        out: list[int] = []
        if t.numa_first:
            for s in self.sort_sockets():
                out += self._sorted(self._within(t.cores_in_socket[s], t.core_mask, t.socket_mask[s]), t.core_mask)
        else:
            for n in self.sort_numa_nodes():
                out += self._sorted(self._within(t.cores_in_numa[n], t.core_mask, t.numa_mask[n]), t.core_mask)
        return out

    def sort_uncore_caches(self) -> list[int]:
        t = self.t
        out: list[int] = []
        for n in self.sort_numa_nodes():
            out += self._sorted(self._within(t.uncores_in_numa[n], t.uncore_mask, t.numa_mask[n]), t.uncore_mask)
        return out

    def free_numa_nodes(self) -> list[int]:
        t = self.t
        return [n for n in self.sort_numa_nodes() if self.free & t.numa_mask[n] == t.numa_mask[n]]

    def free_sockets(self) -> list[int]:
        t = self.t
        return [s for s in self.sort_sockets() if self._whole(t.socket_mask[s], t.cpus_per_socket)]

    def free_uncore_caches(self) -> list[int]:
        t = self.t
        return [u for u in self.sort_uncore_caches() if self.free & t.uncore_mask[u] == t.uncore_mask[u]]

    def free_cores(self) -> list[int]:
        t = self.t
        return [c for c in self.sort_cores() if self._whole(t.core_mask[c], t.cpus_per_core)]

    def _whole(self, mask: int, average: int) -> bool:
        """kubelet's isSocketFree / isCoreFree: the element's free CPUs number the machine-wide average. On
        machines with offline CPUs that can hold for a partly used element, and kubelet would then hand out
        its busy CPUs too; numapin also requires every CPU of the element to be free."""
        return self.count(mask) == average and self.free & mask == mask

    def free_cpus(self, spread: bool = False) -> list[int]:
        """Single CPUs in take order: core by core (packed) or socket by socket in id order (spread)."""
        t = self.t
        out: list[int] = []
        if spread:
            for s in self.sort_sockets():
                out += CPUSet.from_mask(t.socket_mask[s] & self.free).sorted()
        else:
            for c in self.sort_cores():
                out += CPUSet.from_mask(t.core_mask[c] & self.free).sorted()
        return out

    # -- the steps -------------------------------------------------------------------------------------
    def _take_whole(self, ids: list[int], masks: Mapping[int, int]) -> None:
        for i in ids:
            size = masks[i].bit_count()
            if self.needed >= size:
                self.take(masks[i])

    def take_full_numa_nodes(self) -> None:
        self._take_whole(self.free_numa_nodes(), self.t.numa_mask)

    def take_full_sockets(self) -> None:
        self._take_whole(self.free_sockets(), self.t.socket_mask)

    def take_full_uncore_caches(self) -> None:
        self._take_whole(self.free_uncore_caches(), self.t.uncore_mask)

    def take_full_cores(self) -> None:
        self._take_whole(self.free_cores(), self.t.core_mask)

    def take_partial_uncore(self, uncore: int) -> None:
        """Claim the lowest-id cores with free CPUs of this L3 group if their free CPUs match the need exactly."""
        t = self.t
        per_core = t.cpus_per_core or 1
        cores_needed = (self.needed + per_core - 1) // per_core
        live = self.free & t.uncore_mask[uncore]
        cores = [c for c in t.cores_in_uncore[uncore] if t.core_mask[c] & live][:cores_needed]
        mask = 0
        for c in cores:
            mask |= t.core_mask[c] & self.free
        if self.needed % 2 != 0 and t.cpus_per_core > 1 and mask.bit_count() > self.needed:
            mask &= ~(1 << (mask.bit_length() - 1))  # drop the highest CPU id
        if mask.bit_count() == self.needed:
            self.take(mask)

    def take_uncore_caches(self) -> None:
        per_uncore = self.t.cpus_per_uncore
        for uncore in self.sort_uncore_caches():
            if self.needed >= per_uncore:
                self.take_full_uncore_caches()
            if self.satisfied():
                return
            self.take_partial_uncore(uncore)
            if self.satisfied():
                return

    def take_remaining_cpus(self, spread: bool) -> None:
        for cpu in self.free_cpus(spread):
            self.take(1 << cpu)
            if self.satisfied():
                return


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise AllocationError(f"the number of CPUs to take must be a non-negative integer, got {count!r}")


def _round3(x: float) -> float:
    """Go's math.Round(x*1000)/1000 (half away from zero) for the non-negative values used here."""
    return math.floor(x * 1000 + 0.5) / 1000


def _stddev(values: Iterable[int]) -> float:
    """kubelet's balance score: population standard deviation, with the mean and the result rounded to 3 places."""
    xs = list(values)
    mean = _round3(sum(xs) / len(xs))
    return _round3(math.sqrt(sum((x - mean) * (x - mean) for x in xs) / len(xs)))
