"""LoadShedMiddleware under a real uvicorn server and real HTTP (aiohttp)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route

from loadshed.asgi import LoadShedMiddleware
from loadshed.errors import ConfigError
from loadshed.limiter import Limiter
from loadshed.limits.fixed import Fixed
from loadshed.runner import ModelRunner
from loadshed.testing import serve


class Gate:
    """Lets the test hold requests inside the app and release them."""

    def __init__(self) -> None:
        self.entered = threading.Semaphore(0)
        self.release = threading.Event()
        self.calls: list[str] = []


def build_app(gate: Gate) -> Starlette:
    async def slow(request: Request) -> Response:
        gate.calls.append(request.query_params.get("id", ""))
        gate.entered.release()
        while not gate.release.is_set():
            await asyncio.sleep(0.005)
        return PlainTextResponse("done")

    async def echo(request: Request) -> Response:
        body = await request.body()
        return JSONResponse({"length": len(body), "head": body[:8].decode()})

    async def fail(request: Request) -> Response:
        return PlainTextResponse("boom", status_code=int(request.query_params["status"]))

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[
            Route("/slow", slow),
            Route("/echo", echo, methods=["POST"]),
            Route("/fail", fail),
            Route("/health", health),
        ]
    )


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.release.set()


def run_server(gate: Gate, limiter: Limiter, **options: Any) -> Any:
    app = LoadShedMiddleware(build_app(gate), limiter=limiter, **options)
    return app, serve(app)


async def until_idle(limiter: Limiter) -> None:
    """Wait (at most 2 s) until nothing is in flight."""
    for _ in range(400):
        if limiter.inflight == 0:
            return
        await asyncio.sleep(0.005)


async def wait_entered(gate: Gate, count: int = 1) -> None:
    for _ in range(count):
        assert await asyncio.to_thread(gate.entered.acquire, True, 10)


async def test_admitted_request_passes_with_server_timing(gate: Gate) -> None:
    gate.release.set()
    limiter = Limiter(Fixed(2))
    _app, server = run_server(gate, limiter)
    with server as url:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/slow") as resp:
            assert resp.status == 200
            assert await resp.text() == "done"
            assert "queue;dur=" in resp.headers["Server-Timing"]
    assert limiter.snapshot().counts["success"] == 1


async def test_full_queue_rejects_fast_with_503_json_and_retry_after(gate: Gate) -> None:
    limiter = Limiter(Fixed(1), max_queue=1, max_queue_wait=30)
    _app, server = run_server(gate, limiter)
    with server as url:
        async with aiohttp.ClientSession() as session:
            first = asyncio.ensure_future(session.get(f"{url}/slow?id=1"))
            await wait_entered(gate)
            second = asyncio.ensure_future(session.get(f"{url}/slow?id=2"))
            while limiter.queue_length < 1:
                await asyncio.sleep(0.005)
            async with session.get(f"{url}/slow?id=3") as third:
                assert third.status == 503
                assert json.loads(await third.text()) == {"error": "overloaded", "reason": "limit"}
                assert int(third.headers["Retry-After"]) >= 1
            gate.release.set()
            for task in (first, second):
                resp = await task
                assert resp.status == 200
                resp.release()
    assert gate.calls == ["1", "2"]  # the rejected request never reached the app


async def test_429_is_configurable(gate: Gate) -> None:
    limiter = Limiter(Fixed(1), max_queue=0)
    _app, server = run_server(gate, limiter, reject_status=429)
    with server as url:
        async with aiohttp.ClientSession() as session:
            first = asyncio.ensure_future(session.get(f"{url}/slow"))
            await wait_entered(gate)
            async with session.get(f"{url}/slow") as resp:
                assert resp.status == 429
            gate.release.set()
            (await first).release()


@pytest.mark.parametrize(
    ("watch_after", "queued_for"),
    [
        (0.0, 0.0),  # watched (body buffered) from the start
        (0.005, 0.2),  # watched once the wait passed 5 ms: buffered mid-way
        (30.0, 0.0),  # granted before watching began: the app reads the server's receive
    ],
)
async def test_queued_body_is_buffered_and_replayed_intact(
    gate: Gate, watch_after: float, queued_for: float
) -> None:
    limiter = Limiter(Fixed(1), max_queue_wait=30)
    _app, server = run_server(gate, limiter, disconnect_watch_after=watch_after)
    payload = b"abcdefgh" * 10_000
    with server as url:
        async with aiohttp.ClientSession() as session:
            holder = asyncio.ensure_future(session.get(f"{url}/slow"))
            await wait_entered(gate)
            posted = asyncio.ensure_future(session.post(f"{url}/echo", data=payload))
            while limiter.queue_length < 1:
                await asyncio.sleep(0.005)
            await asyncio.sleep(queued_for)
            gate.release.set()
            resp = await posted
            assert resp.status == 200
            assert await resp.json() == {"length": len(payload), "head": "abcdefgh"}
            (await holder).release()


async def test_disconnect_while_queued_leaves_the_queue_at_once(gate: Gate) -> None:
    limiter = Limiter(Fixed(1), max_queue_wait=30)
    _app, server = run_server(gate, limiter)
    with server as url:
        async with aiohttp.ClientSession() as session:
            holder = asyncio.ensure_future(session.get(f"{url}/slow?id=holder"))
            await wait_entered(gate)
            async with aiohttp.ClientSession() as impatient:
                queued = asyncio.ensure_future(impatient.get(f"{url}/slow?id=gone"))
                while limiter.queue_length < 1:
                    await asyncio.sleep(0.005)
                queued.cancel()
            for _ in range(400):
                if limiter.queue_length == 0:
                    break
                await asyncio.sleep(0.005)
            assert limiter.queue_length == 0
            assert limiter.snapshot().counts["rejected:client_gone"] == 1
            assert limiter.admission.patience.samples == 1
            gate.release.set()
            (await holder).release()
    assert gate.calls == ["holder"]


async def test_client_leaving_after_admission_is_a_drop_and_a_lesson_in_patience(
    gate: Gate,
) -> None:
    limiter = Limiter(Fixed(2))
    _app, server = run_server(gate, limiter)
    with server as url:
        async with aiohttp.ClientSession() as impatient:
            running = asyncio.ensure_future(impatient.get(f"{url}/slow?id=gone"))
            await wait_entered(gate)
            await asyncio.sleep(0.1)  # past disconnect_watch_after: watched
            running.cancel()
        await asyncio.sleep(0.1)
        assert limiter.inflight == 1  # the app still works on it: the slot stays held
        gate.release.set()
        await until_idle(limiter)
        counts = limiter.snapshot().counts
        assert counts["dropped"] == 1 and counts["success"] == 0
        assert limiter.admission.patience.samples == 1
        # An answered request is a success, its connection's later close notwithstanding.
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/echo", data=b"x" * 50_000) as resp:
                assert resp.status == 200
                assert await resp.json() == {"length": 50_000, "head": "xxxxxxxx"}
        await asyncio.sleep(0.05)
        assert limiter.snapshot().counts["success"] == 1
        assert limiter.snapshot().counts["dropped"] == 1


async def test_content_length_over_bound_gets_413_without_admission(gate: Gate) -> None:
    limiter = Limiter(Fixed(1))
    _app, server = run_server(gate, limiter, max_body_bytes=100)
    with server as url:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/echo", data=b"x" * 101) as resp:
                assert resp.status == 413
                assert (await resp.json())["error"] == "payload_too_large"
    assert limiter.snapshot().counts["admitted"] == 0


async def _chunks(*parts: bytes) -> Any:
    """A request body aiohttp sends chunked (no Content-Length)."""
    for part in parts:
        yield part


async def test_chunked_body_over_bound_gets_413_once_admitted(gate: Gate) -> None:
    limiter = Limiter(Fixed(1))
    _app, server = run_server(gate, limiter, max_body_bytes=100)
    with server as url:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/echo", data=_chunks(b"x" * 60, b"y" * 60)) as resp:
                assert resp.status == 413
                assert (await resp.json())["error"] == "payload_too_large"
            # Under the bound, the same upload reaches the app whole.
            async with session.post(f"{url}/echo", data=_chunks(b"x" * 50, b"y" * 50)) as resp:
                assert resp.status == 200
                assert await resp.json() == {"length": 100, "head": "xxxxxxxx"}
    await until_idle(limiter)
    counts = limiter.snapshot().counts
    # The 413 is a client error: ignored by the limit, not a drop (the app's failed read
    # of a body it was told was abandoned is not the server's fault).
    assert (counts["ignored"], counts["success"], counts["dropped"]) == (1, 1, 0)


async def test_chunked_body_over_bound_after_the_answer_began_is_cut_not_refused() -> None:
    seen: list[str] = []

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        # Answers first, then reads: past the bound it is told the client left.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        size = 0
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "http.disconnect":
                break
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.body", "body": b"read %d" % size})

    limiter = Limiter(Fixed(1))
    app = LoadShedMiddleware(streaming, limiter=limiter, max_body_bytes=100)
    with serve(app) as url:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/up", data=_chunks(b"x" * 60, b"y" * 60)) as resp:
                assert resp.status == 200  # its answer had begun: no 413 over it
                assert (await resp.read()).startswith(b"read ")
    assert seen[-1] == "http.disconnect"
    await until_idle(limiter)
    assert limiter.snapshot().counts["success"] == 1


async def test_outcomes_5xx_dropped_4xx_ignored(gate: Gate) -> None:
    limiter = Limiter(Fixed(4))
    _app, server = run_server(gate, limiter)
    with server as url:
        async with aiohttp.ClientSession() as session:
            for status in (500, 404, 200):
                async with session.get(f"{url}/fail?status={status}") as resp:
                    assert resp.status == status
    counts = limiter.snapshot().counts
    assert (counts["dropped"], counts["ignored"], counts["success"]) == (1, 1, 1)


async def test_malformed_headers_are_counted_and_ignored(gate: Gate) -> None:
    gate.release.set()
    limiter = Limiter(Fixed(4))
    app, server = run_server(gate, limiter)
    headers = {"X-Request-Timeout": "soon", "X-Priority": "urgent", "grpc-timeout": "5x"}
    with server as url:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/slow", headers=headers) as resp:
                assert resp.status == 200
    assert app.malformed_headers == {"x-request-timeout": 1, "x-priority": 1, "grpc-timeout": 1}


async def test_deadline_header_sheds_what_cannot_finish(gate: Gate) -> None:
    limiter = Limiter(Fixed(1), initial_service_time=5.0, max_queue_wait=30)
    _app, server = run_server(gate, limiter)
    with server as url:
        async with aiohttp.ClientSession() as session:
            holder = asyncio.ensure_future(session.get(f"{url}/slow"))
            await wait_entered(gate)
            headers = {"X-Request-Timeout": "1.0"}
            async with session.get(f"{url}/slow", headers=headers) as resp:
                assert resp.status == 503
                assert (await resp.json())["reason"] == "deadline"
            gate.release.set()
            (await holder).release()


async def test_excluded_paths_bypass_a_full_limiter(gate: Gate) -> None:
    limiter = Limiter(Fixed(1), max_queue=0)
    _app, server = run_server(gate, limiter)
    with server as url:
        async with aiohttp.ClientSession() as session:
            holder = asyncio.ensure_future(session.get(f"{url}/slow"))
            await wait_entered(gate)
            async with session.get(f"{url}/health") as resp:
                assert resp.status == 200
            gate.release.set()
            (await holder).release()


async def test_routes_get_their_own_limiter(gate: Gate) -> None:
    gate.release.set()
    default = Limiter(Fixed(1))
    app = LoadShedMiddleware(build_app(gate), limiter=default, routes={"/echo": "fixed:3"})
    with serve(app) as url:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/echo", data=b"hi") as resp:
                assert resp.status == 200
    echo_limiter = app.routes[0][1]
    assert echo_limiter.limit == 3 and echo_limiter.snapshot().counts["success"] == 1
    assert default.snapshot().counts["admitted"] == 0


def test_bad_configuration_fails_at_start() -> None:
    with pytest.raises(ConfigError, match="reject_status"):
        LoadShedMiddleware(build_app(Gate()), reject_status=500)
    with pytest.raises(ConfigError, match="limit"):
        LoadShedMiddleware(build_app(Gate()), limit="turbo")
    with pytest.raises(ConfigError, match="disconnect_watch_after"):
        LoadShedMiddleware(build_app(Gate()), disconnect_watch_after=-1)


_SHARED_START = {"type": "http.response.start", "status": 200, "headers": [(b"x-app", b"1")]}


async def shared_message_app(scope: Any, receive: Any, send: Any) -> None:
    """Sends the same start message dict every time (allowed by ASGI)."""
    await send(_SHARED_START)
    await send({"type": "http.response.body", "body": b"ok"})


async def test_server_timing_never_piles_up_on_an_app_that_reuses_its_message() -> None:
    with serve(LoadShedMiddleware(shared_message_app, limiter=Limiter(Fixed(4)))) as url:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.get(url) as resp:
                    assert resp.status == 200
                    assert len(resp.headers.getall("server-timing")) == 1
    assert _SHARED_START["headers"] == [(b"x-app", b"1")]


async def test_patience_learned_after_admission_is_the_wait_until_the_client_left(
    gate: Gate,
) -> None:
    limiter = Limiter(Fixed(3))
    _app, server = run_server(gate, limiter)
    with server as url:
        for i in range(3):
            async with aiohttp.ClientSession() as impatient:
                running = asyncio.ensure_future(impatient.get(f"{url}/slow?id={i}"))
                await wait_entered(gate)
                await asyncio.sleep(0.1)
                running.cancel()
        await asyncio.sleep(0.6)  # the app works on, far longer than the clients waited
        gate.release.set()
        await until_idle(limiter)
    patience = limiter.admission.patience.patience
    assert patience is not None and patience < 0.5  # not the app's run time
    assert limiter.snapshot().counts["dropped"] == 3


async def polling_app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the body, polls receive with a timeout (cancelling it), then works."""
    while (await receive()).get("more_body"):
        pass
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(receive(), 0.02)
    await asyncio.sleep(0.6)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"late"})


