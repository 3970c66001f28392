"""The ``Little`` limit: unit behaviour on crafted samples, and the reference
experiments in the simulator's virtual time (deterministic, no sleeping)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from limit_feeds import feed_fifo_origin, varied_fifo_limits
from loadshed.limits.base import Sample
from loadshed.limits.knee import fit_knee
from loadshed.limits.little import Little
from loadshed.sim import scenarios
from loadshed.sim.scenarios import (
    LimiterConfig,
    ServiceConfig,
    run_capacity_change,
    run_fleet,
    run_paradox,
)


@pytest.mark.parametrize("workers", [1, 7, 32])
def test_finds_the_worker_count_of_a_saturated_origin(workers: int) -> None:
    little = Little()
    feed_fifo_origin(little, workers=workers, service=0.1, seconds=60)
    assert abs(little.limit - workers) <= 1
    assert little.estimate() == pytest.approx(workers, rel=0.15)


def test_low_traffic_neither_shrinks_the_limit_nor_probes() -> None:
    little = Little(initial_limit=10)
    for i in range(200):  # one request at a time, nobody waiting
        little.update(Sample(rtt=0.05, inflight=1, dropped=False, now=0.1 * i, queued=0))
    assert little.limit == 10
    assert little.state in ("startup", "drain", "cruise")


def test_limit_backs_off_when_every_request_ends_at_the_timeout() -> None:
    little = Little(initial_limit=20)
    for i in range(200):
        little.update(Sample(rtt=2.0, inflight=min(20, little.limit), dropped=True, now=i * 0.1))
    assert little.limit < 20  # never drifts upward on timeouts


def test_drops_of_requests_admitted_under_a_higher_limit_do_not_back_off() -> None:
    little = Little(initial_limit=4)
    for i in range(50):
        little.update(Sample(rtt=2.0, inflight=40, dropped=True, now=i * 0.1))
    assert little.limit == 4


def test_e1_throughput_paradox_goodput_at_every_client_count() -> None:
    result = run_paradox(limiter=LimiterConfig("little"), clients=(1, 4, 16), duration=30)
    for step in result["steps"]:
        assert step["goodput_ratio"] >= 0.97, step
        assert step["p99_success_s"] < 2.0, step


def test_e1_without_protection_collapses() -> None:
    result = run_paradox(limiter=LimiterConfig("none"), clients=(4,), duration=30)
    assert result["steps"][0]["goodput_ratio"] < 0.25


def test_e2_capacity_change_with_deadlines() -> None:
    result = run_capacity_change(limiter=LimiterConfig("little"))
    after = next(step for step in result["steps"] if step["phase"] == "after")
    assert after["goodput_ratio"] >= 0.94, after
    assert after["p99_success_s"] <= 2.5
    assert result["converge_s"] is not None and result["converge_s"] <= 10


def test_e2_capacity_change_with_learned_patience_only() -> None:
    result = run_capacity_change(limiter=LimiterConfig("little"), send_deadline=False)
    after = next(step for step in result["steps"] if step["phase"] == "after")
    # Target 0.90, met with no margin (see the table in docs/benchmarks.md).
    assert after["goodput_ratio"] >= 0.899, after


VARIABLE = [
    pytest.param(ServiceConfig(0.1, dist="exponential"), id="exponential"),
    pytest.param(ServiceConfig(0.1, dist="lognormal", sigma=0.5), id="lognormal-0.5"),
    pytest.param(ServiceConfig(0.1, dist="lognormal", sigma=1.0), id="lognormal-1"),
]


@pytest.mark.parametrize("service", VARIABLE)
def test_widely_varying_service_times_keep_the_workers_busy(service: ServiceConfig) -> None:
    """Rate x minimum latency undercounted the workers (limit 1, goodput 0.13 of
    capacity); means of the requests that saw no queue find them."""
    result = run_paradox(
        limiter=LimiterConfig("little"),
        clients=(64,),
        workers=8,
        service=service,
        timeout=0.5,
        duration=20,
    )
    step = result["steps"][0]
    assert step["goodput_ratio"] >= 0.75, step
    assert 6 <= step["mean_limit"] <= 16, step


def _first_3_seconds_heavy_tailed(seed: int) -> float:
    """Goodput share of 64 closed-loop clients on 8 log-normal (sigma 1) workers of
    100 ms, 0.5 s timeout, over the first 3 s."""
    result = run_paradox(
        limiter=LimiterConfig("little"),
        clients=(64,),
        workers=8,
        service=ServiceConfig(0.1, dist="lognormal", sigma=1.0),
        timeout=0.5,
        duration=3,
        seed=seed,
    )
    return float(result["steps"][0]["goodput_ratio"])


@pytest.mark.parametrize("seed", [1, 2])
def test_heavy_tailed_start_up_does_not_back_off_before_the_spread_is_known(seed: int) -> None:
    """Start-up on minima cannot tell a slow request from a queue before it has seen
    the spread: one long log-normal request cut it to the estimate from minima (a slot
    or two) until means turned on, and the first 3 s served 0.72 and 0.73 of capacity
    (seeds 1, 2); it now runs on until the spread is known."""
    assert _first_3_seconds_heavy_tailed(seed) >= 0.85


def test_known_limit_variable_service_takes_seconds_to_settle() -> None:
    """Documented limit (module docstring): means need more samples than minima, so
    on some seeds the first seconds at 100 ms per request still run below the worker
    count (seed 3: 0.70 of capacity over the first 3 s)."""
    assert _first_3_seconds_heavy_tailed(3) < 0.9


def test_constant_service_stays_on_minima() -> None:
    little = Little()
    feed_fifo_origin(little, workers=4, service=0.5, seconds=60)
    assert not little.variable
    assert abs(little.limit - 4) <= 1


def test_variable_service_switches_to_means() -> None:
    """Deterministic spread (no randomness): service times cycling 0.02..0.38 s."""
    little = Little()
    times = [0.02, 0.38, 0.1, 0.3, 0.05, 0.2, 0.35, 0.08]
    now = 0.0
    for i in range(400):
        rtt = times[i % len(times)]
        now += rtt
        little.update(Sample(rtt=rtt, inflight=1, dropped=False, now=now, queued=1))
    assert little.variable
    assert "variable" in little.describe()
    # One worker serving one request at a time: the mean latency is that of the service.
    assert little.limit <= 2
    # Every request at one level: no rise to fit, and the unqueued mean is the service's.
    assert little.knee is None
    assert little.service_mean == pytest.approx(sum(times) / len(times), rel=0.1)


def test_latencies_near_zero_never_overflow_the_estimate() -> None:
    """Found by the hypothesis bounds test: a delivery rate divided by 1e-308 s."""
    little = Little()
    for rtt, inflight, dropped, now in [
        (0.0, 0, True, 0.0),
        (1e-09, 0, False, 0.0),
        (1.1125369292536007e-308, 0, False, 0.0),
        (1.1125369292536007e-308, 2, False, 0.0),
        (0.0, 3, True, 1.0),
    ] * 20:
        limit = little.update(Sample(rtt=rtt, inflight=inflight, dropped=dropped, now=now))
        assert isinstance(limit, int) and little.min_limit <= limit <= little.max_limit


def test_a_limit_whose_admitted_requests_are_mostly_dropped_comes_down_and_stays_down() -> None:
    # Settled at 8 on an 8-worker origin; then most requests end dropped (their
    # clients left) while latency and rate look as before: the estimates still say
    # 8, yet the limit must come down within a few rounds and not climb back while
    # most of what it admits is computed for nobody.
    little = Little()
    now = feed_fifo_origin(little, workers=8, service=0.1, seconds=30, settle=True)
    start = little.limit
    assert 7 <= start <= 9 and little.estimate() >= 7
    limits = []
    for i in range(400):  # 5 s at 80 completions a second
        now += 0.0125
        dropped = i % 4 != 0  # three in four dropped
        inflight = min(8, little.limit)
        little.update(Sample(rtt=0.1, inflight=inflight, dropped=dropped, now=now, queued=5))
        limits.append(little.limit)
    assert min(limits[:40]) < start  # down within half a second (a few rounds)
    assert max(limits[200:]) < start - 1  # and held down


def test_requests_served_after_their_deadline_still_measure_the_service() -> None:
    # 32 workers, exponential service, deadlines of 3 mean service times: the
    # requests that beat the deadline are the short ones, so means over successes
    # alone read the service ~25 % short and ratchet the limit down round after
    # round (it ended at 6 to 18 slots and 0.45 of capacity). The late requests'
    # latencies count too.
    result = run_capacity_change(
        limiter=LimiterConfig("little"),
        workers=32,
        service_time=0.2,
        change_to=0.2,
        dist="exponential",
        rate=240.0,
        arrivals="poisson",
        client_workers=0,
        timeout=0.6,
        origin_queue=None,
        duration=48.0,
        seed=1,
    )
    after = result["steps"][1]
    assert after["mean_limit"] >= 28
    assert after["goodput_ratio"] >= 0.75


def closed_loop_share(
    *,
    clients: int,
    workers: int,
    service: ServiceConfig,
    timeout: float,
    deadlines: bool,
    duration: float,
    seed: int = 1,
) -> float:
    """Goodput over capacity of ``little`` behind ``clients`` closed-loop clients and an
    unbounded origin queue (the robustness matrix's closed-loop setup)."""
    result = run_paradox(
        limiter=LimiterConfig("little"),
        clients=(clients,),
        workers=workers,
        service=service,
        timeout=timeout,
        send_deadline=deadlines,
        duration=duration,
        origin_queue=None,
        seed=seed,
    )
    share: float = result["steps"][0]["goodput_ratio"]
    return share


def open_loop_share(
    *,
    workers: int,
    service: float,
    load: float,
    seed: int,
    workers_to: int | None = None,
    slower: bool = False,
    deadlines: bool = True,
    arrivals: str = "poisson",
    timeout: float = 3.0,
    dist: str = "exponential",
    sigma: float = 0.5,
    duration: float | None = None,
    limit: str = "little",
) -> float:
    """Goodput over capacity (per phase) of ``limit`` (``little``, or ``fixed:N``) in the
    robustness matrix's setup:
    ``dist`` service (exponential unless given), ``arrivals`` (Poisson, or bursts of
    ``workers``) at ``load`` x capacity, unbounded origin queue, client timeout
    ``timeout`` mean service times, for ``duration`` seconds (by default 300 service
    times, at most 30k arrivals); ``slower``: the work time doubles mid-run."""
    rate = load * workers / service
    if duration is None:
        duration = max(100 * service, min(300 * service, 30_000 / rate))
    name, _, value = limit.partition(":")
    result = run_capacity_change(
        limiter=LimiterConfig(name, limit_value=int(value) if value else None),
        workers=workers,
        service_time=service,
        change_to=2 * service if slower else service,
        workers_to=workers_to,
        dist=dist,
        sigma=sigma,
        rate=rate,
        arrivals=arrivals,
        burst_size=max(2, workers),
        client_workers=0,
        timeout=timeout * service,
        send_deadline=deadlines,
        origin_queue=None,
        duration=duration,
        seed=seed,
    )
    steps = result["steps"]
    served = sum(step["goodput_rps"] for step in steps)
    return float(served / sum(min(step["capacity_rps"], rate) for step in steps))


def test_rounds_of_one_request_do_not_make_a_rate() -> None:
    # One exponential worker: rounds of one request each before the switch to means;
    # one short request's rate (many times the capacity) used to enter the pooled
    # maximum, and the limit reached 33 on one worker (0.09 of capacity).
    assert open_loop_share(workers=1, service=0.2, load=1.5, seed=2) >= 0.5


def test_rate_windows_sized_by_the_spread_keep_32_workers_near_32() -> None:
    # A maximum over windows of 8 to 16 exponential requests read the capacity some
    # 25 % high; windows pooled until their standard error is 5 % do not (0.835 -> 0.851;
    # fixed:32, the best hand-set limit, has 0.904).
    assert open_loop_share(workers=32, service=0.2, load=1.5, seed=1) >= 0.845


def test_losing_half_the_workers_brings_the_limit_down() -> None:
    # 8 -> 4 exponential workers at 2x load: 0.73 of capacity on seed 1 before the
    # rework; with rate windows of 8 requests (not sized by the spread) 0.70. Any
    # change to start-up moves one seed's path by several points either way (seed 1:
    # 0.81 before the slot-rate start-up, 0.76 after; seeds 1-12 mean 0.763 and 0.750):
    # a mean over seeds judges the behaviour, not one path.
    shares = [
        open_loop_share(workers=8, service=0.1, load=2.0, seed=seed, workers_to=4)
        for seed in range(1, 7)
    ]
    assert sum(shares) / len(shares) >= 0.75, shares


def test_heavy_tailed_start_up_does_not_stop_at_a_fraction_of_the_workers() -> None:
    # 32 log-normal (sigma 1) workers at 1.5x load, work time doubling mid-run. Start-up
    # judged on the latencies of the requests that had ended (the short ones) saw a
    # queue at 12 to 24 slots and cruised at 4 to 12 from there: 0.42 and 0.44 of
    # capacity on seeds 3 and 4. Judged on completions per slot-second, confirmed
    # over a second round: 0.76 on both.
    for seed in (3, 4):
        share = open_loop_share(
            workers=32, service=0.2, load=1.5, seed=seed, slower=True, dist="lognormal", sigma=1.0
        )
        assert share >= 0.7, (seed, share)


def test_a_slower_heavy_tailed_service_keeps_the_workers_of_its_calm_cruise() -> None:
    # 32 log-normal (sigma 1) workers whose work time doubles from 200 ms to 400 ms
    # at 1.5x load, clients that wait 600 ms (deadlines sent). By the time a drain
    # showed the service slower, the knee had crept past the workers; the reset kept
    # it, and a mean measured over the workers then ratified its own queue: 40 to 47
    # slots after the change, 0.57 of capacity over seeds 1-4 (fixed:32 0.72). The
    # calm cruise's workers are now held while the slower mean is measured: 0.64.
    def after_the_change(seed: int) -> float:
        result = run_capacity_change(
            limiter=LimiterConfig("little"),
            workers=32,
            service_time=0.2,
            change_to=0.4,
            dist="lognormal",
            sigma=1.0,
            rate=240.0,
            arrivals="poisson",
            client_workers=0,
            timeout=0.6,
            send_deadline=True,
            origin_queue=None,
            duration=60.0,
            seed=seed,
        )
        step = result["steps"][1]
        return float(step["goodput_rps"] / step["capacity_rps"])

    shares = [after_the_change(seed) for seed in (1, 2, 3, 4)]
    assert sum(shares) / len(shares) >= 0.61, shares


def test_one_slow_worker_start_up_stops_at_the_fitted_knee() -> None:
    # One log-normal worker of 0.5 s behind 16 clients (timeout 2 s): a start-up round
    # ends 2 or 3 requests, too few to show that one worker is full, and doubling went
    # on to 8 slots (4 s of queue: every request timed out), 0.68 and 0.77 of capacity
    # on seeds 1 and 2. Stopping once the knee fit showed the queue over two rounds:
    # 0.88 and 0.98.
    shares = [
        closed_loop_share(
            clients=16,
            workers=1,
            service=ServiceConfig(0.5, dist="lognormal", sigma=0.5),
            timeout=2.0,
            deadlines=True,
            duration=30,
            seed=seed,
        )
        for seed in (1, 2)
    ]
    assert sum(shares) / len(shares) >= 0.85, shares


def test_exponential_start_up_reaches_32_workers_quickly() -> None:
    # 32 exponential workers at 1.5x load: start-up that doubled by 2 x rate x a
    # survivor-biased mean (0.13 s for 0.2 s) ended at 18 slots on seed 2 and cruised at
    # 12 to 16 for the next 9 s (0.77 of capacity over the run); doubling the limit while
    # every slot still serves at the pooled rate: 0.83.
    assert open_loop_share(workers=32, service=0.2, load=1.5, seed=2) >= 0.8


def test_exponential_start_up_shows_the_spread_over_its_first_estimate() -> None:
    # 16 exponential workers of 50 ms at 1.5x load, deadlines of 3 service times, seed
    # 2: the start-up estimate from minima read 1 slot, only that level's spread
    # counted, and showing it took 5 service times at a limit of 1: 0.36 of capacity
    # over the first 40 service times. Start-up's levels up to its limit show it at
    # once: 0.52.
    share = open_loop_share(workers=16, service=0.05, load=1.5, seed=2, duration=2.0)
    assert share >= 0.45


def test_constant_service_behind_a_queue_does_not_turn_means_on() -> None:
    # 8 constant workers, 32 closed-loop clients: the minima overshoot to ~10 slots,
    # and the latencies of the queued levels 9 and 10 read as spread (means on, 0.91
    # of capacity). The spread now counts only levels up to the fitted knee
    # (without that: 0.78).
    share = closed_loop_share(
        clients=32,
        workers=8,
        service=ServiceConfig(0.05),
        timeout=0.25,
        deadlines=False,
        duration=15.0,
    )
    assert share >= 0.94


def test_constant_service_queued_over_a_high_start_up_estimate_stays_on_minima(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 16 constant workers of 100 ms behind 32 closed-loop clients, start-up from 4
    # slots: batches of completions straddle a request's life, the minima read 18.8
    # workers, and the queued levels 17-19 (waits of part of a service) read as
    # spread: means turned on and the limit cruised at 14 (0.91 of capacity). The
    # levels under them showed constant service, so that spread is a queue's.
    monkeypatch.setattr(scenarios, "make_limit", lambda spec: Little(initial_limit=4))
    share = closed_loop_share(
        clients=32,
        workers=16,
        service=ServiceConfig(0.1),
        timeout=0.5,
        deadlines=False,
        duration=30.0,
    )
    assert share >= 0.95


def test_variable_start_up_verdict_holds_until_the_estimate_follows() -> None:
    # 16 log-normal (sigma 1) workers of 500 ms behind 19 patient closed-loop clients:
    # start-up doubled to 32 and found about 16 workers, but the rate windows it left
    # were measured at 2-16 slots and read 8.2; cruise took the limit down to 9, where
    # rate x mean can only confirm 9, and the first probe came 17 s later (0.68 of
    # capacity over 30 s). Start-up's verdict is held as a floor until the estimate
    # reaches it or a queue shows.
    share = closed_loop_share(
        clients=19,
        workers=16,
        service=ServiceConfig(0.5, dist="lognormal", sigma=1.0),
        timeout=2.5,
        deadlines=False,
        duration=30.0,
    )
    assert share >= 0.85


def test_fit_knee_finds_where_latency_starts_to_rise() -> None:
    service, workers = 0.1, 8
    levels = [(k, 100.0, 100.0 * service * max(1.0, k / workers)) for k in range(4, 13)]
    knee = fit_knee(levels, sd=0.1)
    assert knee is not None
    assert knee.workers == workers
    assert knee.service == pytest.approx(service)
    assert knee.weight == 500.0  # the requests at levels 4..8


def test_fit_knee_keeps_flat_levels_flat() -> None:
    # A rise within the noise is no knee: the service time is the pooled mean.
    levels = [(1, 50.0, 5.0), (2, 50.0, 5.1), (3, 50.0, 5.2)]
    knee = fit_knee(levels, sd=0.1)
    assert knee is not None
    assert knee.workers is None
    assert knee.service == pytest.approx(15.3 / 150)
    assert fit_knee([], sd=0.1) is None


def test_fit_knee_over_workers_known_to_exist_does_not_pool_queued_levels() -> None:
    # Levels 4..8 unqueued, 9..12 queued, but the rise is within the noise (sd 5 x
    # the service): a flat fit pools the queue into the service time; given workers
    # known to exist (the order of completions showed 6), the best knee's is taken.
    service, workers = 0.1, 8
    levels = [(k, 20.0, 20.0 * service * max(1.0, k / workers)) for k in range(4, 13)]
    flat = fit_knee(levels, sd=0.5)
    assert flat is not None and flat.workers is None
    assert flat.service > 1.1 * service
    bounded = fit_knee(levels, sd=0.5, lowest=6)
    assert bounded is not None
    assert bounded.workers is None  # still not significant: no knee reported
    assert bounded.service == pytest.approx(service)
    # A best knee under the workers known to exist is not taken.
    assert fit_knee(levels, sd=0.5, lowest=9) == flat


def test_a_replica_that_never_saturates_still_learns_its_rate() -> None:
    # bench/sim_compare.py's fleet: 100 replicas of 2 lognormal workers at 80 % load,
    # 10 % of them 4x slower for the middle third. A replica whose rounds are all
    # app-limited filled no rate window and had no estimate until the slowdown,
    # then ran a limit of 1 on 2 slowed workers for 15 s (during: 0.977, 248 503s).
    # Before a rate is known, quiet rounds fill the first window.
    result = run_fleet(
        limiter=LimiterConfig("little"),
        replicas=100,
        balancer="least-outstanding",
        duration=60.0,
        seed=1,
    )
    during = result["steps"][1]
    assert during["goodput_ratio"] >= 0.985, during


def test_drops_without_a_queue_do_not_end_start_up() -> None:
    # 32 exponential workers, 38 closed-loop clients with a deadline of 2 service
    # times: requests that waited for a slot past their deadline are dropped at any
    # limit, and with variable service those drops ended start-up at 2 slots (0.68
    # of capacity). Only a queue at the origin ends it now.
    share = closed_loop_share(
        clients=38,
        workers=32,
        service=ServiceConfig(0.05, dist="exponential"),
        timeout=0.1,
        deadlines=True,
        duration=15.0,
    )
    assert share >= 0.71


@pytest.mark.parametrize(
    ("clients", "service", "timeout", "deadlines"),
    # The robustness matrix's cells: a timeout of 3 x 0.2 s (in floating point a hair
    # over 0.6 s: served exactly at its deadline), and one of 5 x 0.1 s, not sent.
    [(19, 0.2, 3 * 0.2, True), (32, 0.1, 5 * 0.1, False)],
    ids=["deadline-tie", "no-deadline"],
)
def test_drops_of_requests_late_before_admission_do_not_back_off_start_up(
    clients: int, service: float, timeout: float, deadlines: bool
) -> None:
    # 16 constant workers behind closed-loop clients: in start-up the requests queued
    # for a slot are admitted with too little time left and dropped though served
    # as fast as with no queue. Counted as overload they backed start-up off at 2
    # or 4 slots and the limit cruised there until the next probe (0.93 of
    # capacity both ways); only drops that met a queue beyond the limit count now.
    share = closed_loop_share(
        clients=clients,
        workers=16,
        service=ServiceConfig(service),
        timeout=timeout,
        deadlines=deadlines,
        duration=300 * service,
    )
    assert share >= 0.965


def test_late_admitted_drops_do_not_lock_the_limit_in_at_zero_goodput() -> None:
    # 16 constant workers, 19 clients that retry at once, a deadline of 2 service
    # times: a request that waited one service time for its slot is served exactly at
    # its deadline. Counted as overload, each such drop backed the limit off, which
    # made the next requests wait longer: the limit sank to 1 and goodput to 0.02 of
    # capacity (bench/closed_loop_sweep.py).
    share = closed_loop_share(
        clients=19,
        workers=16,
        service=ServiceConfig(0.1),
        timeout=2 * 0.1,
        deadlines=True,
        duration=20.0,
    )
    assert share >= 0.85


def test_a_drop_that_waited_for_its_slot_and_met_no_queue_is_no_overload() -> None:
    # Start-up at 4 slots on a 0.1 s constant service: rounds of drops that waited
    # for admission and were served in the unqueued time leave start-up as it was; the
    # same drops admitted at once (no wait: the queue was behind the limit) back off
    # (with the spread not yet shown, start-up judges "most dropped" on 3 requests at
    # least, pooled with the round of successes before: three rounds of two drops).
    def after_drops(waited: float) -> tuple[int, str]:
        little = Little(initial_limit=4)
        now = 0.0
        for _ in range(2):  # a round of successes: the minimum latency is known
            now += 0.1
            for _ in range(2):
                little.update(Sample(rtt=0.1, inflight=4, dropped=False, now=now, queued=8))
        for gap in (0.1, 0.15, 0.15):  # (admitted after the round before ended)
            now += gap
            for _ in range(2):
                little.update(
                    Sample(rtt=0.1, inflight=4, dropped=True, now=now, queued=8, waited=waited)
                )
        return little.limit, little.state

    limit, state = after_drops(waited=0.3)
    assert limit >= 4 and state == "startup"
    limit, state = after_drops(waited=0.0)
    assert limit < 4 and state == "cruise"


def test_a_probe_overshoot_is_not_taken_for_a_slower_service() -> None:
    # 16 exponential workers, bursts at 2x load: a probe that doubled to 46 slots
    # left a queue that the drain after it still saw at twice the mean, which read
    # as "the service got slower" and reset the estimate to 7 (0.70 of capacity).
    # Such a drain now runs one more round before it is judged.
    share = open_loop_share(
        workers=16,
        service=0.02,
        load=2.0,
        seed=1,
        slower=True,
        deadlines=False,
        arrivals="bursts",
        timeout=5.0,
    )
    assert share >= 0.78


def test_the_fitted_knee_is_a_floor_for_the_limit() -> None:
    # 16 constant workers behind 32 closed-loop clients (means on: the closed loop
    # spreads the latencies): the rate estimate, pooled for precision, lags below
    # the workers (0.84 of capacity); the knee of latency against in-flight shows
    # that 16 levels ran without a queue, and the limit stays at least there.
    share = closed_loop_share(
        clients=32,
        workers=16,
        service=ServiceConfig(0.1),
        timeout=0.5,
        deadlines=False,
        duration=30.0,
    )
    assert share >= 0.90


def test_one_very_short_request_does_not_blow_up_the_start_up_estimate() -> None:
    # 8 exponential workers, no deadlines, open loop at 2x: a 45 us request admitted
    # before a start-up round ended in it with a delivery rate of 1 / 45 us = 22,000/s;
    # the rate maximum kept it, the estimate read 671 slots, the limit went to 588
    # and then 1,000, and the first phase served 0.44 of capacity (mean limit 220).
    # A round's rate is now held under Little's bound (most in flight / mean latency).
    result = run_capacity_change(
        limiter=LimiterConfig("little"),
        workers=8,
        workers_to=16,
        service_time=0.1,
        change_to=0.1,
        dist="exponential",
        rate=160.0,
        arrivals="poisson",
        client_workers=0,
        timeout=0.3,
        send_deadline=False,
        origin_queue=None,
        duration=60.0,
        seed=6,
    )
    before = result["steps"][0]
    assert before["mean_limit"] <= 16
    assert before["goodput_ratio"] >= 0.7


@pytest.mark.parametrize(("seed", "floor"), [(2, 0.88), (7, 0.84)])
def test_e2_with_a_real_machines_jitter_recovers_the_slot_it_reads_wrong(
    seed: int, floor: float
) -> None:
    # E2 (7 workers, 1 s -> 2 s) with 2 % log-normal jitter. Seed 2: completions that
    # bunch read the rate high, the restart after the slowdown counted 8 workers, and
    # one request in four timed out in the origin's queue for 30 s (0.83): a drop at
    # the estimate now takes the slot back. Seed 7: the drain that found the slower
    # service also set a ceiling of 6 from rates of the faster past (0.80).
    after = _e2_with_jitter_after_the_change(seed)
    assert after["goodput_ratio"] >= floor, after


@pytest.mark.parametrize(("seed", "floor"), [(1, 0.92), (5, 0.91)])
def test_a_probe_past_the_workers_is_not_passed_by_requests_that_waited_for_one(
    seed: int, floor: float
) -> None:
    # E2 with 2 % jitter, after the slowdown: deadline admission keeps the limiter's
    # queue empty, so a probe's requests arrive to a free slot and wait for a worker
    # in the origin's queue. Counted from their admission, the completion that freed
    # their worker reads 8 workers' rate on 7 (seed 5: 3.886/s where they serve 3.5/s),
    # the probe passed, the limit stepped up to 10 and timed clients out for seconds
    # (seeds 1 and 5: 0.890 and 0.881). Counted from the completion before admission
    # (BBR's interval), the rate is 7 workers' (3.655/s) and the probe fails.
    after = _e2_with_jitter_after_the_change(seed)
    assert after["goodput_ratio"] >= floor, after


def _e2_with_jitter_after_the_change(seed: int) -> dict[str, Any]:
    """E2 (7 workers, 1 s -> 2 s, deadlines) with 2 % log-normal jitter: the step after
    the change."""
    result = run_capacity_change(
        limiter=LimiterConfig("little"),
        dist="lognormal",
        sigma=0.02,
        arrivals="constant",
        seed=seed,
    )
    return dict(next(step for step in result["steps"] if step["phase"] == "after"))


def test_drops_at_the_estimate_only_take_one_slot_back() -> None:
    # Steady service, cruising at 7 workers: a round in which a request admitted at the
    # estimate timed out in the origin's queue (and none admitted below it) takes a
    # slot back and holds it as a ceiling; the same drop admitted at a low level (work
    # left by clients who gave up delays every level alike) leaves the limit alone.
    def after_two_rounds(drop_level: int | None) -> tuple[int, int]:
        little = Little()
        now = feed_fifo_origin(little, workers=7, service=0.1, seconds=30, settle=True)
        assert (little.limit, little.state) == (7, "cruise")
        for _ in range(2):
            for i in range(7):
                now += 0.1
                dropped = i == 3  # admitted 0.25 s ago: inside the round
                level = drop_level if dropped and drop_level is not None else 7
                sample = Sample(
                    rtt=0.25 if dropped else 0.1, inflight=level, dropped=dropped, now=now, queued=5
                )
                little.update(sample)
        return little.limit, little.state == "cruise"

    assert after_two_rounds(drop_level=None) == (6, True)
    assert after_two_rounds(drop_level=2) == (7, True)


@pytest.mark.parametrize(
    ("workers", "service", "seed", "bound"), [(16, 0.05, 2, 0.83), (8, 0.1, 4, 0.82)]
)
def test_exponential_service_cruises_at_the_workers_the_order_of_completions_shows(
    workers: int, service: float, seed: int, bound: float
) -> None:
    # Exponential service, Poisson arrivals at 1.5x, deadlines of 3 service times:
    # above the workers each slot adds S / W to a mean whose noise is S, and the
    # limit drifted 2 to 8 slots over (16 workers, seed 2: 0.80 of capacity; 8
    # workers, seed 4: 0.77). The overtake edge (loadshed.limits.overtake) holds it
    # at the workers: 0.89 and 0.85.
    share = open_loop_share(workers=workers, service=service, load=1.5, seed=seed)
    assert share >= bound


def test_variable_start_up_stops_where_requests_stop_overtaking_more() -> None:
    # 16 exponential workers behind a saturated limiter: start-up doubles the limit
    # while every slot still serves, but a round of a few completions at 32 slots
    # cannot show the shortfall in its rate, and the limit went on to 64. At 32, no
    # request overtakes more than 15 others (loadshed.limits.overtake), as at 16:
    # start-up ends there.
    little = Little()
    rng = random.Random(3)
    workers, service = 16, 0.05
    now = 0.0
    worker_free = [0.0] * workers
    inflight: list[tuple[float, float, int]] = []  # (completion, admitted, level)
    highest = 0
    while now < 3.0:
        while len(inflight) < little.limit:
            slot = min(range(workers), key=worker_free.__getitem__)
            start = max(now, worker_free[slot])
            worker_free[slot] = start + rng.expovariate(1 / service)
            inflight.append((worker_free[slot], now, len(inflight) + 1))
        inflight.sort()
        done, admitted, level = inflight.pop(0)
        now = done
        little.update(Sample(rtt=done - admitted, inflight=level, dropped=False, now=now, queued=5))
        highest = max(highest, little.limit)
    assert highest <= 2 * workers
    assert workers <= little.limit <= workers + 2


def _probes_on_one_worker(timeout: float, seconds: float = 60.0) -> int:
    """Probes ``Little`` makes on one saturated 50 ms worker whose clients leave after
    ``timeout`` (a request served later is a drop; the worker still served it)."""
    little, probes = Little(), [0]

    def count(before: str) -> None:
        probes[0] += before != "probe" and little.state == "probe"

    feed_fifo_origin(
        little, workers=1, service=0.05, seconds=seconds, timeout=timeout, after_update=count
    )
    return probes[0]


def test_probes_that_time_clients_out_come_less_often() -> None:
    # One 50 ms worker: a slot more doubles the wait. Clients that wait 2 s pay a
    # queue for a probe; clients that leave after 100 ms lose the work it held (2 or 3
    # timeouts each), so those probes back off further (5 % of the goodput at 8
    # cycles apart: simulate paradox --service-time 50ms --timeout 100ms --clients 2).
    patient, impatient = _probes_on_one_worker(2.0), _probes_on_one_worker(0.1)
    assert 2 * impatient <= patient
    assert impatient >= 3  # still probing: more workers may come
    goodput = run_paradox(
        limiter=LimiterConfig("little"),
        clients=(2,),
        workers=1,
        service=ServiceConfig(0.05),
        timeout=0.1,
        send_deadline=False,
        duration=30.0,
        dispatch_delay=0.001,
    )["steps"][0]["goodput_ratio"]
    assert goodput >= 0.93  # 0.908 when every probe came 8 cycles after the last


def test_a_limit_filled_by_requests_admitted_together_counts_as_saturated() -> None:
    # 8 constant workers of 1 s, bursts of 8 at 4x capacity, clients that wait 2 s and
    # send no deadline. Start-up settled at 4 slots; its 4 requests were admitted at one
    # instant and ended at one instant, in the order admitted, so a round (ended when
    # half the slots turned over) held the two admitted at 1 and 2 in flight, and the
    # two at the limit fell before the next round's start. Every round read as
    # app-limited: no cruise round was counted, no probe came, and the limit stayed at
    # half the workers (0.54 of capacity; doubled to 16 workers mid-run, it stayed there
    # for 230 s). A success that completes in a constant-service cruise round after
    # being admitted at the limit now marks the round saturated (0.89).
    share = open_loop_share(
        workers=8,
        service=1.0,
        load=4.0,
        seed=1,
        arrivals="bursts",
        dist="constant",
        timeout=2.0,
        deadlines=False,
    )
    assert share >= 0.8


def test_failed_probes_that_cost_nothing_keep_coming_on_one_worker() -> None:
    # One constant 20 ms worker doubled to two at half a 6 s run, Poisson at 2x, clients
    # that wait 10 services and send it. Every probe before the change fails; from one
    # or two slots each failure doubled the interval up to 8 cycles, and the probe that
    # found the second worker came 2.3 s after it (0.56 of capacity after the change
    # over seeds 1-4). Those probes cost no drop: they now space out to 4 cycles, as
    # from more slots (0.72), and only a probe that cost drops goes to 8.
    shares = []
    for seed in (1, 2, 3, 4):
        result = run_capacity_change(
            limiter=LimiterConfig("little"),
            workers=1,
            workers_to=2,
            service_time=0.02,
            change_to=0.02,
            dist="constant",
            rate=100.0,
            arrivals="poisson",
            client_workers=0,
            timeout=0.2,
            origin_queue=None,
            duration=6.0,
            seed=seed,
        )
        after = next(step for step in result["steps"] if step["phase"] == "after")
        shares.append(after["goodput_ratio"])
    assert sum(shares) / len(shares) >= 0.68, shares


@pytest.mark.parametrize(("sigma", "floor"), [(0.5, 0.7), (0.05, 0.85)])
def test_workers_that_double_under_bursts_are_found(sigma: float, floor: float) -> None:
    # 4 log-normal workers of 500 ms, bursts at 4x capacity, clients that wait 2
    # service times, doubled to 8 workers mid-run (seed 3).
    # sigma 0.5: a burst's drops backed the limit off to a ceiling, and only a probe
    # judged on one round's noisy rate could lift it; the probes failed by chance and
    # the limit stayed at the old workers (0.56 of capacity). The ceiling lapses after
    # two cycles of calm cruise.
    # sigma 0.05 (nearly constant): before the change every probe fails, and each
    # failure doubled the interval to the next, up to 8 cycles (64 rounds): the first
    # probe after the change came some 40 s later (0.78). Failed probes now space out
    # to 4 cycles at most.
    share = open_loop_share(
        workers=4,
        service=0.5,
        load=4.0,
        seed=3,
        workers_to=8,
        arrivals="bursts",
        dist="lognormal",
        sigma=sigma,
        timeout=2.0,
    )
    assert share >= floor


def test_a_probe_after_the_workers_doubled_is_judged_against_a_precise_rate() -> None:
    # 32 log-normal (sigma 1) workers of 200 ms doubled to 64 under bursts at 2x,
    # clients that wait 2 service times and send no deadline (seed 3). A probe was
    # judged against the rate of the one cruise round before it: two rounds of a
    # few dozen heavy-tailed requests each, and the probes that would have found
    # the new workers failed by chance (0.60 of capacity). The base is now the
    # latest wide rate window, pooled over as many requests as the spread needs.
    share = open_loop_share(
        workers=32,
        service=0.2,
        load=2.0,
        seed=3,
        workers_to=64,
        arrivals="bursts",
        dist="lognormal",
        sigma=1.0,
        timeout=2.0,
        deadlines=False,
    )
    assert share >= 0.7  # 0.744


def test_a_back_off_does_not_go_under_the_workers_the_overtake_edge_shows() -> None:
    # 4 exponential workers of 200 ms under bursts at 2x, clients that wait 2
    # service times and send no deadline (seed 4). Requests that waited for a slot
    # dropped after admission, "most dropped" backed the limit off to 3 and then 2
    # slots under the 4 workers the overtake edge showed, where clients waited longer
    # and dropped more: 0.49 of capacity (`fixed:4` 0.75). A back-off now stops at
    # the edge's workers.
    share = open_loop_share(
        workers=4, service=0.2, load=2.0, seed=4, arrivals="bursts", timeout=2.0, deadlines=False
    )
    assert share >= 0.65  # 0.73


def test_start_up_does_not_back_off_on_one_long_request_of_a_heavy_tail() -> None:
    # 32 log-normal (sigma 1) workers of 200 ms, bursts at 2x capacity, clients that
    # wait 2 service times and send no deadline (seed 1). At start-up's first limits a
    # round is one request: one that waited for the small limit and then ran long
    # made a round "most dropped", start-up backed off to 1 slot, every request then
    # waited, more dropped, the back-off's ceiling held, and goodput stayed at 0.02
    # of capacity for 60 s. Start-up now judges "most dropped" on 3 requests at least
    # while the spread is not shown small.
    share = open_loop_share(
        workers=32,
        service=0.2,
        load=2.0,
        seed=1,
        arrivals="bursts",
        dist="lognormal",
        sigma=1.0,
        timeout=2.0,
        deadlines=False,
    )
    assert share >= 0.7  # 0.79 (0.02 before)


def test_one_short_request_does_not_take_start_up_down_before_means_are_on() -> None:
    # 32 log-normal (sigma 1) workers of 200 ms at 1.5x, seed 2: start-up's levels
    # over the estimate read a variation of 0.3 from a few samples (the service's is
    # 1.3), which passed for known; a request of 14 ms then made the estimate 1.0,
    # start-up fell from 10 slots to 2, then 1, until means turned on at 3.4 s: 0.17
    # of capacity over the first 5 s.
    share = open_loop_share(
        workers=32,
        service=0.2,
        load=1.5,
        seed=2,
        dist="lognormal",
        sigma=1.0,
        timeout=3.0,
        duration=5.0,
    )
    assert share >= 0.5


def test_a_probe_whose_slots_requests_overtake_passes_on_few_workers() -> None:
    # 4 exponential workers of 200 ms, bursts at 2x, clients that leave after 2
    # services and send no deadline (seed 2 of bench/lockin_scan.py). A burst's drops
    # backed the limit off to 2 slots; there the rate can show no more than 2 slots'
    # worth, the drops of clients that waited for a slot keep the ceiling, and probes
    # judged on one round's noisy rate failed: 0.52 of what `fixed:4` serves. A probe
    # whose requests overtook as many others as its limit allows had every slot in
    # service at once (a lower bound on the workers), and passes while its latency
    # shows no queue: 0.85.
    def served(limit: str) -> float:
        return open_loop_share(
            workers=4,
            service=0.2,
            load=2.0,
            seed=2,
            deadlines=False,
            arrivals="bursts",
            timeout=2.0,
            limit=limit,
        )

    share = served("little") / served("fixed:4")
    assert share >= 0.75, share


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_start_up_does_not_grow_on_one_worker_that_serves_in_order(seed: int) -> None:
    # Exponential service on one worker: requests end in the order admitted though
    # their latencies vary, which two workers or more would not show. Start-up stops
    # growing there; before, it doubled to 8 slots in 4 of these 5 seeds (every
    # request then waits for 7 others).
    limits = varied_fifo_limits(Little(), workers=1, seed=seed, completions=60)
    assert max(limits) <= 3


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_start_up_still_grows_on_several_workers_or_a_batching_one(seed: int) -> None:
    # Requests overtake each other on 4 workers, and a batch ends together: neither
    # looks like one worker serving one request at a time.
    assert max(varied_fifo_limits(Little(), workers=4, seed=seed, completions=40)) >= 8
    batched = varied_fifo_limits(Little(), workers=1, seed=seed, completions=80, batch=8)
    assert max(batched) >= 8


def test_a_back_off_stops_at_the_workers_that_overtakes_show() -> None:
    # Two exponential workers under bursts at 2x, clients that leave after 2 services
    # and send no deadline: requests that waited for a slot drop, "most dropped" backs
    # the limit off, and with no overtake edge (its histogram not yet level) it went
    # to 1 slot, where every request waits for one worker: 0.59 of capacity (`fixed:2`
    # 0.76). Requests that overtook one other show 2 workers at least: the floor.
    share = open_loop_share(
        workers=2, service=0.2, load=2.0, seed=1, deadlines=False, arrivals="bursts", timeout=2.0
    )
    assert share >= 0.65


def test_minima_with_a_machines_jitter_still_read_every_worker() -> None:
    """64 workers of 20 ms with 5 % log-normal jitter, Poisson at 2x, clients that wait
    10 services: the least of many requests' latencies sits some 15 % under their mean,
    and rate x minimum read 36 to 62 of the 64 workers (0.84 of `fixed:64` on seed 1,
    0.73 to 0.84 on seeds 1-4). The minimum lifted by the measured spread reads them."""
    kwargs: dict[str, Any] = {
        "workers": 64, "service": 0.02, "load": 2.0, "seed": 1, "timeout": 10.0,
        "dist": "lognormal", "sigma": 0.05,
    }  # fmt: skip
    little = open_loop_share(**kwargs)
    fixed = open_loop_share(**kwargs, limit="fixed:64")
    assert little >= 0.93 * fixed, (little, fixed)


def steady_steps(**settings: Any) -> list[dict[str, Any]]:
    """The two halves' steps of a steady ``little`` run against an unbounded origin
    queue, open loop (``settings`` as for ``run_capacity_change``, without the
    limiter, the change, closed-loop clients or the origin queue)."""
    result = run_capacity_change(
        limiter=LimiterConfig("little"),
        change_to=settings["service_time"],
        client_workers=0,
        origin_queue=None,
        **settings,
    )
    steps: list[dict[str, Any]] = result["steps"]
    return steps


@pytest.mark.parametrize("seed", [1, 3, 4])
def test_few_log_normal_workers_get_at_most_one_slot_over_them(seed: int) -> None:
    """4 log-normal sigma 0.5 workers of 100 ms, Poisson at 4x, clients that wait 3
    services: rate x mean latency, 5 % over and rounded up, held a mean limit of 5.6
    to 6.4 over the second half on these seeds, each slot over the workers adding a
    quarter of a service to every request (0.91 of `fixed:4`, bench/results/
    robustness_grid_46964cf.md). No request overtook 4 others, over a history whose
    taper says one would have if there were 5 workers: the limit stays at 5 or under."""
    steps = steady_steps(
        workers=4, service_time=0.1, dist="lognormal", sigma=0.5, rate=160.0,
        arrivals="poisson", timeout=0.3, send_deadline=True, duration=30.0, seed=seed,
    )  # fmt: skip
    mean_limit = steps[1]["mean_limit"]
    assert 4.0 <= mean_limit <= 5.2, mean_limit


@pytest.mark.parametrize("seed", [3, 5, 6])
def test_two_varying_workers_are_never_drained_to_one_slot(seed: int) -> None:
    """2 exponential workers, saturated: a drain one slot under 2 idles half the
    workers for a round; it went to 1 slot after start-up on these seeds (24, 8 and
    5 completions of 2,700). The queue a probe made clears at the base."""
    limits = varied_fifo_limits(Little(), workers=2, seed=seed, completions=3000)
    assert min(limits[300:]) >= 2


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_drain_over_the_knee_is_no_proof_of_a_slower_service(seed: int) -> None:
    """2 exponential workers of 100 ms, Poisson at 4x, clients that wait 3 services
    (deadline sent): a cruise 2 slots over the workers, drained to 3, still queued
    and read as a slower service; the estimate, forgotten, rose to 14 slots (mean
    limit 5.1 over the first half on seed 3). The drain now judges at the knee."""
    steps = steady_steps(
        workers=2, service_time=0.1, dist="exponential", rate=80.0, arrivals="poisson",
        timeout=0.3, send_deadline=True, duration=30.0, seed=seed,
    )  # fmt: skip
    assert all(step["mean_limit"] <= 3.5 for step in steps), steps


def test_back_off_keeps_the_workers_requests_showed_when_the_estimate_reads_low() -> None:
    """2 exponential workers of 200 ms, bursts at 2x, clients that wait 2 services and
    send no deadline: drops bias the mean latency low (an estimate of 1.4), and a
    back-off under requests seen overtaking another held 1 slot for the second half
    (mean limit 1.06, 0.32 of capacity, seed 4). At least 2 now."""
    steps = steady_steps(
        workers=2, service_time=0.2, dist="exponential", rate=20.0, arrivals="bursts",
        burst_size=2, timeout=0.4, send_deadline=False, duration=60.0, seed=4,
    )  # fmt: skip
    assert steps[1]["mean_limit"] >= 1.8, steps


@pytest.mark.parametrize(("workers", "seed"), [(4, 3), (4, 7), (8, 2), (16, 1)])
def test_start_up_holds_a_round_short_of_its_share_instead_of_doubling(
    workers: int, seed: int
) -> None:
    """Log-normal (sigma 0.5) workers, saturated: a start-up round that ends under
    0.8 x its slots' share of completions, but by fewer than 3 standard errors, held
    the evidence for nothing and doubled; on these seeds to 4 or 6 x the workers.
    Held one more round and judged on both, start-up stops at 3 x or under."""
    limits = varied_fifo_limits(Little(), workers=workers, seed=seed, completions=400, sigma=0.5)
    assert max(limits) <= 3 * workers, max(limits)
