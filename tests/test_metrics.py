"""Prometheus metrics scraped over real HTTP from a protected app."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from limit_feeds import feed_fifo_origin
from loadshed.asgi import LoadShedMiddleware
from loadshed.errors import Rejected
from loadshed.limiter import Limiter
from loadshed.limits.fixed import Fixed
from loadshed.limits.little import Little
from loadshed.metrics import LoadshedMetrics
from loadshed.testing import serve


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_metrics_count_outcomes_rejections_and_state() -> None:
    release = threading.Event()

    async def work(request: Request) -> Response:
        while request.query_params.get("hold") and not release.is_set():
            await asyncio.sleep(0.005)
        status = int(request.query_params.get("status", "200"))
        return PlainTextResponse("x", status_code=status)

    limiter = Limiter(Fixed(1), name="model", max_queue=0)
    app = LoadShedMiddleware(
        Starlette(routes=[Route("/work", work)]), limiter=limiter, metrics_path="/metrics"
    )
    with serve(app) as url:
        async with aiohttp.ClientSession() as session:
            for status in (200, 200, 500, 404):
                async with session.get(f"{url}/work?status={status}") as resp:
                    assert resp.status == status
            held = asyncio.ensure_future(session.get(f"{url}/work?hold=1"))
            while limiter.inflight < 1:
                await asyncio.sleep(0.005)
            async with session.get(f"{url}/work") as resp:
                assert resp.status == 503
            async with session.get(f"{url}/work", headers={"X-Priority": "bogus"}) as resp:
                assert resp.status == 503
            async with session.get(f"{url}/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
            release.set()
            (await held).release()
    found = samples(text)
    model = ("limiter", "model")
    assert found[("loadshed_limit", (model,))] == 1
    assert found[("loadshed_inflight", (model,))] == 1
    assert found[("loadshed_queue_length", (model,))] == 0

    def requests(outcome: str, reason: str = "") -> float:
        key = ("loadshed_requests_total", (model, ("outcome", outcome), ("reason", reason)))
        return found[key]

    assert requests("success") == 2
    assert requests("dropped") == 1
    assert requests("ignored") == 1
    assert requests("rejected", "limit") == 2
    assert found[("loadshed_service_seconds_count", (model,))] == 3  # ignored is not a sample
    assert found[("loadshed_queue_wait_seconds_count", (model,))] == 5
    assert found[("loadshed_malformed_headers_total", (("header", "x-priority"),))] == 1


def test_track_is_idempotent_and_registry_is_private() -> None:
    first, second = LoadshedMetrics(), LoadshedMetrics()
    limiter = Limiter(Fixed(3), name="a")
    first.track(limiter)
    first.track(limiter)
    second.track(limiter)
    limiter.try_acquire().success()
    value = first.registry.get_sample_value(
        "loadshed_requests_total", {"limiter": "a", "outcome": "success", "reason": ""}
    )
    assert value == 1
    assert first.registry.get_sample_value("loadshed_limit", {"limiter": "a"}) == 3


def test_headroom_is_exported_per_limiter() -> None:
    little = Little(headroom=True)
    feed_fifo_origin(little, workers=1, service=0.025, seconds=60, dispatch=0.001)
    metrics = LoadshedMetrics()
    metrics.track_all([Limiter(little, name="fed"), Limiter(Fixed(2), name="fixed")])

    def headroom(name: str) -> float | None:
        return metrics.registry.get_sample_value("loadshed_limit_headroom", {"limiter": name})

    assert (headroom("fed"), headroom("fixed")) == (1, 0)


def test_limiters_sharing_a_name_are_exported_once_counts_read_at_scrape_time() -> None:
    metrics = LoadshedMetrics()
    first, second = Limiter(Fixed(1), name="m", max_queue=0), Limiter(Fixed(1), name="m")
    metrics.track_all([first, second])
    first.try_acquire().success()
    held = first.try_acquire()
    for _ in range(3):
        with pytest.raises(Rejected):
            first.try_acquire()
    second.try_acquire().dropped()

    def value(outcome: str, reason: str = "") -> float | None:
        labels = {"limiter": "m", "outcome": outcome, "reason": reason}
        return metrics.registry.get_sample_value("loadshed_requests_total", labels)

    assert (value("success"), value("dropped"), value("rejected", "limit")) == (1, 1, 3)
    assert value("rejected", "deadline") == 0  # every label set is there from the start
    # One sample per label set: slots add up (an exposition with duplicates is refused).
    assert metrics.registry.get_sample_value("loadshed_limit", {"limiter": "m"}) == 2
    assert metrics.registry.get_sample_value("loadshed_inflight", {"limiter": "m"}) == 1
    text = generate_latest(metrics.registry).decode()
    assert text.count('loadshed_limit{limiter="m"}') == 1
    held.success()
    assert value("success") == 2
