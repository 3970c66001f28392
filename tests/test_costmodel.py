"""Admission by predicted service time (issue 16): the cost model and its use, in
virtual time."""

from __future__ import annotations

import math
import random

import numpy
import pytest

from loadshed.admission import Admission, Ticket, Token
from loadshed.clock import VirtualClock
from loadshed.config import AdmissionConfig
from loadshed.costmodel import MAX_COST, CostModel, check_cost
from loadshed.deadline import HeaderError, parse_cost
from loadshed.errors import ConfigError, Priority, Rejected, RejectReason
from loadshed.limiter import Limiter, Waiting
from loadshed.limits.fixed import Fixed
from loadshed.metrics import LoadshedMetrics
from loadshed.sim.costs import CostDistribution
from loadshed.sim.scenarios import LimiterConfig, run_capacity_change


def test_the_model_converges_on_a_linear_cost_with_noise_and_outliers() -> None:
    rng = random.Random(7)
    model = CostModel()
    assert not model.fitted and model.predict(10) is None
    for _ in range(400):
        cost = rng.uniform(1, 100)
        seconds = (0.02 + 0.003 * cost) * rng.uniform(0.95, 1.05)
        if rng.random() < 0.1:
            seconds += 1.0  # a request that queued or hit a pause: trimmed
        model.add(cost, seconds)
    assert model.fitted
    assert model.intercept == pytest.approx(0.02, abs=0.01)
    assert model.slope == pytest.approx(0.003, rel=0.1)
    assert model.predict(50) == pytest.approx(0.17, rel=0.06)
    high = model.high(50)
    assert high is not None and 0.17 <= high < 0.2


def test_the_model_follows_a_change_within_its_window() -> None:
    model = CostModel(window=32, min_samples=8, refit_every=4)
    for cost in range(1, 65):
        model.add(float(cost), 0.01 * cost)
    assert model.predict(10) == pytest.approx(0.1, rel=0.02)
    for cost in range(1, 65):
        model.add(float(cost), 0.02 * cost)  # the model got twice as slow
    assert model.predict(10) == pytest.approx(0.2, rel=0.02)


def test_without_spread_in_costs_the_time_is_taken_as_proportional() -> None:
    model = CostModel(min_samples=4, refit_every=1)
    for _ in range(8):
        model.add(10.0, 0.5)
    assert model.intercept == 0.0
    assert model.predict(20) == pytest.approx(1.0)


def test_slope_and_intercept_never_go_negative() -> None:
    falling = CostModel(min_samples=4, refit_every=1)
    for cost, seconds in ((1, 0.4), (2, 0.3), (3, 0.2), (4, 0.1)):
        falling.add(cost, seconds)
    assert falling.slope == 0.0 and falling.intercept == pytest.approx(0.25)
    steep = CostModel(min_samples=4, refit_every=1)
    for cost, seconds in ((10, 0.05), (20, 0.25), (30, 0.45), (40, 0.65)):
        steep.add(cost, seconds)  # the line crosses zero at cost 7.5
    assert steep.intercept == 0.0
    assert steep.slope is not None and steep.slope > 0


@pytest.mark.parametrize(
    "bad", [0, -1, float("nan"), float("inf"), MAX_COST * 10, 1e200, "3", True, None]
)
def test_a_bad_cost_is_a_config_error_naming_the_field(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"^cost: must be a number in \(0, 1e\+12\]"):
        check_cost(bad)


def test_one_outlier_among_identical_times_is_trimmed() -> None:
    # A robust spread of 0 (times identical but one) trimmed nothing: 0.072 s for 0.010.
    model = CostModel(min_samples=16, refit_every=1)
    for _ in range(15):
        model.add(10.0, 0.010)
    model.add(10.0, 1.0)
    assert model.predict(10.0) == pytest.approx(0.010)


def test_numpy_numbers_are_costs() -> None:
    # cost=lambda batch: mask.sum() returns a numpy integer: it is a number.
    assert check_cost(numpy.int64(5)) == 5.0
    assert check_cost(numpy.float32(2.5)) == 2.5
    assert check_cost(MAX_COST) == MAX_COST


