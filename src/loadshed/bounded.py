"""``bounded_map``: run an async function over any iterable with bounded concurrency
and bounded memory.

The usual ways of fanning out bulk async work either create every task up front
(``gather`` over a million coroutines, or a semaphore taken *inside* each task: the
tasks exist, they just wait) or process fixed batches (every batch waits for its
slowest member). ``bounded_map`` takes the next input only when a slot is free, so
at most ``concurrency`` tasks exist at any time, whatever the length of the input,
and a slot is refilled as soon as any task finishes.

Example::

    async with bounded_map(embed, read_documents(), concurrency=64) as results:
        async for vector in results:
            store(vector)

``concurrency`` may also be a :class:`~loadshed.limits.base.LimitAlgorithm`; every
completed call is then a sample (success with its duration, or dropped when it raised
``TimeoutError``) and the limit is read again after each completion.

With ``cost=`` (a function of the input: rows, tokens), ``concurrency`` bounds the
*cost* in flight instead of the number of calls: ``bounded_map(embed, batches,
concurrency=20_000, cost=lambda batch: batch.tokens)`` keeps at most 20,000 tokens in
flight, however the batch sizes vary.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import weakref
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Generic, Literal, TypeVar, overload

from loadshed.checks import check_int
from loadshed.clock import MONOTONIC, Clock
from loadshed.costmodel import check_cost
from loadshed.errors import ConfigError
from loadshed.limits import make_limit
from loadshed.limits.base import LimitAlgorithm, Sample

__all__ = ["BoundedMap", "bounded_map"]

_T = TypeVar("_T")
_R = TypeVar("_R")
_Y = TypeVar("_Y")

DEFAULT_DROPPED_ON: tuple[type[BaseException], ...] = (TimeoutError, asyncio.TimeoutError)
"""Exceptions that count as an overload sign (a dropped sample) in adaptive mode."""


class _Nothing:
    """Sentinel type: no value staged or ready."""


_NOTHING = _Nothing()


class BoundedMap(AsyncIterator[_Y], Generic[_Y]):
    """The async iterator returned by :func:`bounded_map`; see there.

    Use it as ``async with`` (or call :meth:`aclose`) when you may stop early: leaving
    the block cancels every call still in flight and waits until they have ended.
    Being cancelled while waiting for the next result does the same. An iterator
    dropped without being closed cancels its calls when it is garbage-collected.
    """

    def __init__(
        self,
        fn: Callable[[Any], Awaitable[Any]],
        iterable: Iterable[Any] | AsyncIterable[Any],
        *,
        concurrency: int | str | LimitAlgorithm,
        ordered: bool,
        return_exceptions: bool,
        max_held: int | None,
        dropped_on: tuple[type[BaseException], ...],
        clock: Clock,
        cost: Callable[[Any], float] | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError("fn", f"must be an async callable, got {type(fn).__name__}")
        if isinstance(concurrency, str):
            try:
                concurrency = make_limit(concurrency)
            except ConfigError as error:  # name this function's argument
                raise ConfigError("concurrency", str(error).partition(": ")[2]) from None
        if isinstance(concurrency, LimitAlgorithm):
            self._algorithm: LimitAlgorithm | None = concurrency
            self._limit = concurrency.limit
        elif isinstance(concurrency, int) and not isinstance(concurrency, bool):
            self._algorithm = None
            self._limit = check_int("concurrency", concurrency, minimum=1)
        else:
            raise ConfigError(
                "concurrency",
                "must be an int >= 1, a limit name (aimd, vegas, ...) or a LimitAlgorithm, "
                f"got {type(concurrency).__name__}",
            )
        if max_held is not None:
            max_held = check_int("max_held", max_held, minimum=1)
        if cost is not None and not callable(cost):
            raise ConfigError(
                "cost", f"must be a callable input -> cost, got {type(cost).__name__}"
            )
        if cost is not None and self._algorithm is not None:
            # An adaptive limit is fed calls in flight; with costs the limit bounds
            # cost in flight: every input would "exceed" a limit of ~20 calls.
            raise ConfigError(
                "concurrency",
                "with cost= must be an int >= 1 (the cost in flight), not an adaptive "
                f"limit, got {self._algorithm.describe()}",
            )
        self._cost_fn = cost
        self._costs: dict[asyncio.Future[Any], float] = {}
        self._inflight_cost = 0.0
        self._staged_cost = 0.0
        self._peak_running = 0  # with cost=: the most calls in flight at once so far
        self._sync_source: Iterator[Any] | None
        self._async_source: AsyncIterator[Any] | None
        if isinstance(iterable, AsyncIterable):
            self._sync_source = None
            self._async_source = iterable.__aiter__()
        elif isinstance(iterable, Iterable):
            self._sync_source = iter(iterable)
            self._async_source = None
        else:
            raise ConfigError(
                "iterable",
                f"must be an iterable or an async iterable, got {type(iterable).__name__}",
            )
        self._fn = fn
        self._ordered = ordered
        self._return_exceptions = return_exceptions
        self._max_held = max_held
        self._dropped_on = dropped_on
        self._clock = clock

        # Calls in flight -> their input index. In adaptive mode also their start time
        # and the in-flight count when they started (itself included), for the sample.
        self._running: dict[asyncio.Future[Any], int] = {}
        self._started: dict[asyncio.Future[Any], tuple[float, int]] = {}
        self._ready: deque[Any] = deque()  # unordered: results in completion order
        self._buffer: dict[int, Any] = {}  # ordered: input index -> result
        self._next_index = 0  # inputs taken from the source so far
        self._yielded = 0  # results handed to the consumer so far
        self._staged: Any = _NOTHING  # an input pulled while no slot was free
        self._pull: asyncio.Future[Any] | None = None  # pending __anext__ of an async source
        self._exhausted = False
        self._error: BaseException | None = None
        self._stopping = False
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None

        # Tasks hold their done callback; a weak reference lets an abandoned iterator be
        # collected (and cancel its tasks in __del__) instead of living as long as they do.
        self_ref = weakref.ref(self)

        def on_done(future: asyncio.Future[Any]) -> None:
            owner = self_ref()
            if owner is not None:
                owner._on_done(future)

        def on_pulled(_: asyncio.Future[Any]) -> None:
            owner = self_ref()
            if owner is not None:
                owner._fill()
                owner._wake()

        self._callback_context = contextvars.copy_context()
        self._done_callback = on_done
        self._pulled_callback = on_pulled

    # -- public -----------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The current concurrency limit (changes over time in adaptive mode)."""
        return self._limit

    @property
    def in_flight(self) -> int:
        """Calls currently running."""
        return len(self._running)

    @property
    def in_flight_cost(self) -> float:
        """The cost of the calls running (with ``cost=``; else 0)."""
        return self._inflight_cost

    @property
    def held(self) -> int:
        """Inputs taken but not yet yielded: running, or finished and waiting."""
        return self._next_index - self._yielded

    def __aiter__(self) -> BoundedMap[_Y]:
        return self

    async def __anext__(self) -> _Y:
        if self._closed:
            raise StopAsyncIteration
        try:
            while True:
                if self._error is not None:
                    raise self._error
                if self._closed:  # closed by aclose() from another task meanwhile
                    raise StopAsyncIteration
                result = self._take()
                self._fill()
                if result is not _NOTHING:
                    return result  # type: ignore[no-any-return]
                if self._error is not None:
                    # This fill failed (the source, or a bad cost, on an input taken
                    # with nothing running): nothing would wake the wait below.
                    continue
                if (
                    self._exhausted
                    and not self._running
                    and self._pull is None
                    and self._staged is _NOTHING
                ):
                    self._closed = True
                    raise StopAsyncIteration
                await self._wait()
        except StopAsyncIteration:
            raise
        except BaseException:
            # A call failed (raise mode), the source failed, or the consumer was
            # cancelled: nothing may outlive the iteration.
            await self._shutdown()
            raise

    async def aclose(self) -> None:
        """Cancel every call still in flight and wait until all have ended."""
        if not self._closed or self._running or self._pull is not None:
            await self._shutdown()

    async def __aenter__(self) -> BoundedMap[_Y]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # Fallback for an iterator abandoned without aclose(): cancel, cannot await.
        pending = list(getattr(self, "_running", ()))
        pull = getattr(self, "_pull", None)
        if pull is not None:
            pending.append(pull)
        for future in pending:
            with contextlib.suppress(RuntimeError):  # the event loop is already closed
                future.cancel()

    # -- mechanism ----------------------------------------------------------------

    def _can_start(self) -> bool:
        # Finished results wait for the consumer (or, ordered, for an earlier input)
        # within max_held: a slow consumer or a slow head pauses the producer.
        if self._cost_fn is not None:  # the limit bounds the cost in flight
            # The limit counts cost units, not results: by default hold twice the most
            # calls that were in flight at once (at least 2), not twice the limit.
            max_held = 2 * max(self._peak_running, 1) if self._max_held is None else self._max_held
            return self.held < max_held and (not self._running or self._inflight_cost < self._limit)
        max_held = 2 * self._limit if self._max_held is None else self._max_held
        return len(self._running) < self._limit and self.held < max_held

    def _fits(self) -> bool:
        """With ``cost=``: the staged input's cost fits under the limit (or nothing
        runs: an input costing more than the whole limit runs alone)."""
        return not self._running or self._inflight_cost + self._staged_cost <= self._limit

    def _stage(self, item: Any) -> None:
        self._staged = item
        if self._cost_fn is not None:
            self._staged_cost = check_cost(self._cost_fn(item))

    def _fill(self) -> None:
        """Start calls while slots are free, pulling inputs one at a time.

        Runs from the consumer and from completion callbacks, so a freed slot is
        refilled at once, even while the consumer is busy.
        """
        try:
            self._fill_slots()
        except Exception as error:  # the source failed: raised to the consumer
            self._fail(error)

    def _fail(self, error: BaseException) -> None:
        """Record the error to raise and cancel every call in flight now."""
        if self._error is None:
            self._error = error
        self._stopping = True
        for other in self._running:
            other.cancel()
        self._wake()

    def _fill_slots(self) -> None:
        while self._error is None and not self._stopping:
            if self._staged is _NOTHING:
                if self._exhausted:
                    return
                if self._sync_source is not None:
                    if not self._can_start():
                        return
                    try:
                        item = next(self._sync_source)
                    except StopIteration:
                        self._exhausted = True
                        return
                    if self._cost_fn is None:
                        self._start(item)
                        continue
                    self._stage(item)
                else:
                    if self._pull is None:
                        if not self._can_start():
                            return
                        assert self._async_source is not None
                        self._pull = asyncio.ensure_future(self._async_source.__anext__())
                        self._pull.add_done_callback(self._pulled_callback)
                    if not self._pull.done():
                        return
                    pull, self._pull = self._pull, None
                    try:
                        self._stage(pull.result())
                    except StopAsyncIteration:
                        self._exhausted = True
                        return
            if not self._can_start():
                return
            if self._cost_fn is not None and not self._fits():
                return
            item, self._staged = self._staged, _NOTHING
            self._start(item)

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def _start(self, item: Any) -> None:
        index = self._next_index
        self._next_index += 1
        future: asyncio.Future[Any]
        try:
            awaitable = self._fn(item)
            if asyncio.iscoroutine(awaitable):  # the common case, without ensure_future's checks
                future = self._loop.create_task(awaitable)
            else:
                future = asyncio.ensure_future(awaitable)
        except Exception as error:  # fn raised, or returned something not awaitable
            future = self._loop.create_future()
            future.set_exception(error)
        self._running[future] = index
        if self._cost_fn is not None:
            self._costs[future] = self._staged_cost
            self._inflight_cost += self._staged_cost
            if len(self._running) > self._peak_running:
                self._peak_running = len(self._running)
        if self._algorithm is not None:
            self._started[future] = (self._clock.now(), len(self._running))
        # A shared context for our own callbacks saves copying one per call.
        future.add_done_callback(self._done_callback, context=self._callback_context)

    def _on_done(self, future: asyncio.Future[Any]) -> None:
        index = self._running.pop(future, None)
        started = self._started.pop(future, None)
        if self._cost_fn is not None:
            self._inflight_cost -= self._costs.pop(future, 0.0)
            if not self._running:
                self._inflight_cost = 0.0  # no float residue left behind
        if index is None or self._stopping:
            self._wake()
            return
        ok = False
        value: Any
        if future.cancelled():
            value = asyncio.CancelledError()
        else:
            error = future.exception()
            if error is None:
                ok = True
                value = future.result()
            else:
                value = error
        if self._algorithm is not None:
            if started is not None and (ok or isinstance(value, self._dropped_on)):
                now = self._clock.now()
                sample = Sample(rtt=now - started[0], inflight=started[1], dropped=not ok, now=now)
                self._algorithm.update(sample)
            # read after every completion, sampled or not: the algorithm may also be
            # moved by others (AdaptiveClient.map follows the client's limiter)
            self._limit = self._algorithm.limit
        if not ok and not self._return_exceptions:
            # Fail fast: cancel the rest now, not when the consumer next asks.
            self._fail(value)
            return
        if self._ordered:
            self._buffer[index] = value
        else:
            self._ready.append(value)
        self._fill()
        self._wake()

    def _take(self) -> Any:
        if self._ordered:
            result = self._buffer.pop(self._yielded, _NOTHING)
        else:
            result = self._ready.popleft() if self._ready else _NOTHING
        if result is not _NOTHING:
            self._yielded += 1
        return result

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _shutdown(self) -> None:
        self._closed = True
        self._stopping = True
        pending = list(self._running)
        if self._pull is not None:
            pending.append(self._pull)
            self._pull = None
        for future in pending:
            future.cancel()
        self._ready.clear()
        self._buffer.clear()
        self._staged = _NOTHING
        if pending:
            await asyncio.wait(pending)
        self._running.clear()
        self._started.clear()
        self._costs.clear()
        self._inflight_cost = 0.0


