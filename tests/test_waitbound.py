"""The adaptive queue-wait bound: grows while clients are patient, shrinks at once when
one gives up (pure class, the admission core in virtual time, and the simulator)."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest

from loadshed.admission import Admission, Ticket, Token
from loadshed.asgi import LoadShedMiddleware
from loadshed.clock import VirtualClock
from loadshed.errors import ConfigError, Rejected, RejectReason
from loadshed.limiter import Limiter
from loadshed.limits.fixed import Fixed
from loadshed.sim.scenarios import LimiterConfig, ServiceConfig, run_paradox
from loadshed.testing import serve
from loadshed.waitbound import DEFAULT_WAIT_CEILING, AdaptiveWaitBound


def test_starts_at_one_service_time_and_grows_only_when_it_turned_requests_away() -> None:
    bound = AdaptiveWaitBound(ceiling=1.0)
    assert bound.bound(0.025, None) == 0.025
    bound.succeeded(0.025, 0.025, limit=1)  # waited the whole bound, but nobody was refused
    assert bound.bound(0.025, None) == 0.025
    bound.pressed()
    bound.succeeded(0.020, 0.025, limit=1)
    assert bound.bound(0.025, None) == pytest.approx(0.05)  # one service time per slot
    bound.succeeded(0.05, 0.025, limit=1)  # the press was used up by that growth
    assert bound.bound(0.025, None) == pytest.approx(0.05)
    bound.pressed()
    bound.succeeded(0.01, 0.025, limit=1)  # waited under half the bound: no evidence
    assert bound.bound(0.025, None) == pytest.approx(0.05)


def test_growth_per_success_is_a_slot_share_and_stops_at_the_ceiling() -> None:
    bound = AdaptiveWaitBound(ceiling=1.0)
    for _ in range(1000):
        bound.pressed()
        bound.succeeded(bound.bound(0.1, None), 0.1, limit=4)
    # wait + mean service never exceeds the ceiling
    assert bound.bound(0.1, None) == pytest.approx(0.9)
    # a slower service shortens the wait at once
    assert bound.bound(0.4, None) == pytest.approx(0.6)
    # and a service longer than the ceiling keeps the floor of one service time
    assert bound.bound(2.0, None) == 2.0


def test_a_known_patience_shrinks_it_at_once_and_stops_its_growth() -> None:
    bound = AdaptiveWaitBound(ceiling=1.0)
    for _ in range(100):
        bound.pressed()
        bound.succeeded(bound.bound(0.05, None), 0.05, limit=1)
    assert bound.bound(0.05, None) == pytest.approx(0.95)
    # clients leave after 0.4 s: half of it, at once
    assert bound.bound(0.05, 0.4) == pytest.approx(0.2)
    bound.pressed()
    bound.succeeded(0.2, 0.05, limit=1, patience=0.4)
    assert bound.bound(0.05, 0.4) == pytest.approx(0.2)  # no growth while they leave
    # a shorter patience caps it lower, never below a service time
    assert bound.bound(0.05, 0.3) == pytest.approx(0.15)
    assert bound.bound(0.05, 0.06) == 0.05
    # a patience no longer in evidence (refuted or forgotten) gives the grown bound back
    assert bound.bound(0.05, None) == pytest.approx(0.95)


def test_zero_ceiling_keeps_one_service_time_and_bad_values_are_config_errors() -> None:
    bound = AdaptiveWaitBound(ceiling=0)
    bound.pressed()
    bound.succeeded(0.1, 0.1, limit=1)
    assert bound.bound(0.1, None) == 0.1
    assert AdaptiveWaitBound().ceiling == DEFAULT_WAIT_CEILING
    for bad in (-1, float("nan"), float("inf"), "1"):
        with pytest.raises(ConfigError, match="adaptive_wait_ceiling"):
            AdaptiveWaitBound(ceiling=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="adaptive_wait_ceiling"):
        Admission(Fixed(1), VirtualClock(), adaptive_wait_ceiling=-0.5)


def test_admission_queues_patient_clients_longer_and_requests_with_deadlines_do_not() -> None:
    clock = VirtualClock()
    adm = Admission(Fixed(1), clock)
    granted: list[Token] = []

    def submit() -> None:
        adm.submit(on_grant=granted.append, on_reject=lambda _: None)

    token = adm.try_acquire()  # learn the service time: 0.1 s
    clock.advance(0.1)
    token.success()
    assert adm.max_wait() == pytest.approx(0.1)
    refused = []
    for _ in range(40):
        # Patient clients arrive together: the queue takes what fits in the bound,
        # the rest is refused (which presses the bound); then everything is served.
        running: Token | None = adm.try_acquire()
        while True:
            try:
                submit()
            except Rejected as rejected:
                assert rejected.reason is RejectReason.LIMIT
                refused.append(adm.queue_length)
                break
        while running is not None:
            clock.advance(0.1)
            running.success()
            running = granted.pop(0) if granted else None
    # The queue grew from 1 to 9 requests: 0.9 s of wait, 1 s of response at most.
    assert refused[0] == 1
    assert refused[-1] == 9
    assert adm.max_wait() == pytest.approx(0.9)
    assert adm.max_wait(own_deadline=True) == pytest.approx(0.1)  # deadlines: as before
    # One client gives up after 0.5 s in the queue, where dozens waited longer and were
    # served: one in ten does not leave by then, and the bound holds. Once one in ten
    # of those that waited that long has left, it halves that, at once.
    served_longer = sum(1 for t in adm.patience._served if t >= 0.5)
    assert served_longer >= 50
    adm.try_acquire()
    give_ups = 0
    while adm.max_wait() > 0.5 and give_ups < 200:
        ticket = adm.submit(on_grant=granted.append, on_reject=lambda _: None)
        clock.advance(0.5)
        assert isinstance(ticket, Ticket) and adm.cancel(ticket)
        give_ups += 1
        if give_ups == 1:
            assert adm.max_wait() == pytest.approx(0.9)
    assert adm.max_wait() == pytest.approx(0.25)
    # Kaplan-Meier at 0.5 s: d give-ups among d + served_longer at risk, share >= 0.1
    assert give_ups == math.ceil(served_longer / 9 - 1e-9)


def _paradox(ceiling: float, timeout: float, clients: int = 64) -> dict[str, float]:
    result = run_paradox(
        limiter=LimiterConfig("fixed", limit_value=1, adaptive_wait_ceiling=ceiling),
        clients=(clients,),
        service=ServiceConfig(0.025),
        timeout=timeout,
        send_deadline=False,
        duration=20.0,
    )
    step: dict[str, float] = result["steps"][0]
    return step


def test_simulated_patient_closed_loop_is_queued_instead_of_refused() -> None:
    # 32 clients that retry at once, 2 s timeout, no deadline, a 25 ms model: with the
    # bound at one service time nearly every request is a refusal; grown to ~1 s, the
    # clients wait in the queue (0.8 s) and nobody times out.
    fixed_bound = _paradox(0.0, timeout=2.0, clients=32)
    adaptive = _paradox(DEFAULT_WAIT_CEILING, timeout=2.0, clients=32)
    assert adaptive["timed_out"] == 0
    assert adaptive["goodput_ratio"] >= 0.95
    assert adaptive["rejected"] * 20 < fixed_bound["rejected"]


def test_simulated_impatient_clients_shrink_it_after_a_few_give_ups() -> None:
    # The same model with clients that give up after 4 service times (0.1 s): the
    # bound grows until the first give-ups and then stays short, so there are hardly
    # more time-outs than with the bound held at one service time, and goodput holds.
    for clients in (4, 16):
        fixed_bound = _paradox(0.0, timeout=0.1, clients=clients)
        impatient = _paradox(DEFAULT_WAIT_CEILING, timeout=0.1, clients=clients)
        assert impatient["timed_out"] <= fixed_bound["timed_out"] + 5
        assert impatient["goodput_ratio"] >= 0.95
        assert impatient["p99_success_s"] <= 0.1


async def _sleep_app(scope: Any, receive: Any, send: Any) -> None:
    """20 ms of 'work' per request (a sleep: the test needs no CPU)."""
    await asyncio.sleep(0.02)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _closed_loop(url: str, clients: int, seconds: float, timeout: float | None) -> Any:
    """Clients that send again at once after any answer (or their own timeout)."""
    outcomes: Counter[str] = Counter()
    stop = time.monotonic() + seconds
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:

        async def loop() -> None:
            while time.monotonic() < stop:
                try:
                    async with session.get(url) as response:
                        await response.read()
                        outcomes[str(response.status)] += 1
                except asyncio.TimeoutError:
                    outcomes["timeout"] += 1

        await asyncio.gather(*(loop() for _ in range(clients)))
    return outcomes


async def test_real_server_bound_grows_for_patient_clients_and_shrinks_at_once() -> None:
    limiter = Limiter("fixed:1")
    app = LoadShedMiddleware(_sleep_app, limiter=limiter, refusal_pacing=None)
    with serve(app) as base_url:
        url = f"{base_url}/x"
        # 16 patient clients on a 20 ms "model": a bound of one service time refuses
        # most of their requests; it grows until they all fit (16 x 20 ms).
        await _closed_loop(url, clients=16, seconds=2.0, timeout=None)
        grown = limiter.admission.max_wait()
        assert grown > 0.3
        refused_before = limiter.admission.counts["rejected:limit"]
        patient = await _closed_loop(url, clients=16, seconds=1.5, timeout=None)
        assert patient["200"] >= 30
        assert limiter.admission.counts["rejected:limit"] - refused_before <= 5, patient
        # Clients that give up after 0.15 s: the bound comes down at once to half
        # their wait, and stays below their patience.
        impatient = await _closed_loop(url, clients=16, seconds=1.5, timeout=0.15)
        assert impatient["timeout"] >= 1
        assert limiter.admission.max_wait() <= 0.08, impatient


def test_a_give_up_leaves_two_service_times_of_patience_for_the_service() -> None:
    # Clients that give up after 3 mean service times: a bound of half that (1.5)
    # would leave exponential service 1.5 means to finish in (one in 4.5 runs
    # longer); the bound leaves it two (one in 7.4), down to the one-service floor.
    bound = AdaptiveWaitBound(ceiling=1.0)
    for _ in range(100):
        bound.pressed()
        bound.succeeded(bound.bound(0.1, None), 0.1, limit=1)
    assert bound.bound(0.1, 0.3) == pytest.approx(0.1)
    # a slow client's give-up against a fast service: half its wait still binds
    assert bound.bound(0.01, 0.3) == pytest.approx(0.15)
    # a model that gets slower shortens the bound at once (read at bound time)
    assert bound.bound(0.08, 0.3) == pytest.approx(0.14)


async def _abandon(url: str, clients: int, seconds: float) -> None:
    """A load test that ends: its clients close their connections mid-request."""
    async with aiohttp.ClientSession() as session:

        async def loop() -> None:
            while True:
                async with session.get(url) as response:
                    await response.read()

        tasks = [asyncio.create_task(loop()) for _ in range(clients)]
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(1.5)  # a pause before the next run


async def test_real_server_a_load_test_that_ended_does_not_lock_patience_in() -> None:
    # Clients cut off when a load test ends gave up after 0 to 160 ms each: taken as
    # patience, the next run's requests that must queue longer would be refused as
    # unable to meet it, and 8 clients that retry at once would get ~40 refusals per
    # success. Nothing arrived after those give-ups until the next run: the load left.
    limiter = Limiter("fixed:1")
    app = LoadShedMiddleware(_sleep_app, limiter=limiter, refusal_pacing=None)
    with serve(app) as base_url:
        url = f"{base_url}/x"
        await _abandon(url, clients=8, seconds=1.0)
        assert limiter.admission.patience.samples >= 4
        next_run = await _closed_loop(url, clients=8, seconds=1.5, timeout=None)
        assert next_run["200"] >= 30
        assert limiter.admission.patience.patience is None
        assert next_run["503"] * 4 <= next_run["200"], next_run


class _OneAhead(Fixed):
    """Two slots on one worker: the second holds a job ahead (as ``Little``'s headroom)."""

    @property
    def held_ahead(self) -> int:
        return 1


def test_the_floor_is_a_workers_share_of_the_time_in_flight_when_jobs_are_held_ahead() -> None:
    bound = AdaptiveWaitBound()
    assert bound.bound(0.1, None, floor=0.05) == pytest.approx(0.05)
    assert bound.bound(0.1, None) == pytest.approx(0.1)
    clock = VirtualClock()
    for algorithm, floor in ((Fixed(2), 0.1), (_OneAhead(2), 0.05)):
        adm = Admission(algorithm, clock)
        token = adm.try_acquire()
        clock.advance(0.1)  # in flight 0.1 s: with one job held ahead, 0.05 s in the worker
        token.success()
        assert adm.max_wait(own_deadline=True) == pytest.approx(floor)
        assert adm.max_wait() == pytest.approx(floor)


def test_a_job_held_ahead_does_not_double_the_wait_of_tight_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One 50 ms worker, 4 clients that leave after 200 ms and retry at once, 1 ms of
    # dispatch per job: a second slot keeps the worker busy, but counted as a second
    # worker it let every client wait 100 ms in the queue and 100 ms in flight, each
    # at the edge of its patience (0.53 of capacity, 141 timeouts in 15 s).
    import loadshed.sim.scenarios as scenarios

    def run(algorithm: Fixed) -> dict[str, float]:
        # The scenario builds its limit by name: hand it this instance instead.
        monkeypatch.setattr(scenarios, "make_limit", lambda spec: algorithm)
        result = run_paradox(
            limiter=LimiterConfig("fixed", limit_value=algorithm.limit),
            clients=(4,),
            service=ServiceConfig(0.05),
            timeout=0.2,
            send_deadline=False,
            duration=15.0,
            dispatch_delay=0.001,
        )
        step: dict[str, float] = result["steps"][0]
        return step

    one, ahead = run(Fixed(1)), run(_OneAhead(2))
    assert ahead["timed_out"] <= 2
    assert ahead["goodput_ratio"] >= one["goodput_ratio"] >= 0.95