def test_a_huge_cost_header_is_refused_and_cannot_stall_the_limiter() -> None:
    # X-Request-Cost: 1e200 once overflowed the fit's squares inside a release: the slot
    # was freed but the queue never dispatched again.
    with pytest.raises(HeaderError, match="1e200"):
        parse_cost("1e200")
    model = CostModel(min_samples=4, refit_every=1)
    for cost in (1.0, MAX_COST, 2.0, MAX_COST, 3.0):
        model.add(cost, cost * 1e-9 + 0.01)
    prediction = model.predict(MAX_COST)
    assert prediction is not None and math.isfinite(prediction)


def test_retry_after_stays_within_an_hour_whatever_is_queued() -> None:
    clock = VirtualClock()
    adm = Admission(Fixed(1), clock)
    _warm(adm, clock, 0.0, 0.01)
    adm.try_acquire(cost=1)
    # The largest cost queued: 1e10 s of predicted work (it was a 306-digit header, and
    # with two of them in a queue an infinite one that failed the refusal with a 500).
    adm.submit(cost=MAX_COST, on_grant=lambda _: None, on_reject=lambda _: None)
    assert adm.retry_after() == 3600.0
    with pytest.raises(Rejected) as info:
        adm.submit(cost=MAX_COST, on_grant=lambda _: None, on_reject=lambda _: None)
    assert info.value.retry_after == 3600.0


def test_a_starting_model_is_validated_and_used_until_fitted() -> None:
    with pytest.raises(ConfigError, match="initial_cost_model"):
        AdmissionConfig(initial_cost_model=(0.1,))  # type: ignore[arg-type]
    # Named as the user wrote it: the setting, then the model's own field.
    with pytest.raises(ConfigError, match=r"^initial_cost_model: cost_slope: must be"):
        AdmissionConfig(initial_cost_model=(0.1, -1.0))
    config = AdmissionConfig(initial_cost_model=(0.01, 0.002))
    adm = Admission(Fixed(4), VirtualClock(), config=config)
    assert adm.cost_model.predict(100) == pytest.approx(0.21)


def _warm(adm: Admission, clock: VirtualClock, intercept: float, slope: float) -> None:
    """Successes of costs 1..40 at intercept + slope x cost, one at a time."""
    for cost in range(1, 41):
        token = adm.try_acquire(cost=cost)
        clock.advance(intercept + slope * cost)
        token.success()


def test_at_a_free_slot_a_big_request_that_would_miss_is_refused_a_small_one_admitted() -> None:
    clock = VirtualClock()
    adm = Admission(Fixed(4), clock)
    _warm(adm, clock, 0.01, 0.01)  # cost 100: 1.01 s; cost 5: 0.06 s; mean ~0.2 s
    with pytest.raises(Rejected) as info:
        adm.try_acquire(deadline=clock.now() + 0.5, cost=100)
    assert info.value.reason is RejectReason.DEADLINE
    token = adm.try_acquire(deadline=clock.now() + 0.1, cost=5)
    assert isinstance(token, Token)
    # Cost-blind, the same deadline is judged on the shorter of the mean and the last
    # success (cost 40: 0.41 s): the big request would have been admitted to time out.
    blind = adm.try_acquire(deadline=clock.now() + 0.5)
    assert isinstance(blind, Token)


def test_in_the_queue_the_predicted_work_ahead_decides() -> None:
    clock = VirtualClock()
    adm = Admission(Fixed(1), clock, max_queue_wait=10)
    _warm(adm, clock, 0.0, 0.01)
    busy = adm.try_acquire(cost=1)
    granted: list[str] = []

    def submit(label: str, cost: float, deadline: float) -> Token | Ticket:
        return adm.submit(
            deadline=clock.now() + deadline,
            cost=cost,
            on_grant=lambda _: granted.append(label),
            on_reject=lambda _: None,
        )

    # 3 s of predicted work queued ahead (cost 300), so a request due in 2 s cannot make it...
    assert isinstance(submit("big", 300, 10.0), Ticket)
    with pytest.raises(Rejected) as info:
        submit("late", 1, 2.0)
    assert info.value.reason is RejectReason.DEADLINE
    # ...but one due in 4 s can, and Retry-After counts the work queued, not the requests.
    assert isinstance(submit("small", 1, 4.0), Ticket)
    assert adm.retry_after() == pytest.approx(3.01 + adm.service.mean, rel=0.01)
    busy.success()
    assert granted == ["big"]


