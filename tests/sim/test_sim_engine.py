"""The event loop and the building blocks of the simulator, in virtual time."""

from __future__ import annotations

import random
import statistics

import pytest

from loadshed.clock import VirtualClock
from loadshed.errors import ConfigError
from loadshed.sim.arrivals import Bursts, Constant, Poisson, make_arrivals
from loadshed.sim.engine import Engine
from loadshed.sim.metrics import LimitTrace, Phase, Recorder, percentile
from loadshed.sim.origin import Origin
from loadshed.sim.request import Request, Status
from loadshed.sim.service import (
    ConstantTime,
    ExponentialTime,
    LogNormalTime,
    ServiceModel,
    make_service_time,
)


def test_events_run_in_time_order_and_ties_in_scheduling_order() -> None:
    engine = Engine()
    seen: list[tuple[float, str]] = []

    def note(label: str) -> None:
        seen.append((engine.now(), label))

    engine.at(2.0, note, "c")
    engine.at(1.0, note, "a")
    engine.at(1.0, note, "b")
    engine.at(0.5, lambda _: engine.after(1.0, note, "d"))
    engine.run(10.0)
    assert seen == [(1.0, "a"), (1.0, "b"), (1.5, "d"), (2.0, "c")]
    assert engine.now() == 10.0
    assert engine.events == 5


def test_run_stops_at_until_and_keeps_later_events() -> None:
    clock = VirtualClock()
    engine = Engine(clock)
    seen: list[float] = []
    engine.at(1.0, seen.append, 1.0)
    engine.at(3.0, seen.append, 3.0)
    engine.run(2.0)
    assert seen == [1.0]
    assert clock.now() == 2.0
    assert engine.pending == 1
    engine.run(5.0)
    assert seen == [1.0, 3.0]


def test_constant_arrivals_are_evenly_spaced() -> None:
    rng = random.Random(1)
    arrivals = Constant(4.0)
    assert [arrivals.next_gap(rng) for _ in range(3)] == [0.25, 0.25, 0.25]


def test_poisson_arrivals_have_the_requested_mean_rate() -> None:
    rng = random.Random(7)
    gaps = [Poisson(50.0).next_gap(rng) for _ in range(20_000)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 50, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(1 / 50, rel=0.05)


def test_bursts_come_together_at_the_average_rate() -> None:
    rng = random.Random(1)
    arrivals = Bursts(10.0, size=5)
    gaps = [arrivals.next_gap(rng) for _ in range(10)]
    assert gaps == [0.5, 0, 0, 0, 0, 0.5, 0, 0, 0, 0]
    assert len(gaps) / sum(gaps) == 10.0


def test_bad_arrivals_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"arrivals: .*allowed: constant\|poisson\|bursts"):
        make_arrivals("weekly", 1.0)
    with pytest.raises(ConfigError, match="rate"):
        Constant(0)


@pytest.mark.parametrize("kind", ["constant", "exponential", "lognormal"])
def test_service_distributions_keep_their_mean(kind: str) -> None:
    rng = random.Random(3)
    distribution = make_service_time(kind, 0.2, sigma=0.5)
    samples = [distribution.sample(rng) for _ in range(40_000)]
    assert statistics.fmean(samples) == pytest.approx(0.2, rel=0.02)
    assert min(samples) > 0