@overload
def bounded_map(
    fn: Callable[[_T], Awaitable[_R]],
    iterable: Iterable[_T] | AsyncIterable[_T],
    concurrency: int | str | LimitAlgorithm = ...,
    ordered: bool = ...,
    *,
    return_exceptions: Literal[False] = ...,
    max_held: int | None = ...,
    dropped_on: tuple[type[BaseException], ...] = ...,
    clock: Clock = ...,
    cost: Callable[[_T], float] | None = ...,
) -> BoundedMap[_R]: ...


@overload
def bounded_map(
    fn: Callable[[_T], Awaitable[_R]],
    iterable: Iterable[_T] | AsyncIterable[_T],
    concurrency: int | str | LimitAlgorithm = ...,
    ordered: bool = ...,
    *,
    return_exceptions: Literal[True],
    max_held: int | None = ...,
    dropped_on: tuple[type[BaseException], ...] = ...,
    clock: Clock = ...,
    cost: Callable[[_T], float] | None = ...,
) -> BoundedMap[_R | BaseException]: ...


@overload
def bounded_map(
    fn: Callable[[_T], Awaitable[_R]],
    iterable: Iterable[_T] | AsyncIterable[_T],
    concurrency: int | str | LimitAlgorithm = ...,
    ordered: bool = ...,
    *,
    return_exceptions: bool,
    max_held: int | None = ...,
    dropped_on: tuple[type[BaseException], ...] = ...,
    clock: Clock = ...,
    cost: Callable[[_T], float] | None = ...,
) -> BoundedMap[_R] | BoundedMap[_R | BaseException]: ...