async def test_a_client_leaving_an_app_that_polled_receive_is_still_seen() -> None:
    limiter = Limiter(Fixed(2))
    with serve(LoadShedMiddleware(polling_app, limiter=limiter)) as url:
        async with aiohttp.ClientSession() as impatient:
            running = asyncio.ensure_future(impatient.post(url, data=b"x" * 100))
            await asyncio.sleep(0.25)
            running.cancel()
        await until_idle(limiter)
    assert limiter.snapshot().counts["dropped"] == 1


# --------------------------------------------------------------------------- runner=


def _model(seconds: float) -> int:
    """Runner job: a 'prediction' that holds its worker for ``seconds``."""
    time.sleep(seconds)
    return os.getpid()


def _slow_while_marked(marker: str) -> None:
    if os.path.exists(marker):
        time.sleep(0.6)


def runner_app(runner: ModelRunner[int], idle_at_entry: list[int]) -> Starlette:
    async def predict(request: Request) -> Response:
        idle_at_entry.append(runner.idle)  # admitted: a worker must be free for it
        pid = await runner.run(float(request.query_params.get("s", "0.2")))
        return JSONResponse({"pid": pid})

    return Starlette(routes=[Route("/predict", predict)])


async def test_runner_worker_count_is_the_limit_behind_a_real_server(tmp_path: Path) -> None:
    """LoadShedMiddleware(app, runner=runner) behind uvicorn: 6 concurrent requests to 2
    workers run 2 at a time and wait in the limiter's queue, never in the runner; a worker
    killed from outside takes the limit to 1 until its replacement is ready."""
    marker = tmp_path / "slow"
    runner: ModelRunner[int] = ModelRunner(
        _model,
        workers=2,
        initializer=_slow_while_marked,
        initargs=(str(marker),),
        mp_context="fork",
    )
    idle_at_entry: list[int] = []
    app = LoadShedMiddleware(
        runner_app(runner, idle_at_entry), runner=runner, limiter_options={"max_queue_wait": 10}
    )
    assert app.limiter.limit == 2
    with serve(app) as url:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/predict?s=0") as resp:  # starts the runner
                assert resp.status == 200
            idle_at_entry.clear()

            async def predict() -> tuple[int, str]:
                async with session.get(f"{url}/predict?s=0.2") as resp:
                    await resp.read()
                    return resp.status, resp.headers["Server-Timing"]

            answers = await asyncio.gather(*(predict() for _ in range(6)))
            assert [status for status, _ in answers] == [200] * 6
            queued = [t for _, t in answers if not t.startswith("queue;dur=0.")]
            assert len(queued) >= 3  # waited in the limiter (in rounds of 2)
            assert min(idle_at_entry) >= 1  # ...and never inside the runner

            marker.touch()
            os.kill(runner.pids()[0], signal.SIGKILL)
            for _ in range(200):
                if app.limiter.limit == 1:
                    break
                await asyncio.sleep(0.005)
            assert app.limiter.limit == 1
            idle_at_entry.clear()
            answers = await asyncio.gather(*(predict() for _ in range(3)))
            assert [status for status, _ in answers] == [200] * 3
            assert min(idle_at_entry) >= 1
            for _ in range(400):
                if app.limiter.limit == 2:
                    break
                await asyncio.sleep(0.005)
            assert app.limiter.limit == 2
        snapshot = app.limiter.snapshot()
        assert snapshot.algorithm == "workers(2 of 2)"
        assert snapshot.counts["success"] == 10


