"""Trivial ASGI apps for the middleware benchmarks: bare, behind LoadShedMiddleware, behind
the least a middleware can do (``forward``, ``timing_header``), and a server stack's floor for
refusals (``always_503``)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from loadshed.asgi import LoadShedMiddleware
from loadshed.limiter import Limiter


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


bare = Starlette(routes=[Route("/", hello)])
fixed = LoadShedMiddleware(Starlette(routes=[Route("/", hello)]), limit="fixed:1024")
little = LoadShedMiddleware(Starlette(routes=[Route("/", hello)]))
# The same without the Server-Timing header (server_timing=False).
fixed_untimed = LoadShedMiddleware(
    Starlette(routes=[Route("/", hello)]), limit="fixed:1024", server_timing=False
)
little_untimed = LoadShedMiddleware(Starlette(routes=[Route("/", hello)]), server_timing=False)


class Forward:
    """The least a pure ASGI middleware can do: call the app (the floor of any middleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class TimingHeader:
    """Forward plus what LoadShedMiddleware does to every response without a limiter: a
    ``Server-Timing`` header with two clock readings (the floor of a middleware that
    reports its timing)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        arrived = time.perf_counter()

        async def send_with_timing(message: Any) -> None:
            if message["type"] == "http.response.start":
                app_ms = (time.perf_counter() - arrived) * 1000.0
                timing = b"queue;dur=%.1f, app;dur=%.1f" % (0.0, app_ms)
                headers = [*message.get("headers", ()), (b"server-timing", timing)]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_timing)


forward = Forward(Starlette(routes=[Route("/", hello)]))
timing_header = TimingHeader(Starlette(routes=[Route("/", hello)]))


async def always_503(scope: dict, receive: object, send: Callable[[dict], Awaitable[None]]) -> None:
    """Answers every request with 503 at once: no admission, no model, no framework. What
    the server stack alone costs per refusal (bench/rejection_floor.py)."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 503, "headers": _REFUSAL_HEADERS})
    await send({"type": "http.response.body", "body": _REFUSAL_BODY})


_REFUSAL_BODY = b'{"error": "overloaded", "reason": "limit"}'
_REFUSAL_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", b"%d" % len(_REFUSAL_BODY)),
    (b"retry-after", b"1"),
]


# The middleware refusing every request (its one slot held for good, no queue): what a
# refusal costs through LoadShedMiddleware alone, no model, no metrics (rejection_floor.py).
_full = Limiter("fixed:1", max_queue=0)
_held = _full.try_acquire()
refuse_all = LoadShedMiddleware(Starlette(routes=[Route("/", hello)]), limiter=_full)
