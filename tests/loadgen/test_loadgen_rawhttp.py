"""The lean HTTP/1.1 client (``--client raw``) against real servers: framing, keep-alive,
errors, and the same accounting as the aiohttp client."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from loadgen_targets import serve_canned, serve_silent, serve_target
from loadshed.loadgen.options import BenchOptions
from loadshed.loadgen.rawhttp import (
    ConnectFailed,
    MalformedResponse,
    RawHttpClient,
    ResponseIncomplete,
)
from loadshed.loadgen.runner import run_bench


def _send_many(client: RawHttpClient, times: int) -> list[int]:
    async def main() -> list[int]:
        try:
            return [await client.send() for _ in range(times)]
        finally:
            await client.close()

    return uvloop.run(main())


def test_keep_alive_reuses_one_connection() -> None:
    with serve_target() as target:
        client = RawHttpClient(f"{target.url}/ok")
        assert _send_many(client, 5) == [200] * 5
        assert target.hits == 5


def test_chunked_head_post_and_status_codes() -> None:
    with serve_target() as target:
        assert _send_many(RawHttpClient(f"{target.url}/chunked"), 3) == [200] * 3
        assert _send_many(RawHttpClient(f"{target.url}/chunked", method="HEAD"), 2) == [200] * 2
        post = RawHttpClient(
            f"{target.url}/echo", method="POST", body=b"x" * 10_000, headers={"X-A": "1"}
        )
        assert _send_many(post, 2) == [200, 200]
        assert _send_many(RawHttpClient(f"{target.url}/status/503"), 2) == [503, 503]
        assert _send_many(RawHttpClient(f"{target.url}/status/204"), 2) == [204, 204]


def test_close_delimited_response_ends_with_the_connection() -> None:
    with serve_canned(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nbody until close") as s:
        assert _send_many(RawHttpClient(s.url), 3) == [200] * 3


def test_errors_are_typed() -> None:
    with serve_canned(b"this is not http\r\n\r\n") as garbage:
        with pytest.raises(MalformedResponse):
            _send_many(RawHttpClient(garbage.url), 1)
    with serve_canned(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort") as short:
        with pytest.raises(ResponseIncomplete):
            _send_many(RawHttpClient(short.url), 1)
    with serve_target() as target:
        url = target.url
    with pytest.raises(ConnectFailed):
        _send_many(RawHttpClient(url), 1)


def test_cancel_aborts_the_connection() -> None:
    with serve_silent() as silent:
        client = RawHttpClient(silent.url)

        async def main() -> None:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.send(), 0.1)
            assert not client._idle  # never reused
            await client.close()

        uvloop.run(main())
        asyncio.run(asyncio.sleep(0.05))
        assert len(silent.lifetimes) == 1 and silent.lifetimes[0] < 0.2


@pytest.mark.parametrize("client", ["raw", "aiohttp"])
def test_both_clients_account_identically(client: str) -> None:
    with serve_target() as target:
        options = BenchOptions(
            url=f"{target.url}/mix", rate=100, duration_s=0.5, timeout_s=0.2, max_lag_s=1.0,
            client=client,  # type: ignore[arg-type]
        )  # fmt: skip
        result = run_bench(options)
    assert result.requests == result.scheduled == 50
    assert dict(result.status_counts) == {200: 10, 503: 10, 500: 10}
    assert result.errors["timeout"] == 10
    assert result.errors["reset"] == 10


def test_unknown_client_is_rejected() -> None:
    from loadshed.errors import ConfigError

    with pytest.raises(ConfigError, match="--client"):
        BenchOptions(url="http://h/", clients=1, client="curl")  # type: ignore[arg-type]
