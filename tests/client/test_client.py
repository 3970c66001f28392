"""AdaptiveClient against a real aiohttp upstream on loopback, and its policies
(adaptive throttle, retry budget, backoff, Retry-After) in virtual time."""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from loadshed.client import AdaptiveClient, ClientThrottled, Response, UpstreamError
from loadshed.clock import VirtualClock
from loadshed.errors import ConfigError, Rejected
from loadshed.limits import AIMD, Fixed, LimitAlgorithm, Windowed
from loadshed.retry import Backoff, RetryBudget, parse_retry_after
from loadshed.throttle import AdaptiveThrottle


class Upstream:
    """A model server stand-in: ``slots`` calls at once (503 beyond), each taking
    ``work_s``; ``refuse`` makes it answer 503 to everything."""

    def __init__(self) -> None:
        self.slots = 1000
        self.work_s = 0.0
        self.refuse = False
        self.refuse_share = 0.0
        self.rng = random.Random(5)
        self.retry_after: str | None = None
        self.active = 0
        self.arrivals: list[float] = []
        self.by_id: Counter[str] = Counter()
        self.headers: list[dict[str, str]] = []
        self.statuses: Counter[int] = Counter()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(time.monotonic())
        self.headers.append(dict(request.headers))
        self.by_id[request.query.get("id", "")] += 1
        refused = self.refuse or self.rng.random() < self.refuse_share
        if refused or self.active >= self.slots:
            self.statuses[503] += 1
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return web.Response(status=503, text="busy", headers=headers)
        self.active += 1
        try:
            await asyncio.sleep(self.work_s)
        finally:
            self.active -= 1
        self.statuses[200] += 1
        return web.json_response({"ok": True})


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream()
    app = web.Application()
    app.router.add_route("*", "/predict", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    server.url = f"http://{host}:{port}"
    yield server
    await runner.cleanup()


def quick_backoff() -> Backoff:
    return Backoff(base=0.001, cap=0.004)


async def test_a_call_returns_the_answer_and_splits_queue_from_upstream_time(
    upstream: Upstream,
) -> None:
    upstream.work_s = 0.05
    async with AdaptiveClient(upstream.url, limit=Fixed(1)) as client:
        responses = await asyncio.gather(*(client.post("/predict", json={}) for _ in range(4)))
        stats = client.stats()
    assert [r.status for r in responses] == [200] * 4
    assert responses[0].json() == {"ok": True}
    assert max(upstream.arrivals) - min(upstream.arrivals) >= 0.14  # one at a time
    # each call spent ~50 ms at the upstream; with a limit of 1 the last waited ~150 ms
    assert stats.counts["ok"] == 4
    assert stats.upstream.count == 4
    assert 0.04 <= stats.upstream.p50 <= 0.5
    assert stats.queue_wait.max >= 0.13
    assert stats.queue_wait.p50 >= 0.04
    assert max(r.queue_wait_s for r in responses) >= 0.13
    assert stats.total.max >= stats.queue_wait.max + 0.04


async def test_the_deadline_is_sent_and_enforced(upstream: Upstream) -> None:
    upstream.work_s = 1.0
    async with AdaptiveClient(upstream.url, timeout=0.3) as client:
        with pytest.raises(TimeoutError):
            await client.get("/predict")
        stats = client.stats()
    sent = float(upstream.headers[0]["X-Request-Timeout"])
    assert 0.05 < sent <= 0.3  # seconds left when sent
    assert stats.counts["timeout"] == 1
    # a timeout is an overload sign for the limit algorithm
    assert client.limiter.snapshot().counts["dropped"] == 1


async def test_connection_pool_is_sized_from_the_limit() -> None:
    async with AdaptiveClient("http://127.0.0.1:9") as client:
        default = client.limiter.admission.algorithm
        assert isinstance(default, Windowed)
        assert isinstance(default.inner, AIMD)
        assert default.inner.backoff_ratio == 0.5
        assert client.session.connector is not None
        assert client.session.connector.limit == default.max_limit == 128
    algorithm = AIMD(initial_limit=4, max_limit=77)
    async with AdaptiveClient("http://127.0.0.1:9", limit=algorithm) as client:
        connector = client.session.connector
        assert connector is not None
        assert connector.limit == 77
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=10)) as session:
        with pytest.raises(ConfigError, match=r"^session: .*limit \(10\)"):
            AdaptiveClient(session=session, limit=algorithm)
        # a session with a large enough pool is wrapped as is
        wrapped = AdaptiveClient(session=session, limit=Fixed(10))
        assert wrapped.session is session
        await wrapped.close()
        assert not session.closed


