"""The estimators behind deadline admission, Retry-After and learned patience."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

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
