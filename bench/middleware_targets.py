"""Trivial ASGI apps for bench/middleware_overhead.py: bare and behind LoadShedMiddleware."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from loadshed.asgi import LoadShedMiddleware


async def hello(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


bare = Starlette(routes=[Route("/", hello)])
fixed = LoadShedMiddleware(Starlette(routes=[Route("/", hello)]), limit="fixed:1024")
little = LoadShedMiddleware(Starlette(routes=[Route("/", hello)]))