async def test_retry_after_is_waited(upstream: Upstream) -> None:
    upstream.refuse = True
    upstream.retry_after = "1"

    async def recover() -> None:
        await asyncio.sleep(0.2)
        upstream.refuse = False

    async with AdaptiveClient(upstream.url) as client:
        recovering = asyncio.ensure_future(recover())
        response = await client.post("/predict", json={})
        await recovering
        stats = client.stats()
    assert response.status == 200
    assert response.attempts == 2
    gap = upstream.arrivals[1] - upstream.arrivals[0]
    assert 1.0 <= gap < 2.0  # at least the second asked for (+0-10 % jitter)
    assert response.queue_wait_s >= 1.0
    assert stats.counts["retries"] == 1
    assert stats.counts["upstream_503"] == 1


async def test_retry_after_beyond_the_deadline_is_not_waited(upstream: Upstream) -> None:
    upstream.refuse = True
    upstream.retry_after = "5"
    async with AdaptiveClient(upstream.url, timeout=1.0) as client:
        started = time.monotonic()
        response = await client.post("/predict", json={})
    assert time.monotonic() - started < 0.5
    assert response.status == 503
    assert response.attempts == 1
    with pytest.raises(UpstreamError, match="503"):
        response.raise_for_status()


async def test_retries_never_exceed_the_budget(upstream: Upstream) -> None:
    upstream.refuse_share = 0.4  # 40 % refused: not enough for the throttle (K = 2)
    budget = RetryBudget(ratio=0.1, min_retries=3, window=60)
    calls = 300
    async with AdaptiveClient(
        upstream.url,
        limit=Fixed(8),
        max_attempts=5,
        retry_budget=budget,
        backoff=quick_backoff(),
    ) as client:

        async def call(index: int) -> Response:
            return await client.post(f"/predict?id={index}", json={})

        results = [r async for r in client.map(call, range(calls), return_exceptions=True)]
        stats = client.stats()
    assert len(results) == calls
    first_attempts = len(upstream.by_id)
    retries = sum(count - 1 for count in upstream.by_id.values())
    assert first_attempts == calls
    assert client.throttle.refused == 0
    assert upstream.statuses[503] > 0.3 * calls  # far more failures than retries allowed
    # the upstream saw at most 10 % retries (plus the reserve of 3), and so did the client
    assert retries <= 0.1 * first_attempts + 3
    assert retries == stats.counts["retries"]
    assert budget.totals() == (first_attempts, retries + stats.counts.get("retry_throttled", 0))
    assert stats.counts["retry_denied"] > 0
    assert budget.denied == stats.counts["retry_denied"]


async def test_backs_off_on_503_and_recovers(upstream: Upstream) -> None:
    upstream.work_s = 0.002
    algorithm = AIMD(initial_limit=8, min_limit=1, max_limit=32)
    # the throttle's window runs on a virtual clock, so the test can let a minute pass
    minutes = VirtualClock()
    dice = Dial(0.5)  # the throttle's random draws: refuse whenever p > 0.5
    throttle = AdaptiveThrottle(window=60, buckets=60, clock=minutes, random=dice)
    async with AdaptiveClient(
        upstream.url, limit=algorithm, throttle=throttle, max_attempts=1
    ) as client:

        async def call(index: int) -> Response:
            return await client.post("/predict", json={})

        async def run(count: int) -> list[Response | BaseException]:
            return [r async for r in client.map(call, range(count), return_exceptions=True)]

        def ok(results: list[Response | BaseException]) -> int:
            return sum(isinstance(r, Response) and r.status == 200 for r in results)

        healthy = await run(100)
        assert ok(healthy) == 100
        assert client.limiter.limit > 8
        minutes.advance(61)

        # the upstream refuses everything: the limit collapses, and once the window
        # holds 20 requests and no accepts, calls are refused locally instead of
        # hammering it
        upstream.refuse = True
        sent_before = len(upstream.arrivals)
        overloaded = await run(300)
        sent = len(upstream.arrivals) - sent_before
        throttled = sum(isinstance(r, ClientThrottled) for r in overloaded)
        assert client.limiter.limit == 1
        assert sent + throttled == 300
        assert 20 <= sent <= 40  # min_requests, plus the calls let through meanwhile
        assert client.stats().throttle_probability > 0.95

        # the upstream recovers: calls let through (here: every draw passes) are
        # accepted, which brings the probability down by itself...
        upstream.refuse = False
        dice.value = 0.999
        trickle = await run(100)
        assert ok(trickle) == 100
        assert client.stats().throttle_probability < 0.6
        # ... and once the window has passed, nothing is refused
        dice.value = 0.5
        minutes.advance(61)
        recovered = await run(300)
        assert ok(recovered) == 300
        assert client.limiter.limit > 8
        assert client.stats().throttle_probability == 0


