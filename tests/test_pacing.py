"""Refusal pacing: the pure pacer in virtual time, and the middleware behind a real
server, where a storm of immediate retries gets its 503s at the pacing rate."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import aiohttp
import pytest

from loadshed.asgi import LoadShedMiddleware
from loadshed.errors import ConfigError
from loadshed.limiter import Limiter
from loadshed.pacing import RefusalPacer, RefusalPacing
from loadshed.testing import serve


def test_refusals_under_the_rate_are_answered_at_once() -> None:
    pacer = RefusalPacer(RefusalPacing(rate=100.0, burst=0.0))
    holds = [pacer.hold(now=i * 0.011, expected_wait=1.0) for i in range(200)]
    assert holds == [0.0] * 200
    assert pacer.held_total == 0


def test_a_storm_is_spaced_at_the_rate_after_the_burst() -> None:
    pacer = RefusalPacer(RefusalPacing(rate=100.0, burst=0.05, max_hold=10.0))
    holds = [pacer.hold(now=1.0, expected_wait=10.0) for _ in range(20)]
    # 0.05 s of burst at 100/s: the first 6 at once (5 intervals of tolerance), then
    # one more every 10 ms.
    assert holds[:6] == [0.0] * 6
    assert holds[6:] == pytest.approx([0.01 * k for k in range(1, 15)])
    assert pacer.held_total == 14
    assert pacer.hold_seconds_total == pytest.approx(sum(holds))


def test_holds_are_bounded_by_the_expected_wait_and_max_hold_and_do_not_pile_up() -> None:
    pacer = RefusalPacer(RefusalPacing(rate=10.0, burst=0.0, max_hold=0.5))
    holds = [pacer.hold(now=0.0, expected_wait=0.3) for _ in range(50)]
    assert max(holds) == pytest.approx(0.3)
    holds = [pacer.hold(now=0.0, expected_wait=5.0) for _ in range(50)]
    assert max(holds) == pytest.approx(0.5)
    # The schedule did not run away: after a quiet second, refusals are answered at once.
    assert pacer.hold(now=1.6, expected_wait=5.0) == 0.0


def test_no_more_than_max_held_refusals_are_held_at_once() -> None:
    pacer = RefusalPacer(RefusalPacing(rate=10.0, burst=0.0, max_held=2))
    pacer.hold(now=0.0, expected_wait=1.0)
    pacer.held = 2  # two being held now (the middleware counts them)
    assert pacer.hold(now=0.0, expected_wait=1.0) == 0.0
    pacer.held = 1
    assert pacer.hold(now=0.0, expected_wait=1.0) > 0.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("rate", 0), ("rate", float("nan")), ("burst", -1), ("max_hold", float("inf")),
     ("max_held", -1), ("max_held", 1.5)],
)  # fmt: skip
def test_bad_settings_are_config_errors_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"refusal_pacing.{field}"):
        RefusalPacing(**{field: value})


def test_a_rate_of_zero_turns_pacing_off() -> None:
    assert RefusalPacing.at_rate(0) is None
    assert RefusalPacing.at_rate(40.0, max_hold=0.2) == RefusalPacing(rate=40.0, max_hold=0.2)
    with pytest.raises(ConfigError, match=r"refusal_pacing\.rate"):
        RefusalPacing.at_rate(-1.0)


def test_the_middleware_refuses_a_pacing_that_is_not_a_setting() -> None:
    with pytest.raises(ConfigError, match="refusal_pacing"):
        LoadShedMiddleware(_blocked_app, refusal_pacing=100)  # type: ignore[arg-type]


_release = threading.Event()  # the server runs in its own thread and loop


async def _blocked_app(scope: Any, receive: Any, send: Any) -> None:
    """Holds its one slot until the test lets go: every other request is refused."""
    while not _release.is_set():
        await asyncio.sleep(0.01)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _storm(base_url: str, clients: int, seconds: float) -> list[tuple[int, float, str]]:
    """``clients`` loops that retry at once after each answer, for ``seconds``."""
    answers: list[tuple[int, float, str]] = []
    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def loop() -> None:
            while time.monotonic() < stop:
                sent = time.monotonic()
                async with session.get(f"{base_url}/predict") as response:
                    await response.read()
                    retry_after = response.headers.get("retry-after", "")
                    answers.append((response.status, time.monotonic() - sent, retry_after))

        await asyncio.gather(*(loop() for _ in range(clients)))
    return answers


def _occupy(base_url: str) -> asyncio.Task[None]:
    async def hold_slot() -> None:
        async with aiohttp.ClientSession() as session, session.get(f"{base_url}/x") as response:
            await response.read()

    return asyncio.ensure_future(hold_slot())


async def _run_storm(pacing: RefusalPacing | None) -> tuple[list[tuple[int, float, str]], Any]:
    _release.clear()
    limiter = Limiter("fixed:1", max_queue=0)
    app = LoadShedMiddleware(_blocked_app, limiter=limiter, refusal_pacing=pacing)
    with serve(app) as base_url:
        holder = _occupy(base_url)
        while limiter.inflight < 1:
            await asyncio.sleep(0.01)
        answers = await _storm(base_url, clients=8, seconds=1.5)
        _release.set()
        await holder
    return answers, app


async def test_a_storm_of_immediate_retries_is_answered_at_the_pacing_rate() -> None:
    paced, app = await _run_storm(RefusalPacing(rate=40.0, burst=0.0, max_hold=0.5))
    unpaced, _ = await _run_storm(None)
    assert {status for status, _, _ in paced} == {503}
    assert all(retry_after.isdigit() for _, _, retry_after in paced)  # Retry-After stays
    # 40 per second for 1.5 s, and at most one answer in flight per client beyond that.
    assert len(paced) <= 40 * 1.5 + 8 + 5
    assert len(unpaced) > 3 * len(paced)  # a tight retry loop on loopback: hundreds
    # Every hold is bounded by max_hold (0.5 s), with generous slack for a busy machine.
    assert max(latency for _, latency, _ in paced) < 0.5 + 0.5
    assert app.pacer.held_total > 0


def test_metrics_export_held_refusals_and_the_wait_bound() -> None:
    from prometheus_client import generate_latest

    from loadshed.metrics import LoadshedMetrics

    metrics = LoadshedMetrics()
    app = LoadShedMiddleware(
        _blocked_app, limit="fixed:1", metrics=metrics, refusal_pacing=RefusalPacing(rate=10.0)
    )
    assert app.pacer is not None
    for _ in range(5):
        app.pacer.hold(now=0.0, expected_wait=1.0)
    text = generate_latest(metrics.registry).decode()
    assert "loadshed_refusals_held_total 3.0" in text  # a burst of 0.1 s at 10/s: 2 at once
    assert "loadshed_refusal_hold_seconds_total 0.6" in text  # 0.1 + 0.2 + 0.3
    assert 'loadshed_queue_wait_bound_seconds{limiter="default"} 1.0' in text  # no sample yet
