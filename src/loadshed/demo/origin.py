"""The capacity-change experiment's origin (docs/design.md): ``workers`` slots, a bounded
queue, and a work time that can change live.

``GET /work`` takes one of ``workers`` slots, holds it for the current work time (an asyncio
sleep, not CPU, so 7 workers fit on 2 cores) and answers 200. When every slot is busy the
request waits in a FIFO of at most ``queue`` requests; past that it gets 503 at once. A request
whose client went away keeps its slot for the whole work time, like a server that does not
notice disconnects: that wasted work is what load shedding in front of it avoids.

The work time is constant by default (as in the capacity change). ``service_dist`` makes it
vary per request around the same mean: ``exponential``, or ``lognormal`` with log-space spread
``sigma``, drawn from a generator seeded by ``seed`` so a run repeats; capacity stays
``workers / service_time``. The generator is salted: ``loadshed bench --seed N`` draws
its Poisson gaps from ``random.Random(N)``, and work times drawn from the same numbers
would make the i-th request's work proportional to the gap before it (long jobs after
long pauses: a smoother load than any real one).

``PUT /admin/work-time`` with ``{"seconds": 2.0}`` changes the (mean) work time of requests that
start work from then on (the capacity-change experiment halves capacity this way).
``GET /admin/stats`` reports the state.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import random
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadshed.clock import MONOTONIC, Clock
from loadshed.demo import invalid_request, positive_int, positive_number
from loadshed.errors import ConfigError
from loadshed.sim.service import DISTRIBUTIONS, ServiceTime, make_service_time

__all__ = [
    "DEFAULT_QUEUE",
    "DEFAULT_SERVICE_TIME",
    "DEFAULT_SIGMA",
    "DEFAULT_WORKERS",
    "SERVICE_DISTRIBUTIONS",
    "Origin",
    "create_app",
    "work_time_generator",
]

DEFAULT_WORKERS = 7
"""The capacity-change experiment's origin slots."""
DEFAULT_SERVICE_TIME = 1.0
"""The capacity-change experiment's initial work time, seconds (later 2.0)."""
DEFAULT_QUEUE = 100
"""The capacity-change experiment's origin queue bound."""
SERVICE_DISTRIBUTIONS: tuple[str, ...] = DISTRIBUTIONS
"""Work-time distributions: ``constant`` (the capacity change's), ``exponential``,
``lognormal``; all have mean ``service_time``."""
DEFAULT_SIGMA = 0.5
"""Log-space spread of the ``lognormal`` work time (the simulator's default)."""
MAX_WORK_TIME = 3600.0


class QueueFull(Exception):
    """Every slot is busy and the queue holds ``queue`` requests already."""


class Origin:
    """The origin's slots and queue (asyncio; one event loop)."""

    def __init__(
        self,
        workers: int = DEFAULT_WORKERS,
        service_time: float = DEFAULT_SERVICE_TIME,
        queue: int = DEFAULT_QUEUE,
        clock: Clock = MONOTONIC,
        *,
        service_dist: str = "constant",
        sigma: float = DEFAULT_SIGMA,
        seed: int = 0,
    ) -> None:
        self.workers = positive_int(workers, "workers")
        if service_dist not in SERVICE_DISTRIBUTIONS:
            raise ConfigError(
                "service_dist",
                f"got {service_dist!r}, allowed: {'|'.join(SERVICE_DISTRIBUTIONS)}",
            )
        self.service_dist = service_dist
        self.sigma = positive_number(sigma, "sigma")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError("seed", f"must be an integer, got {seed!r}")
        self.seed = seed
        self._rng = work_time_generator(seed)
        self.work_time = positive_number(service_time, "service_time", maximum=MAX_WORK_TIME)
        self.queue_limit = positive_int(queue, "queue", minimum=0)
        self._clock = clock
        self.busy = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.served = 0
        self.rejected = 0

    @property
    def work_time(self) -> float:
        """Mean work time in seconds (the exact work time when constant)."""
        return self._service.mean

    @work_time.setter
    def work_time(self, seconds: float) -> None:
        self._service: ServiceTime = make_service_time(self.service_dist, seconds, self.sigma)

    def draw_work_time(self) -> float:
        """The work time of the next request to start work: a draw from the distribution."""
        return self._service.sample(self._rng)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return sum(1 for f in self._waiters if not f.done())

    async def work(self) -> tuple[float, float]:
        """Wait for a slot (or raise :class:`QueueFull`), hold it for the work time.

        Returns ``(queued_seconds, worked_seconds)``.
        """
        arrived = self._clock.now()
        if self.busy >= self.workers or self._waiters:
            if self.queued >= self.queue_limit:
                self.rejected += 1
                raise QueueFull
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter  # the releasing request hands its slot over (busy unchanged)
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._release()  # a slot was handed to us as we were cancelled
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        else:
            self.busy += 1
        started = self._clock.now()
        work_time = self.draw_work_time()
        try:
            await asyncio.sleep(work_time)
        finally:
            self._release()
        self.served += 1
        return started - arrived, work_time

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.busy -= 1

    def stats(self) -> dict[str, Any]:
        """The origin's settings and counters, for ``GET /admin/stats``."""
        return {
            "workers": self.workers,
            "queue_limit": self.queue_limit,
            "work_time": self.work_time,
            "service_dist": self.service_dist,
            "sigma": self.sigma if self.service_dist == "lognormal" else None,
            "seed": self.seed,
            "busy": self.busy,
            "queued": self.queued,
            "served": self.served,
            "rejected": self.rejected,
            "capacity_rps": self.workers / self.work_time,
        }