def test_lognormal_is_right_skewed() -> None:
    rng = random.Random(3)
    samples = sorted(LogNormalTime(1.0, sigma=0.8).sample(rng) for _ in range(20_000))
    median = samples[len(samples) // 2]
    assert median < 0.9  # mean 1.0, median exp(mu) = exp(-0.32) ~ 0.73


def test_service_change_applies_to_requests_started_after_it() -> None:
    model = ServiceModel(
        ConstantTime(1.0), random.Random(1), after=ExponentialTime(2.0), change_at=10.0
    )
    assert model.sample(9.999) == 1.0
    assert model.mean_at(10.0) == 2.0
    rng_samples = [model.sample(10.0) for _ in range(5)]
    assert len(set(rng_samples)) == 5
    with pytest.raises(ConfigError, match="service_dist"):
        make_service_time("uniform", 1.0)
    with pytest.raises(ConfigError, match="service_time"):
        ConstantTime(0.0)


class _Owner:
    def __init__(self) -> None:
        self.done: list[tuple[float, int, bool]] = []


def _origin(engine: Engine, workers: int, max_queue: int | None = None) -> tuple[Origin, list]:
    finished: list[tuple[float, int, bool]] = []
    origin = Origin(
        engine,
        workers,
        ServiceModel(ConstantTime(1.0), random.Random(1)),
        lambda request, ok: finished.append((engine.now(), request.tag, ok)),
        max_queue=max_queue,
    )
    return origin, finished


def test_origin_serves_fifo_on_its_workers() -> None:
    engine = Engine()
    origin, finished = _origin(engine, workers=2)
    for tag in range(5):
        origin.start(Request(0.0, 10.0, None, tag))
    assert origin.queue_length == 3
    engine.run(100.0)
    assert finished == [
        (1.0, 0, True),
        (1.0, 1, True),
        (2.0, 2, True),
        (2.0, 3, True),
        (3.0, 4, True),
    ]
    assert origin.idle == 2
    assert origin.completed == 5
    assert origin.busy_seconds == 5.0


def test_bounded_origin_queue_answers_503_past_it() -> None:
    engine = Engine()
    origin, finished = _origin(engine, workers=1, max_queue=1)
    for tag in range(3):
        origin.start(Request(0.0, 10.0, None, tag))
    engine.run(10.0)
    assert (0.0, 2, False) in finished
    assert [f for f in finished if f[2]] == [(1.0, 0, True), (2.0, 1, True)]
    assert origin.rejected == 1


def test_origin_keeps_working_for_clients_that_left() -> None:
    engine = Engine()
    origin, finished = _origin(engine, workers=1)
    gone = Request(0.0, 0.1, None, 0)
    gone.client_gone = True
    origin.start(gone)
    engine.run(5.0)
    assert finished == [(1.0, 0, True)]


def test_bad_origin_settings_name_the_field() -> None:
    engine = Engine()
    with pytest.raises(ConfigError, match="workers"):
        _origin(engine, workers=0)
    with pytest.raises(ConfigError, match="origin_queue"):
        _origin(engine, workers=1, max_queue=-1)


def test_recorder_counts_per_phase_and_drops_outside() -> None:
    recorder = Recorder([Phase("before", 0.0, 10.0), Phase("after", 10.0, 20.0)])
    recorder.response(Status.SUCCESS, 0.5, 1.0)
    recorder.response(Status.SUCCESS, 1.5, 12.0)
    recorder.response(Status.REJECTED, 0.001, 12.0)
    recorder.response(Status.ORIGIN_REJECTED, 0.002, 13.0)
    recorder.timed_out(19.0)
    recorder.response(Status.SUCCESS, 1.0, 25.0)  # after the end: not counted
    before = recorder.stats("before").summary()
    after = recorder.stats("after").summary()
    assert before["success"] == 1
    assert before["goodput_rps"] == 0.1
    assert after["success"] == 1
    assert after["rejected"] == 2
    assert after["origin_rejected"] == 1
    assert after["timed_out"] == 1
    assert after["throughput_rps"] == 0.3
    assert after["p99_success_s"] == 1.5
    with pytest.raises(ValueError, match="overlap"):
        Recorder([Phase("a", 0.0, 2.0), Phase("b", 1.0, 3.0)])


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([], 0.5) is None


def test_limit_trace_mean_and_convergence() -> None:
    trace = LimitTrace(0.0, 20)
    trace.record(10.0, 10)
    trace.record(12.0, 5)
    trace.record(13.0, 7)  # settles at 7 from t=13
    trace.record(30.0, 8)  # within ±1 of 7: still settled
    assert trace.mean(0.0, 10.0) == 20.0
    assert trace.mean(10.0, 14.0) == pytest.approx((2 * 10 + 5 + 7) / 4)
    assert trace.value_at(12.5) == 5.0
    assert trace.converge_time(10.0, 40.0) == pytest.approx(3.0)
    never = LimitTrace(0.0, 10)
    for step in range(1, 40):
        never.record(float(step), 10 if step % 2 else 30)
    assert never.converge_time(0.0, 40.0) is None
