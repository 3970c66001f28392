"""A limit in cost units (``limit_unit="cost"``): the cost in flight, not the number of
requests, is bounded. In virtual time for the core, over real HTTP for the middleware
and the proxy."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from loadshed.admission import Admission, Ticket, Token
from loadshed.asgi import LoadShedMiddleware
from loadshed.clock import VirtualClock
from loadshed.config import AdmissionConfig, LimitUnit
from loadshed.errors import ConfigError, Priority
from loadshed.limiter import Limiter
from loadshed.limits.fixed import Fixed
from loadshed.limits.little import Little
from loadshed.metrics import LoadshedMetrics
from loadshed.proxy.app import create_proxy
from loadshed.proxy.cli import proxy as proxy_command
from loadshed.proxy.config import ProxyConfig, parse_upstream
from loadshed.testing import serve


def _core(limit: int, **settings: object) -> tuple[Admission, VirtualClock, list[Token]]:
    clock = VirtualClock()
    admission = Admission(Fixed(limit), clock, limit_unit="cost", **settings)  # type: ignore[arg-type]
    return admission, clock, []


def _submit(
    admission: Admission, granted: list[Token], cost: float | None, **kw: object
) -> Token | Ticket:
    return admission.submit(
        on_grant=granted.append,
        on_reject=lambda _: None,
        cost=cost,
        **kw,  # type: ignore[arg-type]
    )


def test_the_cost_in_flight_stays_under_the_limit_and_the_queue_keeps_its_order() -> None:
    admission, _, granted = _core(100)
    first = _submit(admission, granted, 60)
    second = _submit(admission, granted, 30)
    assert isinstance(first, Token) and isinstance(second, Token)
    assert admission.inflight == 2 and admission.inflight_cost == 90
    big = _submit(admission, granted, 50)  # 140 > 100: waits
    small = _submit(admission, granted, None)  # one unit would fit, but it is behind
    assert isinstance(big, Ticket) and isinstance(small, Ticket)
    assert admission.grant_now(cost=1) is None  # nor does the fast path pass the queue
    second.release()
    assert granted == []  # 60 + 50 > 100 still: the head waits, and so does the rest
    first.release()
    assert [token.cost for token in granted] == [50, None]
    assert admission.inflight_cost == 51
    snapshot = admission.snapshot()
    assert snapshot.inflight == 2 and snapshot.inflight_cost == 51
    for token in granted:
        token.release()
    assert admission.inflight == 0 and admission.inflight_cost == 0.0


def test_a_request_costing_more_than_the_limit_runs_alone() -> None:
    admission, _, granted = _core(10)
    huge = _submit(admission, granted, 500)
    assert isinstance(huge, Token) and admission.inflight_cost == 500
    assert isinstance(_submit(admission, granted, 1), Ticket)
    huge.release()
    assert len(granted) == 1 and admission.inflight_cost == 1
    # Behind a small one in flight, a huge one waits until it is alone.
    waiting = _submit(admission, granted, 500)
    assert isinstance(waiting, Ticket)
    granted.pop().release()
    assert len(granted) == 1 and granted[0].cost == 500


def test_reserved_shares_are_shares_of_the_cost_limit() -> None:
    admission, _, granted = _core(100, reserved={Priority.CRITICAL: 0.3})
    held = _submit(admission, granted, 60, priority=Priority.DEFAULT)
    assert isinstance(held, Token)
    # 30 units are kept for critical requests: a default one of 20 does not fit (60 + 20
    # > 70), a critical one of 35 does (95 <= 100).
    assert admission.grant_now(cost=20, priority=Priority.DEFAULT) is None
    assert isinstance(admission.grant_now(cost=35, priority=Priority.CRITICAL), Token)
    assert admission.inflight_cost == 95


def test_the_queue_drains_through_the_requests_in_flight_for_retry_after() -> None:
    # With the limit in cost units, Retry-After counts the requests the limit holds at
    # a time (those in flight), not the limit's thousands of units.
    admission, clock, granted = _core(1000, max_queue_wait=10.0)
    for _ in range(4):
        token = admission.grant_now(cost=250)
        assert token is not None
        clock.advance(0.1)
        token.release()  # a mean service time of 0.1 s
    for _ in range(4):
        assert isinstance(_submit(admission, granted, 250), Token)
    for _ in range(8):
        assert isinstance(_submit(admission, granted, 250), Ticket)
    # 8 queued through 4 in flight at 0.1 s each: about 0.2 s, not 8 / 1000 x 0.1.
    assert admission.retry_after() == pytest.approx((8 + 1) / 4 * 0.1, rel=0.05)


def test_without_the_setting_the_limit_counts_requests() -> None:
    clock = VirtualClock()
    admission = Admission(Fixed(2), clock)
    assert not admission.counts_cost
    assert isinstance(admission.grant_now(cost=500), Token)
    assert isinstance(admission.grant_now(cost=500), Token)
    assert admission.grant_now(cost=1) is None
    assert admission.inflight_cost == 0.0


def test_bad_limit_unit_settings_fail_at_start_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^limit_unit: got 'tokens', allowed: requests\|cost"):
        AdmissionConfig(limit_unit="tokens")  # type: ignore[arg-type]
    assert AdmissionConfig(limit_unit="cost").limit_unit is LimitUnit.COST  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^limit_unit: cost needs a fixed limit"):
        Admission(Little(), VirtualClock(), limit_unit="cost")
    with pytest.raises(ConfigError, match=r"^limit_unit: cost needs a fixed limit"):
        Limiter("little", limit_unit="cost")
    upstream = (parse_upstream("http://127.0.0.1:1"),)
    with pytest.raises(ConfigError, match=r"^--limit-unit: cost needs --limit fixed:N"):
        ProxyConfig(upstreams=upstream, limit_unit="cost")
    with pytest.raises(ConfigError, match=r"^--limit-unit: cost needs --cost-header"):
        ProxyConfig(upstreams=upstream, limit="fixed:8", limit_unit="cost", cost_header=None)
    with pytest.raises(ConfigError, match=r"^--limit-unit: got 'rows', allowed: requests\|cost"):
        ProxyConfig(upstreams=upstream, limit="fixed:8", limit_unit="rows")
    result = CliRunner().invoke(proxy_command, ["-u", "http://127.0.0.1:1", "--limit-unit", "cost"])
    assert result.exit_code == 2 and "--limit-unit: cost needs --limit fixed:N" in result.output
    assert "Traceback" not in result.output


class _Tracker:
    """An upstream model that records the most cost it ever held at once."""

    def __init__(self) -> None:
        self.held = 0.0
        self.most = 0.0

    async def predict(self, request: Request) -> Response:
        cost = float(request.headers.get("x-request-cost", "1"))
        self.held += cost
        self.most = max(self.most, self.held)
        try:
            await asyncio.sleep(0.05)
        finally:
            self.held -= cost
        return PlainTextResponse("ok")


async def _burst(url: str, costs: list[int]) -> list[int]:
    async with aiohttp.ClientSession() as session:

        async def one(cost: int) -> int:
            headers = {"X-Request-Cost": str(cost)}
            async with session.get(f"{url}/predict", headers=headers) as response:
                return response.status

        return await asyncio.gather(*(one(cost) for cost in costs))


COSTS = [7, 3, 5, 9, 2, 6, 4, 8, 1, 10, 5, 5]


async def test_the_middleware_holds_the_cost_in_flight_under_its_limit() -> None:
    tracker = _Tracker()
    upstream = Starlette(routes=[Route("/predict", tracker.predict)])
    metrics = LoadshedMetrics()
    limiter = Limiter("fixed:12", limit_unit="cost", max_queue_wait=10.0)
    app = LoadShedMiddleware(upstream, limiter=limiter, metrics=metrics, metrics_path="/m")
    with serve(app) as url:
        statuses = await _burst(url, COSTS)
        async with aiohttp.ClientSession() as session, session.get(f"{url}/m") as response:
            text = await response.text()
    assert statuses == [200] * len(COSTS)  # queued, not refused
    assert tracker.most <= 12
    assert tracker.most >= 9  # it did run several at once
    assert limiter.inflight_cost == 0.0
    assert 'loadshed_inflight_cost{limiter="default"} 0.0' in text


async def test_the_proxy_holds_the_cost_in_flight_under_its_limit() -> None:
    tracker = _Tracker()
    upstream = Starlette(routes=[Route("/predict", tracker.predict)])
    with serve(upstream) as upstream_url:
        config = ProxyConfig(
            upstreams=(parse_upstream(upstream_url),),
            limit="fixed:12",
            limit_unit="cost",
            max_queue_wait=10.0,
        )
        app, proxy = create_proxy(config)
        try:
            with serve(app) as url:
                statuses = await _burst(url, COSTS)
        finally:
            await proxy.aclose()
    assert statuses == [200] * len(COSTS)
    assert 9 <= tracker.most <= 12
    assert proxy.pool.upstreams[0].limiter.admission.counts_cost