def test_costs_are_counted_admitted_refused_and_completed() -> None:
    clock = VirtualClock()
    adm = Admission(Fixed(1), clock, max_queue=0)
    token = adm.try_acquire(cost=3)
    with pytest.raises(Rejected):
        adm.try_acquire(cost=5)
    clock.advance(0.1)
    token.success()
    assert adm.cost_counts == {"admitted": 3.0, "refused": 5.0, "completed": 3.0}


def _trace(adm: Admission, clock: VirtualClock, costs: list[float | None]) -> list[object]:
    """Decisions and retry-after values of a fixed sequence of requests."""
    out: list[object] = []
    tokens: list[Token] = []
    for index, cost in enumerate(costs):
        clock.advance(0.013 * (index % 7))
        if tokens and index % 3 == 0:
            tokens.pop(0).success()
        try:
            result = adm.submit(
                deadline=clock.now() + 0.05 * (index % 5 + 1),
                cost=cost,
                on_grant=tokens.append,
                on_reject=lambda _: None,
            )
        except Rejected as error:
            out.append((error.reason, round(error.retry_after, 9)))
            continue
        if isinstance(result, Token):
            tokens.append(result)
        out.append((type(result).__name__, round(adm.retry_after(), 9)))
    return out


def test_costs_change_nothing_until_the_model_is_fitted() -> None:
    # The same 200 requests, without costs and with costs (log-uniform 1..100) under a
    # model that cannot fit yet: every decision and Retry-After identical, and the costs
    # only counted. (Costs drive admission only through a fitted model.)
    rng = random.Random(3)
    costs: list[float | None] = [math.exp(rng.uniform(0.0, math.log(100.0))) for _ in range(200)]
    clocks = VirtualClock(), VirtualClock()
    blind = Admission(Fixed(2), clocks[0], max_queue=8)
    told = Admission(Fixed(2), clocks[1], max_queue=8)
    told.cost_model = CostModel(window=1000, min_samples=1000)
    assert _trace(blind, clocks[0], [None] * 200) == _trace(told, clocks[1], costs)
    assert blind.cost_model.samples == 0 and not blind.cost_model.fitted
    assert told.cost_model.samples > 0 and told.cost_counts["admitted"] > 0
    # With a model that fits, the same costs do change decisions: the check can fail.
    clocks = VirtualClock(), VirtualClock()
    fitted = Admission(Fixed(2), clocks[1], max_queue=8)
    fitted.cost_model = CostModel(min_samples=4, refit_every=1)
    assert _trace(Admission(Fixed(2), clocks[0], max_queue=8), clocks[0], [None] * 200) != (
        _trace(fitted, clocks[1], costs)
    )


def test_a_simulated_run_with_costs_admitted_blind_matches_no_costs_told() -> None:
    """``--cost-blind`` sends the same traffic as cost-aware, and without ``--cost-dist``
    the scenario is the one it always was (no cost keys in its steps)."""
    settings = {
        "limiter": LimiterConfig("little"),
        "workers": 2,
        "service_time": 0.05,
        "change_to": 0.05,
        "dist": "constant",
        "rate": 80.0,
        "arrivals": "poisson",
        "client_workers": 0,
        "timeout": 0.15,
        "origin_queue": None,
        "duration": 20.0,
    }
    plain = run_capacity_change(**settings)
    assert "goodput_cost_ratio" not in plain["steps"][0]
    aware = run_capacity_change(**settings, cost_dist="loguniform:1:100")
    blind = run_capacity_change(**settings, cost_dist="loguniform:1:100", cost_blind=True)
    assert aware["steps"][0]["sent"] == blind["steps"][0]["sent"]
    # Told the costs, little refuses the big requests that cannot make it and serves
    # more within the deadline, on both counts (with exponential service times and few
    # workers, cost units only about even: bench/results/cost_aware.md).
    for phase in range(2):
        assert aware["steps"][phase]["goodput_rps"] > blind["steps"][phase]["goodput_rps"]
        assert (
            aware["steps"][phase]["goodput_cost_ratio"]
            > blind["steps"][phase]["goodput_cost_ratio"]
        )