@pytest.mark.parametrize("free_slot", [True, False])
async def test_a_finished_model_call_hands_its_slot_on_before_the_response(
    free_slot: bool,
) -> None:
    """One slot (limit 1), one worker. A request whose model call has returned but whose
    response is held back frees its slot to the next queued request (free_slot, the
    default), whose call then runs at once; with free_slot=False the next one waits for
    the whole response. Outcomes are still counted at each response's end."""
    runner: ModelRunner[int] = ModelRunner(_model, workers=1, free_slot=free_slot)
    held = threading.Event()  # set from this test's loop, read on the server's
    ran: list[str] = []

    async def predict(request: Request) -> Response:
        name = request.query_params["name"]
        await runner.run(0.05)
        ran.append(name)
        while name == "first" and not held.is_set():
            await asyncio.sleep(0.01)  # slow post-processing, the worker already free
        return JSONResponse({"name": name})

    async def close(request: Request) -> Response:
        await runner.close()
        return PlainTextResponse("closed")

    app = LoadShedMiddleware(
        Starlette(routes=[Route("/predict", predict), Route("/close", close)]),
        limit=1,
        limiter_options={"max_queue_wait": 10},
        exclude=["/close"],
    )
    with serve(app) as url:
        async with aiohttp.ClientSession() as session:

            async def call(name: str) -> int:
                async with session.get(f"{url}/predict?name={name}") as resp:
                    await resp.read()
                    return resp.status

            first = asyncio.create_task(call("first"))
            for _ in range(500):
                if ran:
                    break
                await asyncio.sleep(0.01)
            assert ran == ["first"]
            second = asyncio.create_task(call("second"))
            if free_slot:
                assert await asyncio.wait_for(second, 5) == 200
                assert ran == ["first", "second"] and not first.done()
                assert app.limiter.inflight == 0  # the first holds no slot now
            else:
                await asyncio.sleep(0.5)
                assert ran == ["first"] and app.limiter.queue_length == 1
            held.set()
            assert await asyncio.wait_for(first, 5) == 200
            assert await asyncio.wait_for(second, 5) == 200
            async with session.get(f"{url}/close") as resp:
                assert resp.status == 200
        counts = app.limiter.snapshot().counts
        assert counts["success"] == 2 and app.limiter.inflight == 0