def work_time_generator(seed: int) -> random.Random:
    """The generator of an origin's work times for ``seed``: salted, so that it never
    draws the same numbers as ``random.Random(seed)`` (see the module docstring)."""
    return random.Random(f"origin-work-times:{seed}")


def create_app(
    workers: int = DEFAULT_WORKERS,
    service_time: float = DEFAULT_SERVICE_TIME,
    queue: int = DEFAULT_QUEUE,
    *,
    service_dist: str = "constant",
    sigma: float = DEFAULT_SIGMA,
    seed: int = 0,
    clock: Clock = MONOTONIC,
) -> Starlette:
    """Build the origin service: ``workers`` slots, initial (mean) work time ``service_time``
    seconds drawn from ``service_dist`` (``constant|exponential|lognormal``; ``sigma`` is the
    lognormal's log-space spread; ``seed`` seeds the draws), at most ``queue`` waiting
    requests. Raises :class:`~loadshed.errors.ConfigError` naming a bad setting."""
    origin = Origin(
        workers=workers,
        service_time=service_time,
        queue=queue,
        clock=clock,
        service_dist=service_dist,
        sigma=sigma,
        seed=seed,
    )

    async def work(request: Request) -> JSONResponse:
        try:
            queued_seconds, worked_seconds = await origin.work()
        except QueueFull:
            return JSONResponse(
                {"error": "overloaded", "reason": f"queue full ({origin.queue_limit} waiting)"},
                status_code=503,
                headers={"Retry-After": str(max(1, math.ceil(origin.work_time)))},
            )
        return JSONResponse(
            {"queued_seconds": round(queued_seconds, 6), "worked_seconds": round(worked_seconds, 6)}
        )

    async def set_work_time(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return invalid_request("body", f"not valid JSON ({exc})")
        if not isinstance(body, dict) or "seconds" not in body:
            return invalid_request("seconds", 'required, e.g. {"seconds": 2.0}')
        seconds = body["seconds"]
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not math.isfinite(seconds)
            or not 0 < seconds <= MAX_WORK_TIME
        ):
            return invalid_request(
                "seconds", f"must be a number > 0 and <= {MAX_WORK_TIME:g}, got {seconds!r}"
            )
        previous = origin.work_time
        origin.work_time = float(seconds)
        return JSONResponse({"seconds": origin.work_time, "previous": previous})

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(origin.stats())

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": "origin", **origin.stats()})

    app = Starlette(
        routes=[
            Route("/work", work, methods=["GET"]),
            Route("/admin/work-time", set_work_time, methods=["PUT"]),
            Route("/admin/stats", stats, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    app.state.model = "origin"
    app.state.origin = origin
    app.state.workers = origin.workers
    app.state.service_time = origin.work_time
    return app
