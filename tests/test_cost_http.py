"""Request costs over real HTTP: the middleware's cost header and cost callable, the
proxy's ``--cost-header``, and the cost metrics."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from loadshed.asgi import LoadShedMiddleware
from loadshed.asgitypes import Scope
from loadshed.errors import ConfigError
from loadshed.limiter import Limiter
from loadshed.limits.fixed import Fixed
from loadshed.metrics import LoadshedMetrics
from loadshed.proxy.app import create_proxy
from loadshed.proxy.config import ProxyConfig, parse_upstream
from loadshed.testing import serve

SECONDS_PER_ROW = 0.002


async def rows(request: Request) -> Response:
    """A model whose time grows with the rows of the batch: 2 ms + 2 ms per row."""
    count = int(request.query_params.get("rows", "1"))
    await asyncio.sleep(SECONDS_PER_ROW * (1 + count))
    return PlainTextResponse("ok")


APP = Starlette(routes=[Route("/predict", rows)])


async def _warm(session: aiohttp.ClientSession, url: str, header: str = "X-Request-Cost") -> None:
    for count in range(1, 25):
        async with session.get(f"{url}/predict?rows={count}", headers={header: str(count)}) as r:
            assert r.status == 200


async def test_a_big_batch_that_cannot_meet_its_deadline_is_refused_at_arrival() -> None:
    metrics = LoadshedMetrics()
    app = LoadShedMiddleware(APP, limiter=Limiter(Fixed(4)), metrics=metrics, metrics_path="/m")
    with serve(app) as url:
        async with aiohttp.ClientSession() as session:
            await _warm(session, url)
            model = app.limiter.admission.cost_model
            assert model.fitted
            assert model.slope == pytest.approx(SECONDS_PER_ROW, rel=0.5)
            # 500 rows take about a second: with 0.3 s left, refused now (not timed out).
            big = {"X-Request-Cost": "500", "X-Request-Timeout": "0.3"}
            async with session.get(f"{url}/predict?rows=500", headers=big) as response:
                assert response.status == 503
                assert (await response.json())["reason"] == "deadline"
                assert int(response.headers["Retry-After"]) >= 1
            # A small batch with the same deadline is admitted and served.
            small = {"X-Request-Cost": "5", "X-Request-Timeout": "0.3"}
            async with session.get(f"{url}/predict?rows=5", headers=small) as response:
                assert response.status == 200
            # Without a cost, a request with that deadline is judged on the recent mean.
            blind = {"X-Request-Timeout": "0.3"}
            async with session.get(f"{url}/predict?rows=1", headers=blind) as response:
                assert response.status == 200
            async with session.get(f"{url}/predict", headers={"X-Request-Cost": "-3"}) as bad:
                assert bad.status == 200  # a malformed cost is ignored, and counted
            async with session.get(f"{url}/m") as response:
                text = await response.text()
    assert app.malformed_headers == {"x-request-cost": 1}
    counts = app.limiter.admission.cost_counts
    assert counts["refused"] == 500.0
    assert counts["completed"] == sum(range(1, 25)) + 5
    assert 'loadshed_cost_total{event="refused",limiter="default"} 500.0' in text
    assert "loadshed_cost_model_slope_seconds" in text


async def test_a_cost_callable_reads_the_request_and_its_failures_mean_no_cost() -> None:
    def cost(scope: Scope) -> float | None:
        query = scope.get("query_string", b"").decode()
        if "boom" in query:
            raise ValueError("no rows")
        for part in query.split("&"):
            if part.startswith("rows="):
                return float(part[5:])
        return None

    app = LoadShedMiddleware(APP, limiter=Limiter(Fixed(4)), cost=cost)
    with serve(app) as url:
        async with aiohttp.ClientSession() as session:
            for count in range(1, 25):
                async with session.get(f"{url}/predict?rows={count}") as response:
                    assert response.status == 200
            async with session.get(f"{url}/predict?boom=1") as response:
                assert response.status == 200
            timeout = {"X-Request-Timeout": "0.3"}
            async with session.get(f"{url}/predict?rows=500", headers=timeout) as response:
                assert response.status == 503
    assert app.limiter.admission.cost_model.fitted
    assert app.malformed_headers == {"cost": 1}


def test_bad_cost_settings_fail_at_start() -> None:
    with pytest.raises(ConfigError, match="cost_header"):
        LoadShedMiddleware(APP, cost_header="")
    with pytest.raises(ConfigError, match="cost"):
        LoadShedMiddleware(APP, cost=42)  # type: ignore[arg-type]
    # The same header for the cost and the deadline: the cost would never be read.
    with pytest.raises(ConfigError, match=r"^cost_header: must differ from deadline_header"):
        LoadShedMiddleware(APP, cost_header="X-Request-Timeout")
    with pytest.raises(ConfigError, match="--cost-header"):
        ProxyConfig(upstreams=(parse_upstream("http://127.0.0.1:1"),), cost_header="a b")
    with pytest.raises(
        ConfigError, match=r"^--discipline: got 'sjf', allowed: fifo\|lifo\|codel\|shortest$"
    ):
        ProxyConfig(upstreams=(parse_upstream("http://127.0.0.1:1"),), discipline="sjf")


async def test_the_proxy_reads_the_cost_from_its_cost_header() -> None:
    from loadshed.proxy.app import create_proxy

    with serve(APP) as upstream_url:
        config = ProxyConfig(
            upstreams=(parse_upstream(upstream_url),), limit="fixed:4", cost_header="x-rows"
        )
        app, proxy = create_proxy(config)
        try:
            with serve(app) as url:
                async with aiohttp.ClientSession() as session:
                    await _warm(session, url, header="X-Rows")
                    headers = {"X-Rows": "500", "X-Request-Timeout": "0.3"}
                    async with session.get(f"{url}/predict?rows=500", headers=headers) as r:
                        assert r.status == 503
                        assert (await r.json())["reason"] == "deadline"
        finally:
            await proxy.aclose()
        limiter = proxy.pool.upstreams[0].limiter
        assert limiter.admission.cost_counts["refused"] == 500.0


class _InOrder:
    """One worker: requests run one at a time, 1 ms + 1 ms per row, in the order
    they reach it (recorded)."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.order: list[int] = []

    async def predict(self, request: Request) -> Response:
        count = int(request.query_params.get("rows", "1"))
        async with self.lock:
            self.order.append(count)
            await asyncio.sleep(0.001 * (1 + count))
        return PlainTextResponse("ok")


