"""The asyncio limiter: a thin layer that turns :class:`Admission` callbacks into
awaitables and keeps one timer armed for queue timeouts.

    limiter = Limiter("little")
    async with limiter.acquire(priority=Priority.DEFAULT, deadline=None) as token:
        ...  # normal exit: success; TimeoutError: dropped; anything else: ignored

A task cancelled while queued leaves the queue at once (``client_gone``) and frees
nothing it did not hold. :meth:`Limiter.close` (a server shutting down) answers every
queued request and every later one with ``Rejected(shutdown)`` at once, while tokens
already held run to their end.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Generator, Mapping
from types import TracebackType
from typing import Any, Protocol

from loadshed.admission import Admission, LimiterListener, LimiterSnapshot, Ticket, Token
from loadshed.clock import MONOTONIC, Clock
from loadshed.config import AdmissionConfig, Discipline, LimitUnit
from loadshed.costmodel import check_cost
from loadshed.errors import ConfigError, Outcome, Priority, Rejected, RejectReason
from loadshed.limits.base import LimitAlgorithm
from loadshed.limits.workers import WorkerCount
from loadshed.slot import current_token
from loadshed.waitbound import DEFAULT_WAIT_CEILING

__all__ = ["Limiter", "Token", "Waiting", "WorkerPool"]


class WorkerPool(Protocol):
    """What ``Limiter(runner=...)`` needs of a runner (:class:`~loadshed.runner.ModelRunner`
    has it): its configured and live worker counts, and a callback when the live count
    changes."""

    @property
    def workers(self) -> int:
        """Configured number of workers."""

    @property
    def live_workers(self) -> int:
        """Workers able to take a job now (idle or busy)."""

    def add_workers_listener(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(live_workers)`` whenever the live count changes."""