async def test_a_capacity_limited_upstream_gets_fewer_503s_than_a_fixed_overload(
    upstream: Upstream,
) -> None:
    upstream.slots = 4  # and no queue: the fifth call at once is refused
    upstream.work_s = 0.01

    async def served(limit: LimitAlgorithm | None) -> tuple[int, AdaptiveClient]:
        async with AdaptiveClient(upstream.url, limit=limit, max_attempts=1) as client:

            async def call(index: int) -> Response:
                return await client.post("/predict", json={})

            results = [r async for r in client.map(call, range(400), return_exceptions=True)]
        assert len(results) == 400
        return sum(isinstance(r, Response) and r.status == 200 for r in results), client

    adaptive_ok, adaptive = await served(None)
    fixed_ok, fixed = await served(Fixed(32))
    # the adaptive limit settles near the 4 slots; a fixed 32 is refused so often
    # that its own throttle ends up refusing most calls locally
    assert adaptive.limiter.limit <= 8
    # The default backs off on the first refusal (its window closes on a drop) and
    # counts one back-off per round trip: 385 of 400 served, idle or with both cores
    # busy; before, a window of refusals churned on the slot above the upstream's 4
    # and the throttle then refused 200+ calls locally (52 to 89 served).
    assert adaptive_ok >= 300
    assert adaptive_ok > 4 * fixed_ok
    assert fixed.throttle.refused > 200


async def test_connection_errors_are_retried_then_raised() -> None:
    async with AdaptiveClient("http://127.0.0.1:9", backoff=quick_backoff()) as client:
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.get("/predict")
        stats = client.stats()
    assert stats.counts["connection_error"] == 1
    assert stats.counts["attempts"] == 3
    assert client.limiter.snapshot().counts["dropped"] == 3