@pytest.mark.parametrize(
    ("discipline", "expected"), [("fifo", [100, 20, 2]), ("shortest", [2, 20, 100])]
)
async def test_the_proxy_grants_the_shortest_predicted_first_when_told(
    discipline: str, expected: list[int]
) -> None:
    model = _InOrder()
    with serve(Starlette(routes=[Route("/predict", model.predict)])) as upstream_url:
        config = ProxyConfig(
            upstreams=(parse_upstream(upstream_url),),
            limit="fixed:1",
            max_queue_wait=10.0,
            discipline=discipline,
        )
        app, proxy = create_proxy(config)
        try:
            with serve(app) as url:
                async with aiohttp.ClientSession() as session:
                    await _warm(session, url)  # fits the cost model

                    async def one(count: int) -> int:
                        headers = {"X-Request-Cost": str(count)}
                        async with session.get(
                            f"{url}/predict?rows={count}", headers=headers
                        ) as response:
                            return response.status

                    # 300 ms holds the one slot while three others queue in turn.
                    tasks = [asyncio.create_task(one(300))]
                    for count in (100, 20, 2):
                        await asyncio.sleep(0.03)
                        tasks.append(asyncio.create_task(one(count)))
                    assert await asyncio.gather(*tasks) == [200] * 4
        finally:
            await proxy.aclose()
    assert model.order[-4:] == [300, *expected]
