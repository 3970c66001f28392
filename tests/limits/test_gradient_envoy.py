"""The Envoy-style ``gradient`` limit follows Envoy's ``gradient_controller.cc`` on three
details (issue 12, item 5):

1. a request admitted before the current min-RTT measurement started never counts,
   during the measurement or after it;
2. an interval without a latency does not count towards the five consecutive
   intervals at the minimum limit that trigger a new measurement;
3. the start-up measurement is open from the start, not from the first sample.

Samples are fed in virtual time (``Sample.now``); nothing sleeps.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loadshed.limits import Gradient, Sample


class Feeder:
    """Feeds a Gradient samples on a virtual clock."""

    def __init__(self, algo: Gradient, now: float = 0.0) -> None:
        self.algo = algo
        self.now = now

    def at(self, now: float, rtt: float, *, dropped: bool = False) -> int:
        """One request released at ``now`` after ``rtt`` seconds (admitted at now - rtt)."""
        self.now = now
        sample = Sample(rtt=rtt, inflight=self.algo.limit, dropped=dropped, now=now)
        return self.algo.update(sample)

    def step(self, step: float, rtt: float, count: int = 1) -> int:
        """``count`` requests of ``rtt`` seconds, one every ``step`` seconds."""
        for _ in range(count):
            self.at(self.now + step, rtt)
        return self.algo.limit

    def admitted_at(self, admitted: float, step: float, count: int) -> int:
        """``count`` requests all admitted at ``admitted``, released every ``step``."""
        for _ in range(count):
            now = self.now + step
            self.at(now, now - admitted)
        return self.algo.limit


def measured_then_reprobing(algo: Gradient) -> tuple[Feeder, float]:
    """Start-up measurement at 0.1 s, the limit grown, then up to the first re-measure.

    Returns the feeder and the time the re-measure started (its epoch).
    """
    feeder = Feeder(algo)
    while algo.probing:
        feeder.step(0.01, 0.1)
    assert algo.min_rtt == pytest.approx(0.1)
    feeder.step(0.01, 0.1, count=100)  # 1 s at the min RTT: the limit grows
    while not algo.probing:
        feeder.step(0.05, 0.1)
    return feeder, feeder.now


# -- 1. requests admitted before the measurement started never count ----------------------


def test_requests_admitted_before_a_re_measure_do_not_count_during_it() -> None:
    envoy = Gradient.published()
    feeder, epoch = measured_then_reprobing(envoy)
    assert envoy.limit == 3  # pinned
    # 200 requests admitted 1 s before the re-measure started: ran at the old limit.
    feeder.admitted_at(epoch - 1.0, 0.01, 200)
    assert envoy.probing
    count = 0
    while envoy.probing:
        feeder.step(0.01, 0.08)
        count += 1
    assert count == 50  # all 50 latencies from requests admitted during the measurement
    assert envoy.min_rtt == pytest.approx(0.08)


@pytest.mark.parametrize("factory", [Gradient.published, Gradient])
def test_requests_admitted_before_a_re_measure_do_not_count_after_it(
    factory: Callable[..., Gradient],
) -> None:
    # Envoy keeps the epoch after the measurement: a request sent before it that
    # finishes later is still disregarded. Before the fix, these slow latencies (a
    # queue built at the old limit) set the interval p50 and halved the limit.
    algo = factory(seed=3)
    algo.passive_probe = False  # always pin: the re-measure is what is tested
    feeder, epoch = measured_then_reprobing(algo)
    while algo.probing:
        feeder.step(0.01, 0.1)
    restored = algo.limit
    assert restored > 3
    before = algo.min_rtt
    # 5 s of intervals that only hear of requests admitted before the re-measure.
    limit = feeder.admitted_at(epoch - 0.5, 0.01, 500)
    assert limit == restored
    assert algo.min_rtt == before
    assert not algo.probing
    # Requests admitted since still count: a slow interval lowers the limit.
    feeder.step(0.01, 1.0, count=3 * int(algo.interval_length / 0.01))
    assert algo.limit < restored


# -- 2. an empty interval does not count towards the five at the minimum -------------------


STEP = 1 / 64  # seconds: exact in binary, so a 100 ms interval closes every 7 samples


def at_the_minimum_for(envoy: Gradient, feeder: Feeder, intervals: int) -> None:
    """``intervals`` 100 ms intervals whose p50 (1 s) keeps the limit at the minimum."""
    for _ in range(intervals):
        feeder.step(STEP, 1.0, count=7)  # the 7th sample closes the interval
        assert envoy.limit == envoy.min_limit


def test_an_empty_interval_does_not_count_towards_a_re_measure() -> None:
    envoy = Gradient.published()
    feeder = Feeder(envoy)
    while envoy.probing:
        feeder.step(STEP, 0.1)
    assert envoy.limit == envoy.min_limit == 3
    starts = envoy.probes_started
    # Two seconds without a request after the measurement: the first interval closes
    # empty, at the minimum. Envoy's controller skips an empty window altogether.
    feeder.step(2.0, 1.0)
    at_the_minimum_for(envoy, feeder, 4)
    assert not envoy.probing
    assert envoy.probes_started == starts
    # The fifth interval at the minimum with latencies triggers the re-measure.
    at_the_minimum_for(envoy, feeder, 1)
    assert envoy.probing
    assert envoy.probes_started == starts + 1


def test_an_empty_interval_does_not_reset_the_count_either() -> None:
    envoy = Gradient.published(seed=1)
    feeder, epoch = measured_then_reprobing(envoy)
    while envoy.probing:
        feeder.step(STEP, 0.1)
    envoy._limit = envoy.min_limit  # white-box: at the floor after the re-measure
    starts = envoy.probes_started
    at_the_minimum_for(envoy, feeder, 2)
    # 20 intervals that only hear of requests admitted before the re-measure: they
    # carry no latency, so they neither set the limit nor touch the count.
    feeder.admitted_at(epoch - 0.5, 0.01, 200)
    assert not envoy.probing and envoy.probes_started == starts
    assert envoy.limit == envoy.min_limit
    at_the_minimum_for(envoy, feeder, 3)
    assert envoy.probing
    assert envoy.probes_started == starts + 1


# -- 3. the start-up measurement is open from the start ----------------------------------


def test_start_up_measurement_counts_requests_admitted_before_the_first_heard_of() -> None:
    # Every request was admitted after the algorithm was built, so all are part of
    # the start-up measurement, including one admitted before the first to finish.
    algo = Gradient(probe_requests=2, probe_timeout=None, passive_probe=False)
    feeder = Feeder(algo)
    feeder.at(1.0, 0.1)  # admitted at 0.9: the first we hear of
    assert algo.probing
    feeder.at(1.05, 0.95)  # admitted at 0.1, before it
    assert not algo.probing
    assert algo.min_rtt == pytest.approx(0.1)  # nearest-rank p50 of (0.1, 0.95)


def test_start_up_measurement_age_counts_from_the_earliest_admission() -> None:
    # probe_timeout (ours) ends a measurement once it is 1 s old. The start-up one
    # started before any request was admitted: no later than the earliest admission
    # seen (0.05 s here), not the admission of the first request heard of (0.5 s).
    algo = Gradient(probe_requests=50, probe_timeout=1.0)
    feeder = Feeder(algo)
    feeder.at(0.6, 0.1)  # admitted at 0.5
    feeder.at(0.9, 0.85)  # admitted at 0.05
    assert algo.probing
    feeder.at(1.06, 0.1)  # 1.01 s after the earliest admission
    assert not algo.probing
    assert algo.min_rtt == pytest.approx(0.1)