def bounded_map(
    fn: Callable[[_T], Awaitable[_R]],
    iterable: Iterable[_T] | AsyncIterable[_T],
    concurrency: int | str | LimitAlgorithm = 500,
    ordered: bool = False,
    *,
    return_exceptions: bool = False,
    max_held: int | None = None,
    dropped_on: tuple[type[BaseException], ...] = DEFAULT_DROPPED_ON,
    clock: Clock = MONOTONIC,
    cost: Callable[[_T], float] | None = None,
) -> BoundedMap[_R] | BoundedMap[_R | BaseException]:
    """Run ``fn`` over ``iterable`` with at most ``concurrency`` calls in flight.

    ``async for result in bounded_map(fn, inputs, concurrency=500): ...``

    - ``iterable``: any iterable or async iterable, of any length. An input is taken
      only when a slot is free (before its task is created), so memory is
      O(concurrency), not O(inputs).
    - ``concurrency``: an int, or for an adaptive limit a :class:`LimitAlgorithm` or a
      name for :func:`loadshed.limits.make_limit` (``"aimd"``, ``"vegas"``...): each
      completed call is a sample (success with its duration; dropped if it raised one
      of ``dropped_on``, by default ``TimeoutError``; other errors are ignored) and the
      limit is read again after each completion.
    - ``ordered=False``: results in completion order; ``ordered=True``: in input
      order. A slot is refilled as soon as its call ends, even while the consumer is
      busy, but never beyond ``max_held`` inputs taken and not yet yielded (running,
      or finished and waiting for the consumer or, ordered, for an earlier input);
      default twice the current limit, or with ``cost=`` (where the limit counts cost
      units, not calls) twice the most calls that have been in flight at once (at
      least 2). So the results waiting (the reorder buffer)
      never number more than ``max_held`` (``max_held - 1`` in ordered mode, where
      the oldest input is still running): a slow consumer or a slow early input
      pauses the producer instead of growing a buffer.
    - ``return_exceptions=False``: the first exception raised by a call is raised from
      the iteration at once, after every other call still in flight has been
      cancelled and has ended; results not yet taken are discarded.
      ``return_exceptions=True``: an exception is yielded as that input's result.
      Errors of the source itself are always raised.
    - ``cost``: a function of an input giving its cost (a number > 0: rows, tokens);
      ``concurrency`` then bounds the cost in flight, not the number of calls (an
      input costing more than the whole limit runs alone). A bad cost or a failure
      of ``cost`` is raised like an error of the source.

    Leaving an ``async with`` block, calling ``aclose()``, or cancelling the consumer
    cancels every call still in flight and waits for them, so none is left behind.
    """
    return BoundedMap(
        fn,
        iterable,
        concurrency=concurrency,
        ordered=ordered,
        return_exceptions=return_exceptions,
        max_held=max_held,
        dropped_on=dropped_on,
        clock=clock,
        cost=cost,
    )