def test_cost_distributions_parse_and_keep_the_mean_service_time() -> None:
    dist = CostDistribution.parse("loguniform:1:100")
    rng = random.Random(3)
    sizes = [dist.size(dist.sample(rng)) for _ in range(20_000)]
    assert sum(sizes) / len(sizes) == pytest.approx(1.0, rel=0.03)
    assert CostDistribution.parse("constant:4").size(4) == pytest.approx(1.0)
    for bad in ("lognormal:1:2", "uniform:1", "uniform:5:1", "loguniform:0:10", "constant:x"):
        with pytest.raises(ConfigError, match="cost_dist"):
            CostDistribution.parse(bad)
    with pytest.raises(ConfigError, match="cost_fixed"):
        CostDistribution.parse("uniform:1:2", fixed=1.0)


# ------------------------------------------------ fixes from a review of issue 16


def _feed(model: CostModel, rng: random.Random, count: int, scale: float) -> None:
    """``count`` successes of costs 1..100 at scale x (10 ms + 1 ms x cost), +-5 %."""
    for _ in range(count):
        cost = rng.uniform(1, 100)
        model.add(cost, scale * (0.01 + 0.001 * cost) * rng.uniform(0.95, 1.05))


def test_isolated_slow_samples_still_move_nothing() -> None:
    rng = random.Random(9)
    model = CostModel()
    _feed(model, rng, 200, 1.0)
    before = model.predict(50)
    assert before is not None
    model.add(50.0, 1000.0)  # one huge sample
    _feed(model, rng, 7, 1.0)
    for _ in range(3):  # then 3 slow in every 8 (fewer than half): outliers, trimmed
        for _ in range(3):
            model.add(50.0, 2.0)
        _feed(model, rng, 5, 1.0)
    assert model.samples == 64
    assert model.predict(50) == pytest.approx(before, rel=0.03)
    high = model.high(50)
    assert high is not None and high < 1.1 * before
    # Refitted at every sample: one slow sample is trimmed.
    single = CostModel(min_samples=8, refit_every=1)
    for cost in range(1, 21):
        single.add(float(cost), 0.01 * cost)
    single.add(10.0, 50.0)
    single.add(11.0, 0.11)
    assert single.predict(10) == pytest.approx(0.1)


def test_refit_every_is_honoured_when_min_samples_is_the_window() -> None:
    # count == min_samples held for every sample once the window was full: a fit on
    # every success.
    rng = random.Random(11)
    model = CostModel(window=16, min_samples=16, refit_every=8)
    fits: list[int] = []
    slope: float | None = None
    for index in range(1, 65):
        cost = rng.uniform(1, 100)
        model.add(cost, (0.01 + 0.001 * cost) * rng.uniform(0.9, 1.1))
        if model.slope != slope:
            fits.append(index)
            slope = model.slope
    assert fits == [16, 24, 32, 40, 48, 56, 64]
    for window, min_samples, refit_every in ((2, 2, 1), (16, 16, 1), (16, 16, 100)):
        CostModel(window=window, min_samples=min_samples, refit_every=refit_every)
    with pytest.raises(ConfigError, match=r"^cost_min_samples: must be an integer >= 2 and <= 16"):
        CostModel(window=16, min_samples=17)
    with pytest.raises(ConfigError, match=r"^cost_refit_every: must be an integer >= 1"):
        CostModel(refit_every=0)


def _submit(
    adm: Admission,
    outcomes: list[str],
    label: str,
    *,
    cost: float | None = None,
    deadline: float | None = None,
    priority: Priority = Priority.DEFAULT,
) -> Token | Ticket:
    """Submit; ``label`` goes to ``outcomes`` when granted, ``label:<reason>`` when evicted."""
    return adm.submit(
        priority=priority,
        deadline=deadline,
        cost=cost,
        on_grant=lambda _: outcomes.append(label),
        on_reject=lambda error: outcomes.append(f"{label}:{error.reason.value}"),
    )


