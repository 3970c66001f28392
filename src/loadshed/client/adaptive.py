"""``AdaptiveClient``: calls through a local throttle, an adaptive limiter, a deadline
and a retry budget (see :mod:`loadshed.client`)."""

from __future__ import annotations

import asyncio
import enum
import math
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import aiohttp
from multidict import CIMultiDict

from loadshed.bounded import BoundedMap, bounded_map
from loadshed.checks import check_int, check_optional_number
from loadshed.client.errors import ClientThrottled
from loadshed.client.policy import OVERLOAD_STATUSES, CallOutcome, default_client_limit
from loadshed.client.response import Response
from loadshed.client.stats import ClientStats, Latency
from loadshed.clock import MONOTONIC, Clock
from loadshed.costmodel import check_cost
from loadshed.errors import REFUSAL_STATUSES, ConfigError, LoadshedError, Priority
from loadshed.histogram import LatencyHistogram
from loadshed.limiter import Limiter, Token
from loadshed.limits import make_limit
from loadshed.limits.base import LimitAlgorithm, Sample
from loadshed.retry import Backoff, RetryBudget, parse_retry_after
from loadshed.throttle import AdaptiveThrottle

__all__ = ["AdaptiveClient"]

_T = TypeVar("_T")
_R = TypeVar("_R")


class _Default(enum.Enum):
    CLIENT = "the client's default"


@dataclass
class _Call:
    """One call's state across its attempts."""

    priority: Priority
    deadline: float | None
    headers: CIMultiDict[str]
    cost: float | None = None
    attempt: int = 0
    local_s: float = 0.0
    """Time spent locally: the limiter's queue and retry backoff."""
    upstream_s: float = 0.0
    last: Response | None = None
    last_error: aiohttp.ClientConnectionError | None = None
    outcome: CallOutcome = CallOutcome.ERROR


class _LimitView(LimitAlgorithm):
    """Lets ``bounded_map`` follow the client's limit without feeding it samples
    (the client's limiter already does): calls waiting in retry backoff hold no
    upstream slot, so they do not count against it."""

    name = "client-limit"

    def __init__(self, client: AdaptiveClient) -> None:
        self._client = client
        algorithm = client.limiter.admission.algorithm
        self.min_limit = algorithm.min_limit
        self.max_limit = algorithm.max_limit

    @property
    def limit(self) -> int:
        return self._client.limiter.limit + self._client._backing_off

    def update(self, sample: Sample) -> int:
        return self.limit