def test_runner_with_a_limit_or_a_limiter_is_a_config_error() -> None:
    runner: ModelRunner[int] = ModelRunner(_model, workers=2)
    with pytest.raises(ConfigError, match=r"^runner: .*not both"):
        LoadShedMiddleware(build_app(Gate()), limit="fixed:2", runner=runner)
    with pytest.raises(ConfigError, match=r"^runner: give runner= to the Limiter"):
        LoadShedMiddleware(build_app(Gate()), limiter=Limiter(Fixed(2)), runner=runner)


def test_paths_are_matched_within_the_apps_root_path() -> None:
    # Mounted under a prefix (a Ray Serve route_prefix, a Starlette Mount, uvicorn's
    # --root-path), scope["path"] includes the root_path: exclusions, routes and the
    # metrics path still name paths within the app.
    async def ok(request: Request) -> Response:
        return PlainTextResponse("ok")

    inner = Starlette(routes=[Route("/health", ok), Route("/work", ok)])
    protected = LoadShedMiddleware(inner, "fixed:1", metrics_path="/metrics")
    outer = Starlette(routes=[Mount("/api", app=protected)])
    mounted = {"type": "http", "root_path": "/api"}
    assert protected.limiter_for({**mounted, "path": "/api/health"}) is None
    assert protected.limiter_for({**mounted, "path": "/api/work"}) is protected.limiter
    assert protected.limiter_for({"type": "http", "path": "/health"}) is None  # no root
    with serve(outer) as url:
        metrics = urllib.request.urlopen(f"{url}/api/metrics", timeout=10).read().decode()
        assert "loadshed_limit" in metrics
        assert urllib.request.urlopen(f"{url}/api/work", timeout=10).read() == b"ok"
