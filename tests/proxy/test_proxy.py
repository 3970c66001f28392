"""The proxy's forwarding, with real servers on 127.0.0.1: streaming, headers,
upstream answers as limit outcomes, deadlines, and what it refuses."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
import requests

from loadshed.demo.origin import create_app as create_origin
from proxy_servers import (
    Recorder,
    echo_app,
    endless_stream_app,
    gated_stream_app,
    raw_request,
    run_proxy,
    serve_asgi,
    slow_app,
)

pytestmark = pytest.mark.timeout(30)


def _headers(seen: dict[str, object]) -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for name, value in seen["headers"]:  # type: ignore[attr-defined]
        result.setdefault(name, []).append(value)
    return result


async def test_streaming_response_arrives_chunk_by_chunk() -> None:
    gate, first_sent = threading.Event(), threading.Event()
    with (
        serve_asgi(gated_stream_app(gate, first_sent)) as upstream,
        run_proxy(upstream) as (url, _),
    ):
        async with aiohttp.ClientSession() as session, session.get(url + "/v1/stream") as response:
            assert response.status == 200
            assert response.headers["content-type"] == "text/event-stream"
            first = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
            # The upstream is still holding its last chunk: the proxy did not buffer.
            assert first == b"data: first\n\n"
            assert not gate.is_set()
            gate.set()
            rest = await asyncio.wait_for(response.content.read(), 5)
            assert rest == b"data: last\n\n"


async def test_request_body_streams_to_upstream_and_query_is_kept() -> None:
    recorder = Recorder()

    async def upload():  # type: ignore[no-untyped-def]
        for index in range(20):
            yield f"part{index:02d};".encode() * 1000

    with serve_asgi(echo_app(recorder)) as upstream, run_proxy(upstream) as (url, _):
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/predict?model=a%20b&x=1", data=upload()) as response:
                assert response.status == 200
                seen = await response.json()
    expected = b"".join(f"part{i:02d};".encode() * 1000 for i in range(20)).decode()
    assert seen["body"] == expected
    assert seen["method"] == "POST"
    assert seen["path"] == "/predict"
    assert seen["query"] == "model=a%20b&x=1"


async def test_hop_by_hop_headers_stripped_and_forwarding_headers_added() -> None:
    recorder = Recorder()
    upstream_extra = [
        (b"connection", b"x-upstream-hop"),
        (b"x-upstream-hop", b"secret"),
        (b"keep-alive", b"timeout=99"),
        (b"x-model-version", b"7"),
    ]
    with (
        serve_asgi(echo_app(recorder, extra=upstream_extra)) as upstream,
        run_proxy(upstream) as (
            url,
            _,
        ),
    ):
        async with aiohttp.ClientSession() as session:
            headers = {
                "Connection": "keep-alive, X-Client-Hop",
                "X-Client-Hop": "private",
                "Keep-Alive": "timeout=5",
                "TE": "trailers",
                "Proxy-Authorization": "Basic c2VjcmV0",
                "X-Forwarded-For": "10.0.0.1",
                "X-Custom": "kept",
            }
            async with session.get(url + "/h", headers=headers) as response:
                assert response.status == 200
                assert response.headers["x-model-version"] == "7"
                assert "x-upstream-hop" not in response.headers
                assert response.headers.get("keep-alive") != "timeout=99"
                seen = await response.json()
    got = _headers(seen)
    for hop in ("x-client-hop", "keep-alive", "te", "proxy-authorization"):
        assert hop not in got, hop
    assert got.get("connection", ["keep-alive"]) == ["keep-alive"]  # aiohttp's own, if any
    assert got["x-custom"] == ["kept"]
    assert got["x-forwarded-for"] == ["10.0.0.1, 127.0.0.1"]
    assert got["forwarded"][0].startswith("for=127.0.0.1;proto=http;host=")
    assert got["host"] == [upstream.removeprefix("http://")]
    assert got["x-forwarded-host"] == [url.removeprefix("http://")]


def test_proxy_headers_are_stripped_both_ways() -> None:
    """Every ``Proxy-*`` header (and httpoxy's bare ``Proxy``) belongs to one hop."""
    recorder = Recorder()
    upstream_extra = [
        (b"proxy-authenticate", b"Basic realm=upstream"),
        (b"proxy-status", b"cache; error=http_request_error"),
        (b"proxy-x-internal", b"upstream-secret"),
        (b"proxy", b"http://upstream-internal:3128"),
        (b"proxyish", b"kept"),  # not Proxy-*: an ordinary header
    ]
    with (
        serve_asgi(echo_app(recorder, extra=upstream_extra)) as upstream,
        run_proxy(upstream) as (url, _),
    ):
        answer = raw_request(
            url,
            b"GET /h HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Proxy-Authorization: Basic c2VjcmV0\r\n"
            b"Proxy-Connection: keep-alive\r\n"
            b"Proxy-Custom: client-secret\r\n"
            b"Proxy: http://evil.example:3128\r\n"
            b"Proxyish: kept\r\n\r\n",
        )
    head, _, _ = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), answer
    response_names = {line.split(b":")[0].lower() for line in head.split(b"\r\n")[1:]}
    assert not {n for n in response_names if n == b"proxy" or n.startswith(b"proxy-")}, head
    assert b"proxyish" in response_names
    sent = _headers(recorder.requests[0])
    assert not {n for n in sent if n == "proxy" or n.startswith("proxy-")}, sent
    assert sent["proxyish"] == ["kept"]