def _full(
    limit: int, *, max_queue: int = 1000, max_queue_wait: float
) -> tuple[VirtualClock, Admission, list[Token]]:
    """An admission fitted at 0.01 s per unit of cost (mean ~0.2 s), every one of its
    ``limit`` slots held by a request of cost 1."""
    clock = VirtualClock()
    adm = Admission(Fixed(limit), clock, max_queue=max_queue, max_queue_wait=max_queue_wait)
    _warm(adm, clock, 0.0, 0.01)
    return clock, adm, [adm.try_acquire(cost=1) for _ in range(limit)]


def _queued_cost(adm: Admission) -> tuple[int, list[int], list[float]]:
    """The per-class cost bookkeeping of the queue."""
    return adm._queued_costed, list(adm._costed_by_priority), list(adm._cost_by_priority)


_EMPTY = (0, [0, 0, 0], [0.0, 0.0, 0.0])


def test_a_costed_fifo_queue_is_full_in_time_when_its_predicted_work_fills_the_bound() -> None:
    _, adm, busy = _full(2, max_queue_wait=1.0)  # cost 60: 0.6 s
    out: list[str] = []
    for label in "abcd":  # 0.6 s each over 2 slots: 0.9 s ahead of the fourth, 1.2 s after
        assert isinstance(_submit(adm, out, label, cost=60), Ticket)
    refused = adm.cost_counts["refused"]
    for cost in (1, None):  # whatever it costs itself, and with no cost at all
        with pytest.raises(Rejected) as info:
            _submit(adm, out, "late", cost=cost)
        assert info.value.reason is RejectReason.LIMIT
    assert adm.cost_counts["refused"] == refused + 1
    assert adm.counts["rejected:limit"] == 2
    # Blind to the costs, four requests ahead are 4 x 0.2 s / 2 slots: it would queue.
    blind = Admission(Fixed(2), VirtualClock(), max_queue_wait=1.0)
    blind.service = adm.service
    blind_busy = [blind.try_acquire(), blind.try_acquire()]
    for label in "abcd":
        _submit(blind, out, label)
    assert isinstance(_submit(blind, out, "e"), Ticket)
    for token in busy + blind_busy:
        token.success()
    assert out == ["a", "b", "a", "b"]


def test_one_huge_queued_request_does_not_fill_the_queue_in_time() -> None:
    # A request predicted at 100 s, without a deadline, queued FIFO: its work over two
    # slots filled the 1 s bound, and every later request was refused until it left.
    # It counts for at most the bound: it holds one slot while the other drains.
    _, adm, busy = _full(2, max_queue_wait=1.0)  # cost 10,000: 100 s
    out: list[str] = []
    assert isinstance(_submit(adm, out, "huge", cost=10_000), Ticket)
    assert isinstance(_submit(adm, out, "huge2", cost=10_000), Ticket)
    # Two of them hold both slots for 100 s: now the queue is full in time.
    for cost in (1, None):
        with pytest.raises(Rejected) as info:
            _submit(adm, out, "small", cost=cost)
        assert info.value.reason is RejectReason.LIMIT
    # Retry-After still counts the whole predicted work.
    assert adm.retry_after() == pytest.approx((200 + adm.service.mean) / 2)  # type: ignore[operator]
    busy[0].success()
    assert out == ["huge"]
    assert isinstance(_submit(adm, out, "small", cost=1), Ticket)
    assert isinstance(_submit(adm, out, "blind"), Ticket)
    # With one slot, the huge one does hold everything behind it: refused.
    _, one, one_busy = _full(1, max_queue_wait=1.0)
    assert isinstance(_submit(one, out, "huge", cost=10_000), Ticket)
    with pytest.raises(Rejected):
        _submit(one, out, "small", cost=1)
    one_busy[0].success()