class Limiter:
    """Concurrency limiter for asyncio code.

    ``limit`` is a limit algorithm, a spec understood by
    :func:`loadshed.limits.make_limit` (``little``, ``aimd``, ``vegas``,
    ``gradient2``, ``gradient``, ``fixed:N``) or an int (a fixed limit); None (the
    default) means ``little``. The keyword arguments configure the :class:`Admission`
    core (queue bound, queue wait, discipline, reserved shares, CoDel...); ``config``
    gives them all at once as an :class:`~loadshed.config.AdmissionConfig`.

    ``runner`` (a :class:`~loadshed.runner.ModelRunner`, or anything with its
    :class:`WorkerPool` members) makes the runner's live worker count the limit
    (:class:`~loadshed.limits.workers.WorkerCount`): a worker that crashed counts as
    gone until its replacement is ready, and queued requests are granted as soon as it
    is. The queue in front stays bounded and deadline-aware. Giving ``limit`` as well is
    a :class:`ConfigError`.
    """

    def __init__(
        self,
        limit: LimitAlgorithm | str | int | None = None,
        *,
        name: str = "default",
        clock: Clock = MONOTONIC,
        max_queue: int = 1000,
        max_queue_wait: float | None = None,
        discipline: Discipline | str = Discipline.FIFO,
        reserved: Mapping[Priority, float] | None = None,
        initial_service_time: float | None = None,
        learn_patience: bool = True,
        runner: WorkerPool | None = None,
        adaptive_wait_ceiling: float = DEFAULT_WAIT_CEILING,
        codel_target: float = 0.005,
        codel_interval: float = 0.1,
        limit_unit: LimitUnit | str = LimitUnit.REQUESTS,
        config: AdmissionConfig | None = None,
    ) -> None:
        from loadshed.limits import make_limit

        algorithm: LimitAlgorithm
        self._worker_count: WorkerCount | None = None
        if runner is not None:
            if limit is not None:
                raise ConfigError(
                    "runner",
                    f"sets the limit (the runner's live worker count); give runner= or "
                    f"limit=, not both (got limit={limit!r})",
                )
            algorithm = self._worker_count = _worker_count_of(runner)
        else:
            algorithm = make_limit("little" if limit is None else limit)
        self.admission = Admission(
            algorithm,
            clock,
            name=name,
            max_queue=max_queue,
            max_queue_wait=max_queue_wait,
            discipline=discipline,
            reserved=reserved,
            initial_service_time=initial_service_time,
            learn_patience=learn_patience,
            adaptive_wait_ceiling=adaptive_wait_ceiling,
            codel_target=codel_target,
            codel_interval=codel_interval,
            limit_unit=limit_unit,
            config=config,
        )
        self.clock = clock
        self.closed = False
        """True once :meth:`close` was called: every new request is refused (``shutdown``)."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        if runner is not None:
            runner.add_workers_listener(self._workers_changed)

    def _workers_changed(self, live: int) -> None:
        """The runner's live worker count changed: follow it, grant waiters if it rose."""
        worker_count = self._worker_count
        if worker_count is not None and worker_count.refresh() > self.admission.inflight:
            self.admission.limit_changed()

    # Read-only views of the core's state.
    @property
    def name(self) -> str:
        """The limiter's label."""
        return self.admission.name

    @property
    def limit(self) -> int:
        """The current concurrency limit."""
        return self.admission.limit

    @property
    def inflight(self) -> int:
        """Tokens held now."""
        return self.admission.inflight

    @property
    def inflight_cost(self) -> float:
        """Cost units held now when the limit counts cost (``limit_unit="cost"``); else 0."""
        return self.admission.inflight_cost

    @property
    def queue_length(self) -> int:
        """Requests waiting now."""
        return self.admission.queue_length

    def snapshot(self) -> LimiterSnapshot:
        """Limit, in-flight, queue length, estimates and counters."""
        return self.admission.snapshot()

    def retry_after(self) -> float:
        """Seconds until the queue would have drained at the current pace."""
        return self.admission.retry_after()

    def client_gave_up(self, waited: float) -> None:
        """A client gave up after ``waited`` seconds (teaches the default deadline)."""
        self.admission.client_gave_up(waited)

    def limit_changed(self) -> None:
        """Serve queued waiters now after the limit was raised out of band."""
        self.admission.limit_changed()

    def add_listener(self, listener: LimiterListener) -> None:
        """Register a listener for admission events (metrics)."""
        self.admission.add_listener(listener)

    def close(self) -> int:
        """Shut down: refuse every queued request and every later one with
        ``Rejected(shutdown)`` (a 503 + Retry-After from the middleware), at once.

        Requests holding a token are not touched: they finish and release as usual.
        Returns how many queued requests were refused. Calling it again refuses only
        what queued since (nothing can: every new request is refused).
        """
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = float("inf")
        admission = self.admission
        retry_after = admission.retry_after()
        # Every live ticket, most critical first, oldest first (the core's own queues:
        # this is the limiter's half of the admission layer, and runs once).
        tickets = [ticket for queue in admission._queues for ticket in queue if ticket.queued]
        for ticket in tickets:
            if admission.cancel(ticket, RejectReason.SHUTDOWN):
                ticket.on_reject(Rejected(RejectReason.SHUTDOWN, retry_after))
        return len(tickets)

    def _refuse_closed(self, cost: float | None) -> Rejected:
        """A request that arrived after :meth:`close`: counted, its cost too (a bad cost
        is a :class:`ConfigError`, as when open), and refused (``shutdown``)."""
        if cost is not None:
            cost = check_cost(cost)
        self.admission._count_reject(RejectReason.SHUTDOWN, 0.0, cost)
        return Rejected(RejectReason.SHUTDOWN, self.admission.retry_after())

    def try_acquire(
        self,
        *,
        priority: Priority = Priority.DEFAULT,
        deadline: float | None = None,
        cost: float | None = None,
    ) -> Token:
        """A token now, or Rejected; never waits."""
        if self.closed:
            raise self._refuse_closed(cost)
        return self.admission.try_acquire(priority=priority, deadline=deadline, cost=cost)

    def acquire(
        self,
        *,
        priority: Priority = Priority.DEFAULT,
        deadline: float | None = None,
        cost: float | None = None,
    ) -> _Acquire:
        """Wait for a token: ``await limiter.acquire()`` or ``async with limiter.acquire():``.

        ``deadline`` is an absolute time on the limiter's clock. ``cost`` (> 0) is what
        the request costs (rows, tokens): once the limiter's cost model
        (:class:`~loadshed.costmodel.CostModel`) is fitted, its deadline and queue wait
        are judged on its own predicted service time. Raises :class:`Rejected` when
        refused or evicted from the queue.
        """
        return _Acquire(self, priority, deadline, cost)

    def enter(
        self,
        *,
        priority: Priority = Priority.DEFAULT,
        deadline: float | None = None,
        cost: float | None = None,
    ) -> Token | Waiting:
        """Submit without awaiting: a Token now, a :class:`Waiting` (queued), or Rejected.

        For integrations that must watch something else while queued (the ASGI
        middleware watches for the client's disconnect).
        """
        if self.closed:
            raise self._refuse_closed(cost)
        token = self.admission.grant_now(priority=priority, deadline=deadline, cost=cost)
        if token is not None:  # the common case: no future needed
            return token
        # A ticket's callbacks only fire after submit() returned it, so they are made
        # here, for a queued request only: a refusal (the common case under overload)
        # makes no future and no closures. The loop is fetched first: without one,
        # nothing may be left queued.
        loop = asyncio.get_running_loop()
        result = self.admission.submit(
            priority=priority, deadline=deadline, on_grant=_not_set, on_reject=_not_set, cost=cost
        )
        if isinstance(result, Token):
            return result
        future: asyncio.Future[Token] = loop.create_future()

        def on_grant(token: Token) -> None:
            if future.done():  # the waiter was cancelled in the same tick
                token.release(Outcome.IGNORED)
            else:
                future.set_result(token)

        def on_reject(rejected: Rejected) -> None:
            if not future.done():
                future.set_exception(rejected)

        result.on_grant = on_grant
        result.on_reject = on_reject
        self._arm_timer(loop)
        return Waiting(self.admission, result, future)

    async def _acquire(
        self, priority: Priority, deadline: float | None, cost: float | None = None
    ) -> Token:
        entry = self.enter(priority=priority, deadline=deadline, cost=cost)
        if isinstance(entry, Token):
            return entry
        return await entry.wait()

    def _arm_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """Keep one timer at the earliest queue expiry."""
        when = self.admission.next_expiry()
        if when is None or when >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        delay = max(0.0, when - self.clock.now())
        self._timer = loop.call_later(delay, self._on_timer, loop)

    def _on_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._timer_at = float("inf")
        self.admission.expire()
        self._arm_timer(loop)


