"""Real HTTP targets for the load generator's tests: an aiohttp.web server and a raw TCP server
that never answers, each on 127.0.0.1 with an ephemeral port, on its own thread and loop."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web


class Target:
    """Routes: ``/ok``, ``/sleep/{ms}``, ``/status/{code}``, ``/held`` (answers once
    ``hold_until`` has passed), ``/mix`` (200, 503, 500, never, reset, in turn),
    ``/slots/{n}/{ms}`` (n workers of ms each, queueing beyond), ``POST /echo``."""

    def __init__(self) -> None:
        self.hits = 0
        self.hold_until = 0.0
        self.port = 0
        self._mix = itertools.count()
        self._slots: dict[int, asyncio.Semaphore] = {}
        # ``/slots`` requests: when each arrived and when each was answered (time.monotonic).
        self.slot_arrivals: list[float] = []
        self.slot_answers: list[float] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ok", self.ok)
        app.router.add_get("/sleep/{ms}", self.sleep)
        app.router.add_get("/status/{code}", self.status)
        app.router.add_get("/held", self.held)
        app.router.add_get("/mix", self.mix)
        app.router.add_get("/slots/{n}/{ms}", self.slots)
        app.router.add_post("/echo", self.echo)
        app.router.add_get("/shed", self.shed)
        app.router.add_route("*", "/chunked", self.chunked)
        return app

    async def ok(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(text="ok")

    async def sleep(self, request: web.Request) -> web.Response:
        self.hits += 1
        await asyncio.sleep(int(request.match_info["ms"]) / 1e3)
        return web.Response(text="ok")

    async def shed(self, request: web.Request) -> web.Response:
        """Always 503 with ``Retry-After: <after>`` (the query parameter)."""
        self.hits += 1
        headers = {"Retry-After": request.query.get("after", "1")}
        return web.Response(status=503, text="overloaded", headers=headers)

    async def status(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(status=int(request.match_info["code"]), text="status")

    async def slots(self, request: web.Request) -> web.Response:
        """A server with ``n`` workers of ``ms`` each: capacity n * 1000 / ms requests/s."""
        self.hits += 1
        self.slot_arrivals.append(time.monotonic())
        n = int(request.match_info["n"])
        semaphore = self._slots.setdefault(n, asyncio.Semaphore(n))
        async with semaphore:
            await asyncio.sleep(int(request.match_info["ms"]) / 1e3)
        self.slot_answers.append(time.monotonic())
        return web.Response(text="ok")

    async def held(self, request: web.Request) -> web.Response:
        self.hits += 1
        await asyncio.sleep(max(0.0, self.hold_until - time.monotonic()))
        return web.Response(text="ok")

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for part in (b"one ", b"two ", b"three"):
            await response.write(part)
        await response.write_eof()
        return response

    async def echo(self, request: web.Request) -> web.Response:
        self.hits += 1
        body = await request.read()
        deadline = request.headers.get("X-Request-Timeout", "")
        return web.Response(body=body, headers={"X-Seen-Timeout": deadline})

    async def mix(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        turn = next(self._mix) % 5
        if turn == 0:
            return web.Response(text="ok")
        if turn == 1:
            return web.Response(status=503, text="busy")
        if turn == 2:
            return web.Response(status=500, text="error")
        if turn == 3:
            await asyncio.sleep(3600)  # never answers: the client times out
        assert request.transport is not None
        request.transport.abort()  # reset the connection before any response
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


class SilentServer:
    """Accepts connections, reads, never answers; records how long each connection lived."""

    def __init__(self) -> None:
        self.port = 0
        self.lifetimes: list[float] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened = time.monotonic()
        while await reader.read(65536):
            pass
        self.lifetimes.append(time.monotonic() - opened)
        writer.close()


class CannedServer:
    """Answers every connection with fixed bytes, then closes it."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(self.reply)
        await writer.drain()
        writer.close()


@contextmanager
def serve_canned(reply: bytes) -> Iterator[CannedServer]:
    """Run a :class:`CannedServer` on a background thread for the duration of the block."""
    canned = CannedServer(reply)
    with _serving(silent=canned) as _:  # type: ignore[arg-type]
        yield canned


@contextmanager
def serve_target() -> Iterator[Target]:
    """Run a :class:`Target` on a background thread for the duration of the block."""
    target = Target()
    with _serving(target=target) as _:
        yield target


@contextmanager
def serve_silent() -> Iterator[SilentServer]:
    """Run a :class:`SilentServer` on a background thread for the duration of the block."""
    silent = SilentServer()
    with _serving(silent=silent) as _:
        yield silent


@contextmanager
def _serving(target: Target | None = None, silent: SilentServer | None = None) -> Iterator[None]:
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop: asyncio.Event | None = None

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        if target is not None:
            runner = web.AppRunner(target.app(), handler_cancellation=True, shutdown_timeout=1.0)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            target.port = runner.addresses[0][1]
            started.set()
            await stop.wait()
            await runner.cleanup()
        else:
            assert silent is not None
            server = await asyncio.start_server(silent.handle, "127.0.0.1", 0)
            silent.port = server.sockets[0].getsockname()[1]
            started.set()
            await stop.wait()
            server.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("target server did not start")
    try:
        yield
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