def test_an_evicted_costed_ticket_leaves_nothing_behind() -> None:
    clock, adm, (busy,) = _full(1, max_queue=2, max_queue_wait=1.0)
    refused = adm.cost_counts["refused"]
    out: list[str] = []
    # Queue timeout: waited the whole bound.
    _submit(adm, out, "slow", cost=20)
    clock.advance(1.0)
    adm.expire()
    assert out == ["slow:queue_timeout"] and _queued_cost(adm) == _EMPTY
    # Deadline: evicted when its own high time no longer fits before its deadline.
    _submit(adm, out, "due", cost=20, deadline=clock.now() + 0.8)
    expiry = adm.next_expiry()
    assert expiry is not None
    assert expiry == pytest.approx(clock.now() + 0.6)  # 0.8 s less its own 0.2 s
    clock.set(expiry)
    adm.expire()
    assert out[-1] == "due:deadline" and _queued_cost(adm) == _EMPTY
    # Priority: a full queue makes room for a more critical request.
    _submit(adm, out, "shed", cost=0.1, priority=Priority.SHEDDABLE)
    _submit(adm, out, "shed2", cost=0.2, priority=Priority.SHEDDABLE)
    assert _queued_cost(adm) == (2, [0, 0, 2], [0.0, 0.0, pytest.approx(0.3)])
    _submit(adm, out, "vip", cost=5, priority=Priority.CRITICAL)
    assert out[-1] == "shed:priority"
    assert _queued_cost(adm) == (2, [1, 0, 1], [5.0, 0.0, pytest.approx(0.2)])
    assert adm.cost_counts["refused"] == pytest.approx(refused + 20 + 20 + 0.1)
    busy.success()
    assert out[-1] == "vip"
    adm.expire()
    clock.advance(1.0)
    adm.expire()
    assert out[-1] == "shed2:queue_timeout" and _queued_cost(adm) == _EMPTY
    assert adm.counts["rejected:priority"] == 1


def test_with_priorities_only_the_work_at_or_above_a_class_is_ahead_of_it() -> None:
    clock, adm, (busy,) = _full(1, max_queue_wait=10.0)
    out: list[str] = []
    assert isinstance(_submit(adm, out, "big", cost=300), Ticket)  # 3 s, default class
    due = clock.now() + 1.0
    # 3 s of work is queued, but not ahead of a critical request: it can make 1 s.
    assert isinstance(
        _submit(adm, out, "vip", cost=1, deadline=due, priority=Priority.CRITICAL), Ticket
    )
    for priority in (Priority.DEFAULT, Priority.SHEDDABLE):
        with pytest.raises(Rejected) as info:
            _submit(adm, out, "late", cost=1, deadline=due, priority=priority)
        assert info.value.reason is RejectReason.DEADLINE
    assert _queued_cost(adm) == (2, [1, 1, 0], [1.0, 300.0, 0.0])
    busy.success()
    assert out == ["vip"]


async def test_the_cost_bookkeeping_is_back_to_zero_after_cancel_evict_and_close() -> None:
    clock = VirtualClock()
    limiter = Limiter(1, clock=clock, max_queue=3, max_queue_wait=1.0)
    adm = limiter.admission
    busy = limiter.try_acquire(cost=1)
    waits: list[Waiting] = []
    for cost, priority in zip((0.1, 0.2, 0.7), Priority, strict=True):
        entry = limiter.enter(cost=cost, priority=priority)
        assert isinstance(entry, Waiting)
        waits.append(entry)
    assert _queued_cost(adm) == (3, [1, 1, 1], [0.1, 0.2, 0.7])
    waits[1].cancel()  # the client left
    assert _queued_cost(adm) == (2, [1, 0, 1], [0.1, 0.0, 0.7])
    entry = limiter.enter(priority=Priority.DEFAULT)  # one without a cost
    assert isinstance(entry, Waiting)
    waits.append(entry)
    assert _queued_cost(adm) == (2, [1, 0, 1], [0.1, 0.0, 0.7])
    vip = limiter.enter(cost=3, priority=Priority.CRITICAL)  # the queue is full (3)...
    assert isinstance(vip, Waiting)
    with pytest.raises(Rejected) as info:  # ...: the sheddable one made room
        await waits[2].wait()
    assert info.value.reason is RejectReason.PRIORITY
    assert _queued_cost(adm) == (2, [2, 0, 0], [pytest.approx(3.1), 0.0, 0.0])
    busy.success()
    assert (await waits[0].wait()).cost == 0.1
    assert _queued_cost(adm) == (1, [1, 0, 0], [3.0, 0.0, 0.0])
    assert limiter.close() == 2  # the critical one of cost 3, and the one without
    for waiting in (vip, waits[3]):
        with pytest.raises(Rejected) as info:
            await waiting.wait()
        assert info.value.reason is RejectReason.SHUTDOWN
    assert _queued_cost(adm) == _EMPTY
    assert adm.queue_length == 0
    assert adm.cost_counts["refused"] == pytest.approx(0.2 + 0.7 + 3)