@pytest.mark.parametrize("status", [429, 503])
async def test_upstream_overload_answers_are_drops_and_retry_after_passes(status: int) -> None:
    recorder = Recorder()
    app = echo_app(recorder, status=status, extra=[(b"retry-after", b"7")])
    with serve_asgi(app) as upstream, run_proxy(upstream, limit="fixed:4") as (url, proxy):
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.get(url + "/x") as response:
                    assert response.status == status
                    assert response.headers["retry-after"] == "7"
                    await response.read()
        counts = proxy.pool.upstreams[0].limiter.snapshot().counts
    assert counts.get("dropped") == 3
    assert counts.get("success", 0) == 0


async def test_client_errors_are_ignored_by_the_limit() -> None:
    recorder = Recorder()
    with (
        serve_asgi(echo_app(recorder, status=404)) as upstream,
        run_proxy(upstream) as (url, proxy),
    ):
        async with aiohttp.ClientSession() as session, session.get(url + "/missing") as response:
            assert response.status == 404
            await response.read()
        counts = proxy.pool.upstreams[0].limiter.snapshot().counts
    assert counts.get("ignored") == 1
    assert counts.get("dropped", 0) == 0


async def test_slow_upstream_gets_504_at_the_deadline_and_keeps_its_slot_until_done() -> None:
    recorder = Recorder()
    with serve_asgi(slow_app(1.5, recorder)) as upstream, run_proxy(upstream) as (url, proxy):
        limiter = proxy.pool.upstreams[0].limiter
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            async with session.get(url + "/slow", headers={"X-Request-Timeout": "0.5"}) as response:
                elapsed = time.monotonic() - started
                body = await response.json()
            assert response.status == 504
            assert body["error"] == "gateway_timeout"
            assert body["fault"] == "timeout"
            assert 0.4 <= elapsed < 1.2
            # The upstream learned how long it had...
            forwarded = dict(recorder.requests[0]["headers"])
            assert 0.3 < float(forwarded["x-request-timeout"]) <= 0.5
            # ...and still works on it: the proxy holds the slot and the connection.
            assert limiter.inflight == 1
            assert not recorder.disconnected.is_set()
            while limiter.inflight and time.monotonic() - started < 5:
                await asyncio.sleep(0.02)
            assert 1.4 <= time.monotonic() - started < 3.0
        assert limiter.snapshot().counts.get("dropped") == 1
        assert not recorder.disconnected.is_set()


async def test_slow_upstream_with_close_abandoned_is_cut_off_at_the_deadline() -> None:
    recorder = Recorder()
    with (
        serve_asgi(slow_app(5.0, recorder)) as upstream,
        run_proxy(upstream, hold_abandoned=False) as (url, proxy),
    ):
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            async with session.get(url + "/slow", headers={"X-Request-Timeout": "0.5"}) as response:
                assert response.status == 504
                await response.read()
            assert time.monotonic() - started < 1.2
            assert await asyncio.to_thread(recorder.disconnected.wait, 3)
        limiter = proxy.pool.upstreams[0].limiter
        assert limiter.inflight == 0
        assert limiter.snapshot().counts.get("dropped") == 1