async def test_local_queue_full_is_rejected(upstream: Upstream) -> None:
    upstream.work_s = 0.2
    async with AdaptiveClient(upstream.url, limit=Fixed(1), max_queue=1) as client:
        calls = [asyncio.ensure_future(client.get("/predict")) for _ in range(3)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        stats = client.stats()
    assert sum(isinstance(r, Response) for r in results) == 2
    rejected = [r for r in results if isinstance(r, Rejected)]
    assert len(rejected) == 1
    assert stats.counts["rejected"] == 1


def test_invalid_client_configuration_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^timeout: "):
        AdaptiveClient(timeout=0)
    with pytest.raises(ConfigError, match=r"^max_attempts: "):
        AdaptiveClient(max_attempts=0)
    with pytest.raises(ConfigError, match=r"^retry_statuses: "):
        AdaptiveClient(retry_statuses=(200,))
    with pytest.raises(ConfigError, match=r"^limit: "):
        AdaptiveClient(limit="fastest")


# ---------------------------------------------------------------- policies


class Dial:
    """Injected random source returning a settable value."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self) -> float:
        return self.value


class Draws:
    """Injected random source: the given values in turn, then 1.0 (never refuses)."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def __call__(self) -> float:
        return self.values.pop(0) if self.values else 1.0


def test_throttle_probability_follows_the_sre_formula() -> None:
    clock = VirtualClock()
    throttle = AdaptiveThrottle(
        k=2, window=10, buckets=10, min_requests=0, clock=clock, random=Draws()
    )
    for _ in range(9):
        assert throttle.allow()
        throttle.record(accepted=True)
    for _ in range(9):  # up to twice the accepts are tolerated
        assert throttle.allow()
        throttle.record(accepted=False)
    assert throttle.reject_probability() == 0
    for _ in range(12):
        assert throttle.allow()
        throttle.record(accepted=False)
    # 30 requests, 9 accepts: (30 - 2 x 9) / (30 + 1)
    assert throttle.totals() == (30, 9)
    assert throttle.reject_probability() == pytest.approx(12 / 31)


def test_throttle_refuses_when_the_draw_is_below_the_probability() -> None:
    clock = VirtualClock()
    draws = Draws()
    throttle = AdaptiveThrottle(k=2, window=10, min_requests=0, clock=clock, random=draws)
    for _ in range(10):
        throttle.allow()
        throttle.record(accepted=False)
    assert throttle.reject_probability() == pytest.approx(10 / 11)
    draws.values = [0.2, 0.95]
    assert throttle.allow() is False  # 0.2 < 10/11
    assert throttle.reject_probability() == pytest.approx(11 / 12)  # refusals count
    assert throttle.allow() is True  # 0.95 >= 11/12
    assert throttle.refused == 1


def test_throttle_waits_for_min_requests() -> None:
    throttle = AdaptiveThrottle(min_requests=20, clock=VirtualClock(), random=lambda: 0.0)
    for _ in range(19):
        assert throttle.allow()
        throttle.record(accepted=False)
    assert throttle.reject_probability() == 0
    throttle.record(accepted=False)
    assert throttle.reject_probability() == pytest.approx(20 / 21)
    assert not throttle.allow()


def test_throttle_forgets_after_its_window() -> None:
    clock = VirtualClock()
    throttle = AdaptiveThrottle(k=2, window=10, buckets=10, clock=clock, random=lambda: 0.0)
    for _ in range(50):
        throttle.allow()
        throttle.record(accepted=False)
    assert throttle.reject_probability() > 0.9
    clock.advance(5)
    assert throttle.reject_probability() > 0.9
    clock.advance(5.5)
    assert throttle.reject_probability() == 0
    assert throttle.totals() == (0, 0)


def test_retry_budget_allows_ten_percent_plus_reserve() -> None:
    clock = VirtualClock()
    budget = RetryBudget(ratio=0.1, min_retries=3, window=10, clock=clock)
    for _ in range(100):
        budget.record_request()
    allowed = 0
    while budget.try_retry():
        allowed += 1
    assert allowed == 13
    assert budget.denied == 1
    budget.record_request()
    assert not budget.try_retry()  # 101 requests still allow 13
    for _ in range(9):
        budget.record_request()
    assert budget.try_retry()  # 110 requests: 14
    clock.advance(11)  # the window has passed: only the reserve is left
    assert [budget.try_retry() for _ in range(4)] == [True, True, True, False]


def test_backoff_full_jitter_and_retry_after() -> None:
    backoff = Backoff(base=0.1, cap=1.0, random=Draws(0.5, 0.999, 0.999, 0.0, 1.0))
    assert backoff.delay(1) == pytest.approx(0.05)
    assert backoff.delay(3) == pytest.approx(0.3996)
    assert backoff.delay(20) == pytest.approx(0.999)  # capped
    assert backoff.delay(1, retry_after=2.0) == 2.0  # never sooner than asked
    assert backoff.delay(1, retry_after=2.0) == pytest.approx(2.2)  # at most +10 %


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.25 ") == 0.25
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    date = email.utils.formatdate(now + 7, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(7.0)
    assert parse_retry_after(email.utils.formatdate(now - 7, usegmt=True), now=now) == 0.0


def test_policy_configuration_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^k: "):
        AdaptiveThrottle(k=0.5)
    with pytest.raises(ConfigError, match=r"^window: "):
        AdaptiveThrottle(window=0)
    with pytest.raises(ConfigError, match=r"^ratio: "):
        RetryBudget(ratio=1.5)
    with pytest.raises(ConfigError, match=r"^backoff_cap: "):
        Backoff(base=1.0, cap=0.5)


async def test_a_call_with_a_cost_sends_it_and_feeds_the_local_cost_model(
    upstream: Upstream,
) -> None:
    async with AdaptiveClient(upstream.url, limit=Fixed(4)) as client:
        for rows in range(1, 21):
            response = await client.post("/predict", json={}, cost=rows)
            assert response.status == 200
        with pytest.raises(ConfigError, match="cost"):
            await client.post("/predict", json={}, cost=0)
        model = client.limiter.admission.cost_model
        # Sent exactly, whatever its size (":g" sent 1234567 as 1.23457e+06).
        await client.post("/predict", json={}, cost=1234567)
        await client.post("/predict", json={}, cost=2.5)
    sent = [h.get("X-Request-Cost") for h in upstream.headers]
    assert sent == [str(r) for r in range(1, 21)] + ["1234567", "2.5"]
    assert model.fitted
    assert client.limiter.admission.cost_counts["completed"] == sum(range(1, 21)) + 1234567 + 2.5