async def test_a_request_refused_after_close_counts_its_cost() -> None:
    # _refuse_closed counted the refusal but not its cost.
    limiter = Limiter(1, clock=VirtualClock())
    metrics = LoadshedMetrics()
    metrics.track(limiter)
    limiter.close()
    with pytest.raises(Rejected) as info:
        limiter.try_acquire(cost=5)
    assert info.value.reason is RejectReason.SHUTDOWN
    with pytest.raises(Rejected):
        limiter.enter(cost=2.5)
    with pytest.raises(Rejected):
        await limiter.acquire(cost=1.5)
    with pytest.raises(Rejected):
        limiter.try_acquire()  # no cost: counted, nothing added
    assert limiter.admission.cost_counts == {"admitted": 0.0, "refused": 9.0, "completed": 0.0}
    assert limiter.admission.counts["rejected:shutdown"] == 4
    labels = {"limiter": "default", "event": "refused"}
    assert metrics.registry.get_sample_value("loadshed_cost_total", labels) == 9.0
    # A bad cost is a ConfigError, as before close.
    with pytest.raises(ConfigError, match=r"^cost: must be a number in \(0, 1e\+12\]"):
        limiter.try_acquire(cost=-1)


def _shortest_full(
    limit: int, *, max_queue_wait: float = 10.0, discipline: str = "shortest"
) -> tuple[VirtualClock, Admission, list[Token]]:
    """An admission with ``discipline`` fitted at 0.01 s per unit of cost (mean ~0.3 s
    after the warm-up's rising costs), every one of its ``limit`` slots held."""
    clock = VirtualClock()
    adm = Admission(Fixed(limit), clock, max_queue_wait=max_queue_wait, discipline=discipline)
    _warm(adm, clock, 0.0, 0.01)
    return clock, adm, [adm.try_acquire(cost=1) for _ in range(limit)]


def test_the_shortest_discipline_grants_the_shortest_predicted_first() -> None:
    _, adm, busy = _shortest_full(1)
    mean = adm.service.mean
    assert mean is not None and 0.1 < mean < 1.0  # a request with no cost sits at the mean
    out: list[str] = []
    granted: list[Token] = []
    for label, cost in (("big", 100), ("none", None), ("mid", 10), ("small", 1), ("tie", 1)):
        ticket = adm.submit(
            cost=cost,
            on_grant=lambda token, label=label: (out.append(label), granted.append(token)),
            on_reject=lambda error: out.append(error.reason.value),
        )
        assert isinstance(ticket, Ticket)
    busy[0].success()
    for _ in range(4):
        granted[-1].success()
    assert out == ["small", "tie", "mid", "none", "big"]  # equals: the oldest first
    granted[-1].success()
    assert adm.queue_length == 0 and _queued_cost(adm) == _EMPTY


def test_under_the_shortest_discipline_a_small_request_is_not_judged_behind_big_ones() -> None:
    # One slot, five requests of 1 s queued: FIFO judges a 10 ms request 5 s away and
    # refuses it by its 0.5 s deadline; shortest-first serves it next, and admits it.
    for discipline, expected in (("fifo", "refused"), ("shortest", "granted first")):
        clock, adm, busy = _shortest_full(1, discipline=discipline)
        out: list[str] = []
        for index in range(5):
            _submit(adm, out, f"big{index}", cost=100)
        try:
            _submit(adm, out, "small", cost=1, deadline=clock.now() + 0.5)
        except Rejected as error:
            assert error.reason is RejectReason.DEADLINE
            outcome = "refused"
        else:
            busy[0].success()
            outcome = "granted first" if out[:1] == ["small"] else f"granted after {out}"
        assert outcome == expected, discipline