async def test_default_deadline_flag_applies_without_header() -> None:
    recorder = Recorder()
    with (
        serve_asgi(slow_app(5.0, recorder)) as upstream,
        run_proxy(upstream, deadline=0.3, hold_abandoned=False) as (url, _),
    ):
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            async with session.get(url + "/slow") as response:
                assert response.status == 504
            assert time.monotonic() - started < 2.0


async def test_client_leaving_closes_the_upstream_request_with_close_abandoned() -> None:
    recorder = Recorder()
    with (
        serve_asgi(slow_app(5.0, recorder)) as upstream,
        run_proxy(upstream, hold_abandoned=False) as (url, proxy),
    ):
        async with aiohttp.ClientSession() as session:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(session.get(url + "/slow"), 0.3)
        assert await asyncio.to_thread(recorder.disconnected.wait, 3)
        await asyncio.sleep(0.1)
        limiter = proxy.pool.upstreams[0].limiter
        assert limiter.inflight == 0
        assert limiter.snapshot().counts.get("ignored") == 1


async def test_client_leaving_holds_the_slot_until_the_upstream_answers() -> None:
    recorder = Recorder()
    with serve_asgi(slow_app(1.0, recorder)) as upstream, run_proxy(upstream) as (url, proxy):
        limiter = proxy.pool.upstreams[0].limiter
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(session.get(url + "/slow"), 0.3)
        await asyncio.sleep(0.2)
        assert limiter.inflight == 1  # the upstream is still working on it
        while limiter.inflight and time.monotonic() - started < 5:
            await asyncio.sleep(0.02)
        assert 0.9 <= time.monotonic() - started < 3.0
        # The upstream answered 200 after its full work, to nobody: the client gave up,
        # a missed deadline for the limit (dropped), and a lesson in its patience.
        assert limiter.snapshot().counts.get("dropped") == 1
        # The proxy releases the slot, then the middleware around it (on the server's
        # thread) records the give-up: wait for it, boundedly.
        waited_from = time.monotonic()
        while not limiter.admission.patience.samples and time.monotonic() - waited_from < 2:
            await asyncio.sleep(0.01)
        assert limiter.admission.patience.samples == 1
        assert not recorder.disconnected.is_set()


def test_absolute_form_target_is_refused_and_never_forwarded() -> None:
    recorder = Recorder()
    with serve_asgi(echo_app(recorder)) as upstream, run_proxy(upstream) as (url, _):
        answer = raw_request(
            url,
            b"GET http://evil.example/steal HTTP/1.1\r\n"
            b"Host: evil.example\r\nConnection: close\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 400 ")
        assert b"not a forward proxy" in answer
        connect = raw_request(
            url,
            b"CONNECT evil.example:443 HTTP/1.1\r\n"
            b"Host: evil.example:443\r\nConnection: close\r\n\r\n",
        )
        assert connect.startswith(b"HTTP/1.1 400 ")
        # origin-form on the same server still works
        ok = raw_request(url, b"GET /fine HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200 ")
    assert [r["path"] for r in recorder.requests] == ["/fine"]


def test_request_line_and_headers_are_bounded() -> None:
    recorder = Recorder()
    with (
        serve_asgi(echo_app(recorder)) as upstream,
        run_proxy(upstream, max_request_line=1024, max_header_bytes=4096) as (url, _),
    ):
        long_line = raw_request(url, b"GET /" + b"a" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert long_line.startswith(b"HTTP/1.1 414 ")
        big_headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 100) for i in range(60))
        many = raw_request(url, b"GET / HTTP/1.1\r\nHost: x\r\n" + big_headers + b"\r\n")
        assert many.startswith(b"HTTP/1.1 431 ")
    assert recorder.requests == []