def _worker_count_of(runner: WorkerPool) -> WorkerCount:
    """The limit of ``Limiter(runner=...)``: the runner's live worker count."""
    for member in ("workers", "live_workers", "add_workers_listener"):
        if not hasattr(runner, member):
            raise ConfigError(
                "runner", f"expected a ModelRunner (with {member}), got {type(runner).__name__}"
            )
    return WorkerCount(lambda: runner.live_workers, max_limit=runner.workers)


def _not_set(_: object) -> None:
    """A ticket's callback until :meth:`Limiter.enter` sets the real ones."""
    raise AssertionError("a ticket's callback fired before submit() returned it")


class Waiting:
    """A queued acquisition: ``await waiting.wait()`` for the token, or ``cancel()``."""

    __slots__ = ("_admission", "future", "ticket")

    def __init__(self, admission: Admission, ticket: Ticket, future: asyncio.Future[Token]) -> None:
        self._admission = admission
        self.ticket = ticket
        self.future = future

    async def wait(self) -> Token:
        """The token once granted; raises Rejected if evicted. Cancelling leaves the queue."""
        try:
            return await asyncio.shield(self.future)
        except asyncio.CancelledError:
            self.cancel()
            raise

    def leave(self, reason: RejectReason) -> bool:
        """Leave the queue if still queued: count ``reason`` and end the wait with
        ``Rejected(reason)``. Returns False (and does nothing) once granted or rejected."""
        if not self._admission.cancel(self.ticket, reason):
            return False
        if not self.future.done():
            self.future.set_exception(Rejected(reason, 0.0))
        return True

    def cancel(self, reason: RejectReason = RejectReason.CLIENT_GONE) -> None:
        """Leave the queue (``reason`` is counted); a token granted meanwhile is released."""
        if self._admission.cancel(self.ticket, reason):
            self.future.cancel()
            return
        future = self.future
        if future.done() and not future.cancelled() and future.exception() is None:
            future.result().release(Outcome.IGNORED)
        elif not future.done():
            future.cancel()


class _Acquire:
    """Awaitable and async context manager returned by :meth:`Limiter.acquire`."""

    __slots__ = ("_cost", "_deadline", "_held", "_limiter", "_priority", "_token")

    def __init__(
        self, limiter: Limiter, priority: Priority, deadline: float | None, cost: float | None
    ) -> None:
        self._limiter = limiter
        self._priority = priority
        self._deadline = deadline
        self._cost = cost
        self._token: Token | None = None
        self._held: contextvars.Token[Token | None] | None = None

    def __await__(self) -> Generator[Any, None, Token]:
        return self._limiter._acquire(self._priority, self._deadline, self._cost).__await__()

    async def __aenter__(self) -> Token:
        self._token = await self._limiter._acquire(self._priority, self._deadline, self._cost)
        self._held = current_token.set(self._token)  # ModelRunner vacates it (free_slot)
        return self._token

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        token = self._token
        if token is None:
            return
        if exc_type is None:
            token.release(Outcome.SUCCESS)
        elif issubclass(exc_type, (TimeoutError, asyncio.TimeoutError)):
            token.release(Outcome.DROPPED)
        else:
            token.release(Outcome.IGNORED)
        held, self._held = self._held, None
        if held is not None:
            # Left in another context than entered (an async generator finalised by a new
            # task): that context's value is not ours to reset.
            with contextlib.suppress(ValueError):
                current_token.reset(held)
