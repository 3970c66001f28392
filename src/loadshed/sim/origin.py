"""The model server behind the limiter: ``workers`` parallel slots and a FIFO queue of
its own, like a process pool or a Go server with a worker pool.

It keeps working on requests whose client has left, as real servers do: nothing
tells a worker that nobody waits for its answer any more. The queue is unbounded by
default; when bounded, a request past it gets a 503 at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from loadshed.errors import ConfigError
from loadshed.sim.engine import Engine
from loadshed.sim.request import Request
from loadshed.sim.service import ServiceModel

__all__ = ["Origin"]


class Origin:
    """``workers`` slots serving requests in FIFO order; calls ``on_done(request, ok)``."""

    __slots__ = (
        "_engine",
        "_queue",
        "busy",
        "busy_seconds",
        "completed",
        "max_queue",
        "on_done",
        "rejected",
        "service",
        "slow_factor",
        "workers",
    )

    def __init__(
        self,
        engine: Engine,
        workers: int,
        service: ServiceModel,
        on_done: Callable[[Request, bool], None],
        *,
        max_queue: int | None = None,
    ) -> None:
        if workers < 1:
            raise ConfigError("workers", f"must be >= 1, got {workers}")
        if max_queue is not None and max_queue < 0:
            raise ConfigError("origin_queue", f"must be >= 0 or unbounded, got {max_queue}")
        self._engine = engine
        self._queue: deque[Request] = deque()
        self.workers = workers
        self.busy = 0
        """Workers running a request (may exceed ``workers`` right after they shrink)."""
        self.max_queue = max_queue
        self.service = service
        self.on_done = on_done
        self.slow_factor = 1.0
        """Multiplies service times (the fleet slows some replicas down)."""
        self.completed = 0
        self.rejected = 0
        self.busy_seconds = 0.0

    @property
    def queue_length(self) -> int:
        """Requests waiting for a worker."""
        return len(self._queue)

    @property
    def idle(self) -> int:
        """Workers free to take a request now."""
        return max(0, self.workers - self.busy)

    def set_workers(self, workers: int) -> None:
        """Change the worker count now (workers lost or added mid-run).

        Added workers take queued requests at once; a removed worker finishes the
        request it holds first (as a process told to stop after its current job).
        """
        if workers < 1:
            raise ConfigError("workers", f"must be >= 1, got {workers}")
        self.workers = workers
        queue = self._queue
        while queue and self.busy < workers:
            self.busy += 1
            self._run(queue.popleft())

    def start(self, request: Request) -> None:
        """Take a request: run it on an idle worker, queue it, or answer 503."""
        if self.busy < self.workers:
            self.busy += 1
            self._run(request)
        elif self.max_queue is not None and len(self._queue) >= self.max_queue:
            self.rejected += 1
            # answered from an event, not from inside the caller (which may be the
            # limiter's release callback)
            self._engine.at(self._engine.clock.now(), self._reject, request)
        else:
            self._queue.append(request)

    def _run(self, request: Request) -> None:
        engine = self._engine
        now = engine.clock.now()
        seconds = self.service.sample(now) * self.slow_factor * request.size
        self.busy_seconds += seconds
        engine.at(now + seconds, self._finish, request)

    def _finish(self, request: Request) -> None:
        self.completed += 1
        if self._queue and self.busy <= self.workers:
            self._run(self._queue.popleft())
        else:
            self.busy -= 1
        self.on_done(request, True)

    def _reject(self, request: Request) -> None:
        self.on_done(request, False)