async def test_origin_demo_through_proxy_and_fast_rejection() -> None:
    origin = create_origin(workers=1, service_time=0.3, queue=10)
    with (
        serve_asgi(origin) as upstream,
        run_proxy(upstream, limit="fixed:1", max_queue=0) as (
            url,
            _,
        ),
    ):
        async with aiohttp.ClientSession() as session:

            async def get() -> tuple[int, str | None, float]:
                started = time.monotonic()
                async with session.get(url + "/work") as response:
                    await response.read()
                    return (
                        response.status,
                        response.headers.get("retry-after"),
                        time.monotonic() - started,
                    )

            results = await asyncio.gather(*(get() for _ in range(4)))
    statuses = sorted(status for status, _, _ in results)
    assert statuses == [200, 503, 503, 503]
    for status, retry_after, elapsed in results:
        if status == 503:
            assert retry_after is not None and int(retry_after) >= 1
            assert elapsed < 0.2  # refused at once, not after the origin's work
    body = json.dumps({"ok": True})
    assert body


@pytest.mark.parametrize("hold", [True, False])
def test_client_leaving_mid_upload_is_not_an_upstream_fault(hold: bool) -> None:
    recorder = Recorder()
    with (
        serve_asgi(echo_app(recorder)) as upstream,
        run_proxy(upstream, hold_abandoned=hold) as (
            url,
            proxy,
        ),
    ):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
            sock.sendall(b"x" * 1000)
            time.sleep(0.3)  # the proxy has started forwarding the body
        limiter = proxy.pool.upstreams[0].limiter
        deadline = time.monotonic() + 5
        while limiter.inflight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert limiter.inflight == 0
        assert limiter.snapshot().counts.get("ignored") == 1
        state = proxy.pool.upstreams[0]
        assert state.consecutive_failures == 0 and state.up
    # The upstream saw the upload cut short (a disconnect), never a complete request.
    assert all(len(r["body"]) < 100000 for r in recorder.requests)


def test_sized_body_and_upstream_prefix() -> None:
    recorder = Recorder()
    payload = bytes(range(256)) * 400
    with serve_asgi(echo_app(recorder)) as upstream, run_proxy(upstream + "/v1") as (url, _):
        response = requests.post(
            url + "/predict?x=1", data=payload, headers={"Expect": "100-continue"}, timeout=5
        )
        assert response.status_code == 200
    seen = recorder.requests[0]
    assert seen["path"] == "/v1/predict" and seen["query"] == "x=1"
    assert seen["body"].encode("latin-1") == payload
    headers = _headers(seen)
    assert headers["content-length"] == [str(len(payload))]
    assert "transfer-encoding" not in headers and "expect" not in headers


async def test_queued_request_whose_client_leaves_never_reaches_the_upstream() -> None:
    recorder = Recorder()
    with (
        serve_asgi(slow_app(1.0, recorder)) as upstream,
        run_proxy(upstream, limit="fixed:1", max_queue_wait=5.0) as (url, proxy),
    ):
        limiter = proxy.pool.upstreams[0].limiter
        async with aiohttp.ClientSession() as session:
            first = asyncio.ensure_future(session.get(url + "/first"))
            while limiter.inflight < 1:
                await asyncio.sleep(0.01)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(session.get(url + "/second"), 0.3)
            await asyncio.sleep(0.1)
            assert limiter.queue_length == 0  # it left the queue with its client
            response = await first
            assert response.status == 200
            response.release()
        counts = limiter.snapshot().counts
    assert counts.get("rejected:client_gone") == 1, counts
    assert len(recorder.requests) == 1  # only the first reached the upstream


async def test_endless_stream_stops_when_its_client_leaves() -> None:
    recorder = Recorder()
    with serve_asgi(endless_stream_app(recorder)) as upstream, run_proxy(upstream) as (url, proxy):
        limiter = proxy.pool.upstreams[0].limiter
        async with aiohttp.ClientSession() as session:
            response = await session.get(url + "/v1/completions")
            for _ in range(3):
                assert (await response.content.readuntil(b"\n\n")).startswith(b"data: ")
            response.close()  # the client goes away mid-stream
        assert await asyncio.to_thread(recorder.disconnected.wait, 3)
        deadline = time.monotonic() + 3
        while limiter.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert limiter.inflight == 0


@pytest.mark.parametrize("limit", [{"upstream_timeout": 0.4}, {"read_timeout": 0.4}])
async def test_upstream_timeout_without_a_deadline_gives_504(limit: dict[str, float]) -> None:
    recorder = Recorder()
    with serve_asgi(slow_app(5.0, recorder)) as upstream, run_proxy(upstream, **limit) as (url, _):
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            async with session.get(url + "/slow") as response:
                assert response.status == 504
                assert (await response.json())["fault"] == "timeout"
            assert 0.3 <= time.monotonic() - started < 2.0


