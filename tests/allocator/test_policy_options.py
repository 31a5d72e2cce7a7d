"""Static policy options: names, boolean values, forbidden combinations, machine checks (policy_options.go)."""

from __future__ import annotations

import itertools

import pytest

from allocator import ConfigError
from allocator.policy_options import OPTION_NAMES, StaticPolicyOptions, parse_bool
from tests import topologies as T


def test_all_six_options_parse():
    assert len(OPTION_NAMES) == 6
    for name in OPTION_NAMES:
        assert StaticPolicyOptions.parse({name: "true"}).enabled(name)
        assert not StaticPolicyOptions.parse({name: "false"}).enabled(name)
    assert StaticPolicyOptions.parse(None) == StaticPolicyOptions() == StaticPolicyOptions.parse({})


@pytest.mark.parametrize("value", ["1", "t", "T", "TRUE", "true", "True", True])
def test_true_spellings(value):
    assert parse_bool(value, field="x") is True


@pytest.mark.parametrize("value", ["0", "f", "F", "FALSE", "false", "False", False])
def test_false_spellings(value):
    assert parse_bool(value, field="x") is False


@pytest.mark.parametrize("value", ["yes", "", " true", "tRuE", 1, None])
def test_bad_values_name_the_option(value):
    with pytest.raises(ConfigError, match='bad value for option "full-pcpus-only"'):
        StaticPolicyOptions.parse({"full-pcpus-only": value})


def test_unknown_option():
    with pytest.raises(ConfigError, match='unknown CPU Manager Policy option: "full-pcpu-only"'):
        StaticPolicyOptions.parse({"full-pcpu-only": "true"})


def test_options_must_be_a_mapping():
    with pytest.raises(ConfigError, match="cpuManagerPolicyOptions must map"):
        StaticPolicyOptions.parse(["full-pcpus-only"])  # type: ignore[arg-type]


FORBIDDEN = {
    frozenset({"full-pcpus-only", "distribute-cpus-across-cores"}),
    frozenset({"distribute-cpus-across-numa", "distribute-cpus-across-cores"}),
    frozenset({"prefer-align-cpus-by-uncorecache", "distribute-cpus-across-cores"}),
    frozenset({"prefer-align-cpus-by-uncorecache", "distribute-cpus-across-numa"}),
}


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(OPTION_NAMES, 2)))
def test_pairs(a, b):
    opts = {a: "true", b: "true"}
    if frozenset({a, b}) in FORBIDDEN:
        with pytest.raises(ConfigError, match="can not be used at the same time") as exc:
            StaticPolicyOptions.parse(opts)
        assert a in str(exc.value) and b in str(exc.value)
    else:
        parsed = StaticPolicyOptions.parse(opts)
        assert parsed.enabled(a) and parsed.enabled(b)
        assert parsed.to_dict() == {n: "true" for n in OPTION_NAMES if n in (a, b)}


def test_forbidden_pair_off_is_fine():
    opts = StaticPolicyOptions.parse({"full-pcpus-only": "true", "distribute-cpus-across-cores": "false"})
    assert opts.full_pcpus_only and not opts.distribute_cpus_across_cores


def test_first_forbidden_pair_is_reported_in_kubelets_order():
    with pytest.raises(ConfigError) as exc:
        StaticPolicyOptions.parse({n: "true" for n in OPTION_NAMES})
    assert str(exc.value) == (
        "static policy options full-pcpus-only and distribute-cpus-across-cores can not be used at the same time"
    )


def test_align_by_socket_machine_and_topology_manager_checks():
    opts = StaticPolicyOptions.parse({"align-by-socket": "true"})
    opts.validate(T.dual_socket_multi_numa_per_socket_ht(), "restricted")
    with pytest.raises(ConfigError, match="single-numa-node policy is incompatible with CPUManager align-by-socket"):
        opts.validate(T.dual_socket_ht(), "single-numa-node")
    with pytest.raises(ConfigError, match="number of sockets are more than number of NUMA"):
        opts.validate(T.fake_multi_socket_dual_socket_per_numa_ht(), "none")
    # without align-by-socket nothing is checked
    StaticPolicyOptions().validate(T.fake_multi_socket_dual_socket_per_numa_ht(), "single-numa-node")