def test_the_shortest_discipline_without_costs_is_fifo() -> None:
    # No cost told, or costs under a model not fitted yet: every decision and
    # Retry-After as FIFO's.
    rng = random.Random(5)
    costs: list[float | None] = [math.exp(rng.uniform(0.0, math.log(100.0))) for _ in range(200)]
    for told in ([None] * 200, costs):
        traces = []
        for discipline in ("fifo", "shortest"):
            clock = VirtualClock()
            adm = Admission(Fixed(2), clock, max_queue=8, discipline=discipline)
            adm.cost_model = CostModel(window=1000, min_samples=1000)
            traces.append(_trace(adm, clock, told))
        assert traces[0] == traces[1]


def test_a_simulated_costed_run_serves_more_requests_shortest_first() -> None:
    """Same seed, same traffic (costs log-uniform over 1..100, deadlines sent, 2x load on
    4 workers): granting the shortest predicted first meets more deadlines than FIFO
    (bench/cost_aware.py --discipline shortest has the matrix)."""
    goodput = {}
    for discipline in ("fifo", "shortest"):
        result = run_capacity_change(
            limiter=LimiterConfig("fixed:4", discipline=discipline),
            workers=4,
            service_time=0.1,
            change_to=0.1,
            dist="exponential",
            rate=80.0,
            arrivals="poisson",
            client_workers=0,
            timeout=0.3,
            origin_queue=None,
            duration=30.0,
            cost_dist="loguniform:1:100",
            seed=1,
        )
        goodput[discipline] = sum(step["goodput_rps"] for step in result["steps"])
    assert goodput["shortest"] > 1.05 * goodput["fifo"]


def test_work_and_excess_are_relative_to_the_mean_cost_of_successes() -> None:
    model = CostModel(min_samples=4)
    assert model.work(10.0) == 1.0 and model.excess(10.0) == 0.0  # nothing fitted
    for cost in (1.0, 3.0, 1.0, 3.0):
        model.add(cost, 0.01 + 0.02 * cost)
    assert model.mean_cost == pytest.approx(2.0)
    # A mean success takes 0.05 s: cost 5 is 0.11 s, 2.2 of it and 0.06 s more.
    assert model.work(5.0) == pytest.approx(2.2)
    assert model.excess(5.0) == pytest.approx(0.06)
    assert model.excess(1.0) == pytest.approx(-0.02)


@pytest.mark.parametrize(
    ("dist", "load", "seed"),
    [
        ("exponential", 60.0, 2),
        ("exponential", 120.0, 1),
        ("lognormal", 120.0, 1),
        ("lognormal", 120.0, 2),
    ],
)
def test_little_told_the_costs_holds_near_the_workers_when_cheap_requests_go_first(
    dist: str, load: float, seed: int
) -> None:
    """4 workers, costs log-uniform over 1..100, served shortest first: bursts of cheap
    requests end together. Measured as counted requests, they read as 10 to 40 workers
    and little held a mean limit of 7 to 13 in these runs; measured as mean requests
    (latency less the cost's excess, completions weighed by work) it stays near 4
    (bench/results/cost_trace_w4_stop51.md)."""
    result = run_capacity_change(
        limiter=LimiterConfig("little", discipline="shortest"),
        workers=4,
        service_time=0.1,
        change_to=0.1,
        dist=dist,
        sigma=0.5,
        rate=load,
        arrivals="poisson",
        client_workers=0,
        timeout=0.3,
        origin_queue=None,
        duration=max(60.0, 6000 / load),  # as bench/cost_aware.py
        cost_dist="loguniform:1:100",
        cost_fixed=0.1,
        seed=seed,
    )
    mean_limit = result["steps"][0]["mean_limit"]
    assert 3.0 <= mean_limit <= 6.5, mean_limit
