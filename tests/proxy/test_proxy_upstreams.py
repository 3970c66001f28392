"""The proxy's upstreams with real servers: failures as 502s that back the limit
off, marking down and probing back, and one limit per upstream."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from loadshed.demo.origin import create_app as create_origin
from proxy_servers import free_port, origin_process, run_proxy, serve_asgi

pytestmark = pytest.mark.timeout(40)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, object], float]:
    started = time.monotonic()
    async with session.get(url) as response:
        body = await response.json(content_type=None)
        return response.status, body, time.monotonic() - started


async def test_upstream_killed_mid_request_gives_502_backs_off_and_is_probed_back() -> None:
    port = free_port()
    with origin_process(workers=4, service_time=10.0, port=port) as (upstream, process):
        with run_proxy(upstream, limit="aimd", fail_threshold=3, probe_interval=0.2) as (
            url,
            proxy,
        ):
            limiter = proxy.pool.upstreams[0].limiter
            limit_before = limiter.limit
            async with aiohttp.ClientSession() as session:
                pending = [asyncio.ensure_future(_get(session, url + "/work")) for _ in range(3)]
                while limiter.inflight < 3:  # all three are at the origin now
                    await asyncio.sleep(0.01)
                process.kill()
                results = await asyncio.wait_for(asyncio.gather(*pending), 5)
                for status, body, elapsed in results:
                    assert status == 502
                    assert body["error"] == "bad_gateway"
                    assert body["fault"] in ("reset", "refused")
                    assert elapsed < 3.0  # at the kill, not after the origin's 10 s
                assert limiter.snapshot().counts.get("dropped") == 3
                assert limiter.limit < limit_before  # AIMD backed off on the drops
                upstream_state = proxy.pool.upstreams[0]
                assert not upstream_state.up  # 3 connection failures: marked down
                status, body, elapsed = await _get(session, url + "/work")
                assert status == 503 and body["error"] == "no_upstream"
                assert elapsed < 0.5

                process.wait(timeout=5)
                with origin_process(workers=4, service_time=0.05, port=port):
                    deadline = time.monotonic() + 10
                    while not upstream_state.up:
                        assert time.monotonic() < deadline, "upstream never probed back up"
                        await asyncio.sleep(0.05)
                    status, body, _ = await _get(session, url + "/work")
                    assert status == 200
                    assert body["worked_seconds"] == 0.05


async def test_refused_upstream_gives_502_then_fast_503_while_down() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with run_proxy(dead, fail_threshold=2, probe_interval=5.0) as (url, proxy):
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                status, body, elapsed = await _get(session, url + "/x")
                assert status == 502
                assert body["fault"] == "refused"
                assert elapsed < 1.0
            async with session.get(url + "/x") as response:
                assert response.status == 503
                assert response.headers["retry-after"] == "5"
                assert (await response.json())["error"] == "no_upstream"
        assert proxy.pool.upstreams[0].times_marked_down == 1


async def test_two_upstreams_with_different_capacities_get_their_own_limits() -> None:
    small_app = create_origin(workers=2, service_time=0.05, queue=0)
    big_app = create_origin(workers=8, service_time=0.05, queue=0)
    with serve_asgi(small_app) as small, serve_asgi(big_app) as big:
        with run_proxy(small, big, limit="aimd", max_queue=200) as (url, proxy):
            small_up, big_up = proxy.pool.upstreams
            assert small_up.limiter is not big_up.limiter
            served = {"ok": 0, "other": 0}
            stop_at = time.monotonic() + 3.0

            async def client(session: aiohttp.ClientSession) -> None:
                while time.monotonic() < stop_at:
                    async with session.get(url + "/work") as response:
                        await response.read()
                        served["ok" if response.status == 200 else "other"] += 1

            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(connector=connector) as session:
                await asyncio.gather(*(client(session) for _ in range(24)))
            small_limit, big_limit = small_up.limiter.limit, big_up.limiter.limit
            small_ok = small_up.limiter.snapshot().counts.get("success", 0)
            big_ok = big_up.limiter.snapshot().counts.get("success", 0)
    # Each limit followed its own upstream: AIMD saws above the workers it finds
    # (a drop takes 10 %, each busy success adds one), the small one far lower.
    assert small_limit < big_limit, (small_limit, big_limit)
    assert small_limit <= 6, (small_limit, big_limit)
    # Both served, the big one several times as much (it has 4x the workers).
    assert big_ok > 2 * small_ok > 0, (small_ok, big_ok)
    assert served["ok"] == small_ok + big_ok
