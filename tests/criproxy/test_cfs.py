from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nodeagent.node.cfs import milli_cpu_to_quota, milli_cpu_to_shares, quota_to_milli_cpu, shares_to_milli_cpu


def test_kubelet_values() -> None:
    assert milli_cpu_to_shares(0) == 2
    assert milli_cpu_to_shares(1) == 2
    assert milli_cpu_to_shares(1000) == 1024
    assert milli_cpu_to_shares(1500) == 1536
    assert milli_cpu_to_shares(10**6) == 262144
    assert milli_cpu_to_quota(0) == 0
    assert milli_cpu_to_quota(1) == 1000  # MinQuotaPeriod
    assert milli_cpu_to_quota(2000) == 200000
    assert milli_cpu_to_quota(250, 50000) == 12500
    assert quota_to_milli_cpu(-1, 100000) is None
    assert quota_to_milli_cpu(0, 100000) is None
    assert quota_to_milli_cpu(150000, 100000) == 1500
    assert shares_to_milli_cpu(2) == 0
    with pytest.raises(ValueError):
        milli_cpu_to_shares(-1)


@settings(max_examples=200, deadline=None)
@given(st.integers(3, 256000))
def test_shares_round_trip_for_every_request(milli: int) -> None:
    shares = milli_cpu_to_shares(milli)
    back = shares_to_milli_cpu(shares)
    assert milli_cpu_to_shares(back) == shares and back <= milli


@settings(max_examples=200, deadline=None)
@given(st.integers(10, 10**6), st.sampled_from([100000, 50000, 1000000]))
def test_quota_round_trip(milli: int, period: int) -> None:
    assume(milli * period // 1000 >= 1000)  # below that kubelet clamps to MinQuotaPeriod
    assert quota_to_milli_cpu(milli_cpu_to_quota(milli, period), period) == milli