class AdaptiveClient:
    """An aiohttp client that finds and respects an upstream's capacity.

    Parameters (all keyword-only except ``base_url``):
        base_url: prefix for relative URLs (ignored when ``session`` is given).
        limit: limit algorithm or spec for :func:`loadshed.limits.make_limit`
            (default :func:`default_client_limit`: AIMD that grows by one and halves
            on an overload sign, once per window of 8 calls).
        timeout: default deadline of a call in seconds (queue + attempts + backoff);
            None for none. Per call: ``request(..., timeout=...)``.
        session: an existing :class:`aiohttp.ClientSession` to wrap (not closed by
            the client); its connector's limit must not be below the algorithm's
            ``max_limit``. By default the client makes one sized from it.
        max_queue: most calls waiting locally for a slot (beyond: ``Rejected``).
        max_attempts: attempts per call, retries included.
        retry_statuses: answers retried (within the budget).
        retry_connection_errors: retry connection errors (calls are assumed
            idempotent, as inference usually is; set False if yours are not).
        retry_budget, throttle, backoff: the policies (defaults: 10 % of requests
            over 10 s; K = 2 over 60 s; 50 ms base, 2 s cap, full jitter).
        clock: time source for the limiter, throttle, budget and statistics.
        headers: default headers sent with every call.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        limit: LimitAlgorithm | str | int | None = None,
        timeout: float | None = 30.0,
        session: aiohttp.ClientSession | None = None,
        max_queue: int = 10_000,
        max_attempts: int = 3,
        retry_statuses: Iterable[int] = REFUSAL_STATUSES,
        retry_connection_errors: bool = True,
        retry_budget: RetryBudget | None = None,
        throttle: AdaptiveThrottle | None = None,
        backoff: Backoff | None = None,
        clock: Clock = MONOTONIC,
        headers: Mapping[str, str] | None = None,
        name: str = "client",
    ) -> None:
        timeout = check_optional_number(
            "timeout", timeout, minimum=0, min_open=True, unit="seconds"
        )
        max_queue = check_int("max_queue", max_queue, minimum=0)
        max_attempts = check_int("max_attempts", max_attempts, minimum=1)
        try:
            statuses = frozenset(retry_statuses)
        except TypeError:
            raise ConfigError(
                "retry_statuses",
                f"must be an iterable of HTTP statuses 400-599, got {retry_statuses!r}",
            ) from None
        if any(
            isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599
            for status in statuses
        ):
            raise ConfigError(
                "retry_statuses",
                f"must be HTTP statuses 400-599, got {sorted(statuses, key=repr)!r}",
            )
        algorithm = default_client_limit() if limit is None else make_limit(limit)
        if session is not None:
            if base_url is not None:
                raise ConfigError("base_url", "give base_url to the session you pass, not both")
            connector = session.connector
            pool = connector.limit if connector is not None else 0
            if pool and pool < algorithm.max_limit:
                raise ConfigError(
                    "session",
                    f"its connector's limit ({pool}) is below the limit algorithm's max_limit "
                    f"({algorithm.max_limit}); the pool would become a hidden queue",
                )
        self.limiter = Limiter(
            algorithm,
            name=name,
            clock=clock,
            max_queue=max_queue,
            max_queue_wait=math.inf,  # a call waits as long as its own deadline allows
            learn_patience=False,
        )
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.retry_statuses = statuses
        self.retry_connection_errors = retry_connection_errors
        self.retry_budget = retry_budget or RetryBudget(clock=clock)
        self.throttle = throttle or AdaptiveThrottle(clock=clock)
        self.backoff = backoff or Backoff()
        self.clock = clock
        self._base_url = base_url
        self._session = session
        self._owns_session = session is None
        self._default_headers = dict(headers or {})
        self._backing_off = 0
        self._counts: dict[str, int] = {}
        self._queue_hist = LatencyHistogram()
        self._upstream_hist = LatencyHistogram()
        self._total_hist = LatencyHistogram()

    # ------------------------------------------------------------ lifecycle

    @property
    def session(self) -> aiohttp.ClientSession:
        """The wrapped session (created on first use, inside the running loop)."""
        if self._session is None:
            pool = self.limiter.admission.algorithm.max_limit
            connector = aiohttp.TCPConnector(limit=pool, limit_per_host=pool)
            self._session = aiohttp.ClientSession(
                base_url=self._base_url, connector=connector, timeout=aiohttp.ClientTimeout()
            )
        return self._session

    async def close(self) -> None:
        """Close the session if the client created it."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AdaptiveClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ calls

    async def get(self, url: str, **kwargs: Any) -> Response:
        """``request("GET", url, ...)``."""
        return await self.request("GET", url, **kwargs)

    async def post(self, url: str, **kwargs: Any) -> Response:
        """``request("POST", url, ...)``."""
        return await self.request("POST", url, **kwargs)

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float | _Default | None = _Default.CLIENT,
        priority: Priority | str = Priority.DEFAULT,
        headers: Mapping[str, str] | None = None,
        cost: float | None = None,
        **kwargs: Any,
    ) -> Response:
        """Make one call (with retries); other keyword arguments go to aiohttp.

        ``cost`` (> 0: rows, tokens) is what the call costs: the local limiter judges
        its deadline on its own predicted time (:mod:`loadshed.costmodel`), and it is
        sent as ``X-Request-Cost`` so that a loadshed-protected server does the same.

        Returns the upstream's answer, whatever its status (a 429/503 once retries
        are spent or not allowed). Raises :class:`ClientThrottled` (refused locally),
        :class:`~loadshed.errors.Rejected` (local queue full, or the deadline cannot
        be met), :class:`TimeoutError` (deadline passed) or an
        :class:`aiohttp.ClientError` (connection failed, retries spent).
        """
        budget_s = self.timeout if isinstance(timeout, _Default) else timeout
        if budget_s is not None and not (
            isinstance(budget_s, (int, float)) and budget_s > 0 and math.isfinite(budget_s)
        ):
            raise ConfigError("timeout", f"must be a finite number of seconds > 0, got {budget_s}")
        priority = Priority.parse(priority)
        if cost is not None:
            cost = check_cost(cost)
        started = self.clock.now()
        send_headers = CIMultiDict(self._default_headers)
        if headers:
            send_headers.update(headers)
        if priority is not Priority.DEFAULT:
            send_headers["X-Priority"] = str(priority)
        if cost is not None:
            # Exactly (":g" kept 6 digits: 1234567 went out as 1.23457e+06).
            send_headers["X-Request-Cost"] = str(int(cost)) if cost.is_integer() else repr(cost)
        call = _Call(
            priority=priority,
            deadline=None if budget_s is None else started + budget_s,
            headers=send_headers,
            cost=cost,
        )
        self._count("calls")
        try:
            while True:
                call.attempt += 1
                refused_locally = self._throttled(call)
                if refused_locally is not None:
                    return refused_locally
                token = await self._acquire(call)
                try:
                    last = await self._send(call, token, method, url, kwargs)
                except aiohttp.ClientConnectionError as error:
                    if call.outcome is CallOutcome.TIMEOUT:
                        raise  # a timeout, not retried
                    call.last_error = error
                    if self.retry_connection_errors and await self._retried(call, None):
                        continue
                    call.outcome = CallOutcome.CONNECTION_ERROR
                    raise
                call.last = last
                if last.status in self.retry_statuses:
                    retry_after = parse_retry_after(last.headers.get("Retry-After"))
                    if await self._retried(call, retry_after):
                        continue
                call.outcome = CallOutcome.of_status(last.status)
                return last
        except asyncio.CancelledError:
            call.outcome = CallOutcome.CANCELLED
            raise
        finally:
            self._count(call.outcome.value)
            if call.outcome.answered:
                self._record(call.local_s, call.upstream_s, self.clock.now() - started)

    def _throttled(self, call: _Call) -> Response | None:
        """Let the attempt through the adaptive throttle, or end the call: a first
        attempt refused locally raises :class:`ClientThrottled`; a retry refused
        locally leaves the last failure standing (its answer is returned, its
        connection error raised)."""
        if self.throttle.allow():
            return None
        if call.attempt == 1:
            call.outcome = CallOutcome.THROTTLED
            raise ClientThrottled(self.throttle.reject_probability())
        self._count("retry_throttled")
        if call.last is not None:
            call.outcome = CallOutcome.REFUSED
            return call.last
        call.outcome = CallOutcome.CONNECTION_ERROR
        assert call.last_error is not None
        raise call.last_error

    async def _acquire(self, call: _Call) -> Token:
        """A slot from the local limiter for this attempt (queued up to the deadline)."""
        try:
            token = await self.limiter.acquire(
                priority=call.priority, deadline=call.deadline, cost=call.cost
            )
        except LoadshedError:
            call.outcome = CallOutcome.REJECTED
            raise
        call.local_s += token.queue_wait
        self._count("attempts")
        if call.attempt == 1:  # the budget counts requests that reach the upstream
            self.retry_budget.record_request()
        else:
            self._count("retries")
        return token

    async def _send(
        self, call: _Call, token: Token, method: str, url: str, kwargs: dict[str, Any]
    ) -> Response:
        """One attempt at the upstream, holding ``token``; reports its outcome to the
        limiter and the throttle. Raises on a timeout or a connection error."""
        sent = self.clock.now()
        aiohttp_timeout = aiohttp.ClientTimeout()
        if call.deadline is not None:
            remaining = call.deadline - sent
            if remaining <= 0:
                token.ignored()
                call.outcome = CallOutcome.TIMEOUT
                raise TimeoutError("deadline passed while queued")
            call.headers["X-Request-Timeout"] = f"{remaining:.3f}"
            aiohttp_timeout = aiohttp.ClientTimeout(total=remaining)
        try:
            async with self.session.request(
                method, url, headers=call.headers, timeout=aiohttp_timeout, **kwargs
            ) as answer:
                body = await answer.read()
        except (TimeoutError, asyncio.TimeoutError, aiohttp.ClientConnectionError) as error:
            call.upstream_s += self.clock.now() - sent
            token.dropped()
            self.throttle.record(accepted=False)
            # (checked first: aiohttp's ServerTimeoutError is a connection error too)
            if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
                call.outcome = CallOutcome.TIMEOUT
            raise
        except BaseException:
            token.ignored()
            raise
        call.upstream_s += self.clock.now() - sent
        status = answer.status
        refused = status in REFUSAL_STATUSES
        if status in OVERLOAD_STATUSES:
            token.dropped()
            if refused:
                self._count(f"upstream_{status}")
        elif status >= 500:
            token.ignored()  # a model error says nothing about capacity
        else:
            token.success()
        self.throttle.record(accepted=not refused)
        return Response(
            status=status,
            headers=answer.headers,
            body=body,
            attempts=call.attempt,
            queue_wait_s=call.local_s,
            upstream_s=call.upstream_s,
        )

    async def _retried(self, call: _Call, retry_after: float | None) -> bool:
        """Wait for a retry if one is allowed (attempts, deadline, budget)."""
        waited = await self._may_retry(call.attempt, retry_after, call.deadline)
        if waited is None:
            return False
        call.local_s += waited
        return True

    async def _may_retry(
        self, attempt: int, retry_after: float | None, deadline: float | None
    ) -> float | None:
        """Wait before a retry and return the seconds waited, or None if no retry."""
        if attempt >= self.max_attempts:
            return None
        delay = self.backoff.delay(attempt, retry_after)
        if deadline is not None and self.clock.now() + delay >= deadline:
            self._count("retry_no_time")
            return None
        if not self.retry_budget.try_retry():
            self._count("retry_denied")
            return None
        self._backing_off += 1
        try:
            await asyncio.sleep(delay)
        finally:
            self._backing_off -= 1
        return delay

    # ------------------------------------------------------------ bulk

    @overload
    def map(
        self,
        fn: Callable[[_T], Awaitable[_R]],
        iterable: Iterable[_T] | AsyncIterable[_T],
        *,
        ordered: bool = ...,
        return_exceptions: Literal[False] = ...,
    ) -> BoundedMap[_R]: ...

    @overload
    def map(
        self,
        fn: Callable[[_T], Awaitable[_R]],
        iterable: Iterable[_T] | AsyncIterable[_T],
        *,
        ordered: bool = ...,
        return_exceptions: Literal[True],
    ) -> BoundedMap[_R | BaseException]: ...

    def map(
        self,
        fn: Callable[[_T], Awaitable[_R]],
        iterable: Iterable[_T] | AsyncIterable[_T],
        *,
        ordered: bool = False,
        return_exceptions: bool = False,
    ) -> BoundedMap[_R] | BoundedMap[_R | BaseException]:
        """``bounded_map`` whose concurrency follows this client's limit.

        ``fn`` makes the client's calls for one input; at most ``limit`` inputs are
        in progress (plus those waiting in retry backoff), so nothing piles up in the
        local queue and memory stays O(limit) for any number of inputs.
        """
        if return_exceptions:
            return bounded_map(fn, iterable, _LimitView(self), ordered, return_exceptions=True)
        return bounded_map(fn, iterable, _LimitView(self), ordered)

    # ------------------------------------------------------------ statistics

    def _count(self, key: str) -> None:
        self._counts[key] = self._counts.get(key, 0) + 1

    def _record(self, local_s: float, upstream_s: float, total_s: float) -> None:
        self._queue_hist.record(local_s)
        self._upstream_hist.record(upstream_s)
        self._total_hist.record(total_s)

    def stats(self) -> ClientStats:
        """Counts, local-versus-upstream time percentiles, and the limiter's state."""
        snapshot = self.limiter.snapshot()
        requests, accepts = self.throttle.totals()
        budget_requests, budget_retries = self.retry_budget.totals()
        return ClientStats(
            calls=self._counts.get("calls", 0),
            counts=dict(self._counts),
            queue_wait=Latency.of(self._queue_hist),
            upstream=Latency.of(self._upstream_hist),
            total=Latency.of(self._total_hist),
            limit=snapshot.limit,
            inflight=snapshot.inflight,
            queue_length=snapshot.queue_length,
            throttle_probability=self.throttle.reject_probability(),
            algorithm=snapshot.algorithm,
            extra={
                "throttle_window_requests": requests,
                "throttle_window_accepts": accepts,
                "budget_window_requests": budget_requests,
                "budget_window_retries": budget_retries,
            },
        )

    def reset_stats(self) -> None:
        """Forget counts and histograms (e.g. after a warm-up)."""
        self._counts.clear()
        for histogram in (self._queue_hist, self._upstream_hist, self._total_hist):
            histogram.reset()