_CLIMBING = [
    b"/../secret",
    b"/%2e%2e/secret",
    b"/%2E%2e/secret",
    b"/.%2e/secret",
    b"/a/../../secret",
    b"/..%2fsecret",
    b"/..%2Fsecret",
    b"/%2e%2e%2fsecret",
    b"/..%5csecret",
    b"/..\\secret",
    b"/..",
]


def test_paths_never_climb_out_of_the_upstream_prefix() -> None:
    recorder = Recorder()
    with serve_asgi(echo_app(recorder)) as upstream, run_proxy(upstream + "/api") as (url, proxy):
        for target in _CLIMBING:
            answer = raw_request(
                url, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            assert answer.startswith(b"HTTP/1.1 400 "), (target, answer)
            assert b"upstream's path prefix" in answer
        assert recorder.requests == []
        # Dot segments that stay inside are resolved, the rest of the path kept as sent.
        for target, forwarded in [
            (b"/a/./b/../c?x=1", "/api/a/c"),
            (b"/a/%2e%2e/b%20c", "/api/b c"),
            (b"/v1/model.json", "/api/v1/model.json"),
        ]:
            answer = raw_request(
                url, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            assert answer.startswith(b"HTTP/1.1 200 "), (target, answer)
            assert recorder.requests[-1]["path"] == forwarded
        # Refused before admission: the limit never saw the climbing requests.
        assert proxy.pool.upstreams[0].limiter.snapshot().counts.get("success") == 3


async def test_the_slot_goes_on_when_the_upstream_is_done_not_when_the_client_has_read() -> None:
    """With one slot, a queued request reaches the upstream as soon as the first one's
    response is all read from the upstream, while its last chunk still waits to be
    written to its client; the first one's outcome still comes when it is sent."""
    from loadshed.proxy import ProxyConfig, create_proxy, parse_upstream

    recorder = Recorder()
    with serve_asgi(echo_app(recorder)) as upstream_url:
        config = ProxyConfig(
            upstreams=(parse_upstream(upstream_url),), limit="fixed:1", max_queue_wait=5.0
        )
        app, proxy = create_proxy(config)
        limiter = proxy.pool.upstreams[0].limiter
        slow_client = asyncio.Event()  # the first client takes its last chunk only then
        calls: list[asyncio.Future[None]] = []
        try:
            first_sent: list[dict[str, object]] = []

            def no_body() -> Callable[[], Awaitable[dict[str, object]]]:
                """A client's receive: an empty body, then nothing (it stays)."""
                sent = False

                async def receive() -> dict[str, object]:
                    nonlocal sent
                    if not sent:
                        sent = True
                        return {"type": "http.request", "body": b"", "more_body": False}
                    await asyncio.Event().wait()  # a server sends http.disconnect only if
                    raise AssertionError  # the client leaves; this one never does

                return receive

            async def first_send(message: dict[str, object]) -> None:
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    await slow_client.wait()
                first_sent.append(message)

            second_sent: list[dict[str, object]] = []

            async def second_send(message: dict[str, object]) -> None:
                second_sent.append(message)

            def scope(path: str) -> dict[str, object]:
                return {
                    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                    "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
                    "query_string": b"", "headers": [(b"host", b"proxy")],
                    "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
                }  # fmt: skip

            first = asyncio.ensure_future(app(scope("/first"), no_body(), first_send))
            calls.append(first)
            while not first_sent:  # the response head went out: the upstream answered
                await asyncio.sleep(0.01)
            second = asyncio.ensure_future(app(scope("/second"), no_body(), second_send))
            calls.append(second)
            for _ in range(300):
                if len(recorder.requests) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [r["path"] for r in recorder.requests] == ["/first", "/second"]
            assert not first.done()  # its last chunk still waits for its client
            await asyncio.wait_for(second, 5)
            slow_client.set()
            await asyncio.wait_for(first, 5)
            assert second_sent[0]["status"] == 200 and first_sent[0]["status"] == 200
            assert limiter.inflight == 0
            assert limiter.snapshot().counts["success"] == 2  # both outcomes recorded
        finally:
            slow_client.set()
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await proxy.aclose()
