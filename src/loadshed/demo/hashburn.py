"""The throughput paradox's CPU-bound model (docs/design.md): ``GET /calculate?input=...``
hashes its input for a set service time.

The handler burns CPU synchronously on the event loop, as the paradox's FastAPI app did (an
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

import contextlib
import hashlib
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadshed.demo import invalid_request, positive_int, positive_number
from loadshed.runner import ModelRunner, RunnerError

__all__ = ["DEFAULT_SERVICE_TIME", "burn", "create_app", "create_pool_app", "hash_chain"]

DEFAULT_SERVICE_TIME = 0.5
"""The throughput paradox's work per request, seconds."""

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


def _read_input(request: Request, max_input_bytes: int) -> bytes | JSONResponse:
    """The ``input`` query parameter as bytes, or a 422 naming what is wrong."""
    text = request.query_params.get("input")
    if text is None:
        return invalid_request("input", "query parameter is required (?input=...)")
    data = text.encode()
    if len(data) > max_input_bytes:
        return invalid_request("input", f"is {len(data)} bytes, at most {max_input_bytes} allowed")
    return data


def _answer(digest: str, rounds: int, started: float) -> JSONResponse:
    return JSONResponse(
        {
            "result": digest,
            "rounds": rounds,
            "service_seconds": round(time.perf_counter() - started, 6),
        }
    )


def create_app(
    service_time: float = DEFAULT_SERVICE_TIME, *, max_input_bytes: int = 4096
) -> Starlette:
    """Build the hashburn service.

    ``service_time``: seconds of CPU burnt per request (default 0.5, as in the
    throughput paradox).
    ``max_input_bytes``: longest accepted ``input`` (longer gets 422).
    Raises :class:`~loadshed.errors.ConfigError` naming a bad setting.
    """
    service_time = positive_number(service_time, "service_time", maximum=3600.0)
    max_input_bytes = positive_int(max_input_bytes, "max_input_bytes")

    async def calculate(request: Request) -> JSONResponse:
        data = _read_input(request, max_input_bytes)
        if isinstance(data, JSONResponse):
            return data
        started = time.perf_counter()
        # Deliberately blocking: the event loop (the only worker) is busy for service_time.
        digest, rounds = burn(data, service_time)
        return _answer(digest, rounds, started)

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


def create_pool_app(
    service_time: float = DEFAULT_SERVICE_TIME, *, workers: int = 1, max_input_bytes: int = 4096
) -> Starlette:
    """hashburn served as the throughput paradox's app was: the burn runs in ``workers``
    worker processes.

    The same endpoints and answers as :func:`create_app`, but :func:`burn` runs in a
    :class:`~loadshed.runner.ModelRunner` instead of on the event loop. On the loop, a
    burning request blocks everything else, so an in-process middleware only ever sees
    one request at a time (every other one waits in the kernel's accept queue, out of its
    sight) and cannot shed anything. With the work in a worker process, as with the
    paradox app's process pool, the loop stays free to admit, queue and reject. Without
    protection the paradox is intact: requests wait in the runner's FIFO, and those whose
    client gave up are still computed. Capacity is ``workers / service_time``.
    """
    service_time = positive_number(service_time, "service_time", maximum=3600.0)
    workers = positive_int(workers, "workers")
    max_input_bytes = positive_int(max_input_bytes, "max_input_bytes")
    runner: ModelRunner[tuple[str, int]] = ModelRunner(burn, workers=workers, mp_context="fork")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with runner:
            yield

    async def calculate(request: Request) -> JSONResponse:
        data = _read_input(request, max_input_bytes)
        if isinstance(data, JSONResponse):
            return data
        started = time.perf_counter()
        try:
            digest, rounds = await runner.run(data, service_time)
        except RunnerError as error:
            return JSONResponse({"error": "runner", "reason": str(error)}, status_code=500)
        return _answer(digest, rounds, started)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "model": "hashburn",
                "service_time": service_time,
                "workers": workers,
                "busy": runner.busy,
                "waiting": runner.waiting,
            }
        )

    app = Starlette(
        routes=[
            Route("/calculate", calculate, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.model = "hashburn"
    app.state.service_time = service_time
    app.state.workers = workers
    return app
