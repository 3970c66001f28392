"""E1's CPU-bound model: ``GET /calculate?input=...`` hashes its input for a set service time.

The handler burns CPU synchronously on the event loop, as the FastAPI app of E1 did (an
``async def`` endpoint doing blocking work), so one server process serves one request at a
time: capacity is exactly ``1 / service_time`` requests per second per process and everything
else waits in the server's accept queue. That is the service whose goodput collapses when the
clients' timeout is shorter than the queue, and the one loadshed has to keep at capacity.

The burn chains SHA-256 over the input (``d0 = sha256(input)``, ``d(i+1) = sha256(d(i))``)
until the service time has elapsed on the wall clock, so the service time holds even when
other processes share the CPU. The response carries the final digest and the number of rounds,
which :func:`hash_chain` recomputes to check it.
"""

from __future__ import annotations

import hashlib
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadshed.demo import invalid_request, positive_int, positive_number

__all__ = ["DEFAULT_SERVICE_TIME", "burn", "create_app", "hash_chain"]

DEFAULT_SERVICE_TIME = 0.5
"""E1's work per request, seconds."""

# Rounds between clock reads: ~50-100 us of hashing, so the overshoot past the service time is
# negligible and the clock read costs nothing.
_ROUNDS_PER_CHECK = 128


def hash_chain(data: bytes, rounds: int) -> str:
    """The hex digest after ``rounds`` chained SHA-256 rounds over ``data`` (``rounds >= 1``)."""
    digest = hashlib.sha256(data).digest()
    for _ in range(rounds - 1):
        digest = hashlib.sha256(digest).digest()
    return digest.hex()


def burn(data: bytes, service_time: float) -> tuple[str, int]:
    """Chain SHA-256 over ``data`` until ``service_time`` seconds have passed.

    Returns ``(hex digest, rounds)``; ``hash_chain(data, rounds)`` gives the same digest.
    """
    deadline = time.perf_counter() + service_time
    digest = hashlib.sha256(data).digest()
    rounds = 1
    while time.perf_counter() < deadline:
        for _ in range(_ROUNDS_PER_CHECK):
            digest = hashlib.sha256(digest).digest()
        rounds += _ROUNDS_PER_CHECK
    return digest.hex(), rounds


def create_app(
    service_time: float = DEFAULT_SERVICE_TIME, *, max_input_bytes: int = 4096
) -> Starlette:
    """Build the hashburn service.

    ``service_time``: seconds of CPU burnt per request (default 0.5, as in E1).
    ``max_input_bytes``: longest accepted ``input`` (longer gets 422).
    Raises :class:`~loadshed.errors.ConfigError` naming a bad setting.
    """
    service_time = positive_number(service_time, "service_time", maximum=3600.0)
    max_input_bytes = positive_int(max_input_bytes, "max_input_bytes")

    async def calculate(request: Request) -> JSONResponse:
        text = request.query_params.get("input")
        if text is None:
            return invalid_request("input", "query parameter is required (?input=...)")
        data = text.encode()
        if len(data) > max_input_bytes:
            return invalid_request(
                "input", f"is {len(data)} bytes, at most {max_input_bytes} allowed"
            )
        started = time.perf_counter()
        # Deliberately blocking: the event loop (the only worker) is busy for service_time.
        digest, rounds = burn(data, service_time)
        return JSONResponse(
            {
                "result": digest,
                "rounds": rounds,
                "service_seconds": round(time.perf_counter() - started, 6),
            }
        )

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {"status": "ok", "model": "hashburn", "service_time": service_time, "workers": 1}
        )

    app = Starlette(
        routes=[
            Route("/calculate", calculate, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    app.state.model = "hashburn"
    app.state.service_time = service_time
    app.state.workers = 1
    return app
