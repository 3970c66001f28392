"""The estimators behind deadline admission, Retry-After and learned patience."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadshed.errors import ConfigError
from loadshed.estimate import PatienceEstimator, ServiceTimeEstimator, percentile

finite_times = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)


@given(st.lists(finite_times, min_size=1, max_size=300), st.integers(1, 50))
def test_high_is_the_window_percentile_of_the_last_samples_however_they_arrive(
    values: list[float], window: int
) -> None:
    estimator = ServiceTimeEstimator(window=window, high_quantile=0.9, recent=5)
    for value in values:
        estimator.add(value)
    last = values[-window:]
    latest = values[-5:]
    expected = max(percentile(sorted(last), 0.9), sum(latest) / len(latest))
    assert estimator.high == expected
    assert estimator.samples == len(last)


def test_nan_and_negative_service_times_are_ignored() -> None:
    estimator = ServiceTimeEstimator()
    estimator.add(0.2)
    estimator.add(math.nan)
    estimator.add(-1.0)
    assert estimator.samples == 1
    assert estimator.mean == 0.2 and estimator.high == 0.2


@given(
    st.lists(st.one_of(st.floats(min_value=-1.0, max_value=60.0), st.just(math.nan)), max_size=400)
)
def test_patience_is_a_low_percentile_of_recent_positive_give_ups(waits: list[float]) -> None:
    estimator = PatienceEstimator(quantile=0.1, window=200, min_samples=3)
    for waited in waits:
        estimator.add(waited)
    kept = [w for w in waits if w > 0][-200:]
    if len(kept) < 3:
        assert estimator.patience is None
    else:
        assert estimator.patience == percentile(sorted(kept), 0.1)


def test_early_give_ups_are_outweighed_by_clients_served_after_waiting_longer() -> None:
    # A load test that closed 4 connections after 5 to 8 ms, against a model of 14 ms
    # whose thousand successes each waited longer: nobody leaves by 8 ms in ten.
    estimator = PatienceEstimator()
    for waited in (0.005, 0.006, 0.007, 0.008):
        estimator.add(waited, now=0.0)
    assert estimator.patience == 0.005  # alone, the give-ups are all it knows
    for i in range(1000):
        estimator.served(0.014 + (i % 10) * 0.001, now=0.01 * i)
    assert estimator.patience is None
    assert estimator.earliest is None
    # Clients that leave after 0.1 s, where few were served after so long: learned.
    for _ in range(30):
        estimator.add(0.1, now=10.0)
    assert estimator.patience == pytest.approx(0.1)


def test_patience_is_the_kaplan_meier_quantile_and_old_give_ups_are_forgotten() -> None:
    estimator = PatienceEstimator(quantile=0.5, memory=10.0)
    # 4 served after 1 s, 2 gave up at 2 s, 2 served after 3 s, 2 gave up at 4 s.
    for waited in (1.0, 1.0, 1.0, 1.0):
        estimator.served(waited, now=0.0)
    estimator.add(2.0, now=0.0)
    assert estimator.earliest == 2.0  # one give-up among the 1 at risk at 2 s
    assert estimator.patience is None  # ... but min_samples is 2
    estimator.add(2.0, now=0.0)
    estimator.served(3.0, now=0.0)
    estimator.served(3.0, now=0.0)
    estimator.add(4.0, now=0.0)
    estimator.add(4.0, now=0.0)
    # at 2 s: 2 of 6 at risk leave (S = 2/3); at 4 s: 2 of 2 (S = 0) -> median 4 s
    assert estimator.patience == 4.0
    estimator.served(5.0, now=10.5)  # the give-ups at time 0 are now 10.5 s old
    assert estimator.samples == 0
    assert estimator.patience is None
    for bad in ({"window": 0}, {"served_window": -1}, {"memory": 0.0}):
        with pytest.raises(ConfigError):
            PatienceEstimator(**bad)  # type: ignore[arg-type]


def test_a_few_clients_that_leave_early_do_not_set_everyone_s_patience() -> None:
    # Browsers that navigate away: 5 % of the clients leave after 10 ms, the rest wait
    # and are served after 50 to 500 ms. The p10 of the give-ups alone would be 10 ms
    # (every request that must queue refused); one client in ten does not leave by then.
    estimator = PatienceEstimator()
    for i in range(400):
        if i % 20 == 0:
            estimator.add(0.010, now=i * 0.01)
        else:
            estimator.served(0.05 + (i % 10) * 0.05, now=i * 0.01)
    assert estimator.samples == 20
    assert estimator.patience is None
    # A quarter of them leaving by 10 ms (120 of 500) is a patience of 10 ms.
    for i in range(400, 500):
        estimator.add(0.010, now=i * 0.01)
    assert estimator.patience == pytest.approx(0.010)
