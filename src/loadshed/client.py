"""``AdaptiveClient``: an aiohttp client for calling an inference endpoint in bulk
without overloading it, and ``bounded_map`` to feed it.

    async with AdaptiveClient("http://model:8000") as client:
        async for response in client.map(lambda doc: client.post("/predict", json=doc), docs):
            ...
        print(client.stats())

What it does for each call:

1. **Local throttling** (Google SRE): while the upstream refuses more than half of
   what it is sent, refuse attempts locally (:class:`ClientThrottled`) with
   probability ``max(0, (requests - 2 accepts) / (requests + 1))`` over a window.
2. **Adaptive concurrency**: a :class:`~loadshed.limiter.Limiter` (default: AIMD,
   halving on overload, once per window of calls) holds calls beyond the current
   limit in a local queue. 429, 502, 503, 504,
   timeouts and connection errors are *dropped* samples (overload: the limit
   shrinks); other answers are successes (their latency is a capacity sample).
3. **The connection pool** is sized from the limit algorithm's ``max_limit``, so
   the limiter, not the pool, decides how many calls are in flight (a pool smaller
   than the limit would be a hidden queue, counted as upstream time).
4. **Deadline**: each call has one (``timeout``, 30 s by default) covering queueing,
   attempts and backoff; the time left is sent as ``X-Request-Timeout`` so the
   upstream can drop work nobody will wait for.
5. **Retries** on 429/503 and connection errors, only within a retry budget (10 % of
   requests), after a jittered exponential backoff or the upstream's
   ``Retry-After``, and only if the deadline leaves time for them.

``client.stats()`` separates time spent locally (limiter queue and backoff) from
time at the upstream, as HDR percentiles, and counts outcomes.
"""

from __future__ import annotations

import asyncio
import enum
import json
import math
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import aiohttp
from hdrh.histogram import HdrHistogram
from multidict import CIMultiDict, CIMultiDictProxy

from loadshed.bounded import BoundedMap, bounded_map
from loadshed.checks import check_int, check_optional_number
from loadshed.clock import MONOTONIC, Clock
from loadshed.errors import REFUSAL_STATUSES, ConfigError, LoadshedError, Priority
from loadshed.histogram import LatencyHistogram
from loadshed.limiter import Limiter
from loadshed.limits import AIMD, Windowed, make_limit
from loadshed.limits.base import LimitAlgorithm, Sample
from loadshed.retry import Backoff, RetryBudget, parse_retry_after
from loadshed.throttle import AdaptiveThrottle

__all__ = [
    "AdaptiveClient",
    "ClientStats",
    "ClientThrottled",
    "Latency",
    "Response",
    "UpstreamError",
    "bounded_map",
    "default_client_limit",
]

_T = TypeVar("_T")
_R = TypeVar("_R")

OVERLOAD_STATUSES = REFUSAL_STATUSES | {502, 504}
"""Answers that mean the upstream (or a gateway before it) is overloaded: dropped samples.
A refusal (:data:`~loadshed.errors.REFUSAL_STATUSES`) is safe to retry, and not an
*accept* for the adaptive throttle."""


class _Default(enum.Enum):
    CLIENT = "the client's default"


class ClientThrottled(LoadshedError):
    """Refused locally by adaptive throttling: the upstream is refusing most calls."""

    def __init__(self, probability: float) -> None:
        super().__init__(
            f"throttled locally: the upstream refuses most calls "
            f"(local reject probability {probability:.2f})"
        )
        self.probability = probability


class UpstreamError(LoadshedError):
    """Raised by :meth:`Response.raise_for_status` for an answer >= 400."""

    def __init__(self, response: Response) -> None:
        super().__init__(
            f"upstream answered {response.status} after {response.attempts} attempt(s)"
        )
        self.response = response
        self.status = response.status


@dataclass(frozen=True)
class Response:
    """An upstream's answer, read in full while the call held its slot."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    attempts: int
    """Attempts made (1 + retries)."""
    queue_wait_s: float
    """Time spent locally: waiting in the limiter's queue and in retry backoff."""
    upstream_s: float
    """Time at the upstream, over all attempts."""

    @property
    def ok(self) -> bool:
        """True for 1xx-3xx."""
        return self.status < 400

    def text(self, encoding: str = "utf-8") -> str:
        """The body decoded as text."""
        return self.body.decode(encoding)

    def json(self, loads: Callable[[bytes], Any] = json.loads) -> Any:
        """The body parsed as JSON."""
        return loads(self.body)

    def raise_for_status(self) -> None:
        """Raise :class:`UpstreamError` if the status is 400 or more."""
        if self.status >= 400:
            raise UpstreamError(self)


@dataclass(frozen=True)
class Latency:
    """Percentiles of one kind of time, in seconds (HDR histogram, 3 significant digits)."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    p999: float
    max: float

    @classmethod
    def of(cls, histogram: LatencyHistogram | HdrHistogram) -> Latency:
        """Summarise ``histogram`` (an ``hdrh`` one holds microseconds)."""
        if isinstance(histogram, HdrHistogram):
            histogram = LatencyHistogram(histogram)
        summary = histogram.summary()
        return cls(
            count=int(summary["count"]),
            mean=float(summary["mean"]),
            p50=float(summary["p50"]),
            p90=float(summary["p90"]),
            p99=float(summary["p99"]),
            p999=float(summary["p999"]),
            max=float(summary["max"]),
        )


@dataclass(frozen=True)
class ClientStats:
    """What :meth:`AdaptiveClient.stats` reports.

    ``counts`` holds, per call, its final outcome (``ok``, ``http_4xx``, ``http_5xx``,
    ``refused`` for a 429/503 that was not retried, ``throttled``, ``rejected`` by
    the local limiter, ``timeout``, ``connection_error``, ``error``, ``cancelled``)
    and, per attempt, ``attempts`` and ``retries`` (sent), ``retry_denied`` (by the
    budget), ``retry_throttled``, ``retry_no_time`` (the deadline was too close),
    ``upstream_429``, ``upstream_503``. ``queue_wait`` is time spent locally
    (limiter queue and backoff), ``upstream`` time at the upstream, ``total`` both;
    all three are recorded for calls that got an answer.
    """

    calls: int
    counts: dict[str, int]
    queue_wait: Latency
    upstream: Latency
    total: Latency
    limit: int
    inflight: int
    queue_length: int
    throttle_probability: float
    algorithm: str
    extra: dict[str, float] = field(default_factory=dict)


def default_client_limit() -> Windowed:
    """The client's default limit: AIMD (initial 4, min 1, max 128) that halves on an
    overload sign, updated once per window of at least 8 calls (and 10 ms).

    Loss-based, because a client learns of overload from the upstream's answers
    (429/503, timeouts, connection errors). Two changes from per-call AIMD with
    Netflix's x0.9, each measured with ``bench/e3_remote_inference.py`` against an
    upstream that queues then refuses: per call, x0.9 is back at the queue's edge
    within a few calls and is refused about one call in ten, more than the 10 %
    retry budget absorbs; and a burst of refusals, one halving each, collapses the
    limit to 1 while calls are waiting. Halving once per window keeps the limit
    above the upstream's slots and is refused about one call in a hundred.
    """
    return Windowed(AIMD(backoff_ratio=0.5), window=0.01, min_samples=8, close_on_drop=True)


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
        **kwargs: Any,
    ) -> Response:
        """Make one call (with retries); other keyword arguments go to aiohttp.

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
        started = self.clock.now()
        deadline = None if budget_s is None else started + budget_s
        send_headers = CIMultiDict(self._default_headers)
        if headers:
            send_headers.update(headers)
        if priority is not Priority.DEFAULT:
            send_headers["X-Priority"] = str(priority)
        self._count("calls")
        local_s = 0.0
        upstream_s = 0.0
        attempt = 0
        last: Response | None = None
        last_error: aiohttp.ClientConnectionError | None = None
        outcome = "error"
        try:
            while True:
                attempt += 1
                if not self.throttle.allow():
                    if attempt > 1:  # a retry refused locally: the last failure stands
                        self._count("retry_throttled")
                        if last is not None:
                            outcome = "refused"
                            return last
                        outcome = "connection_error"
                        assert last_error is not None
                        raise last_error
                    outcome = "throttled"
                    raise ClientThrottled(self.throttle.reject_probability())
                try:
                    token = await self.limiter.acquire(priority=priority, deadline=deadline)
                except LoadshedError:
                    outcome = "rejected"
                    raise
                local_s += token.queue_wait
                self._count("attempts")
                if attempt == 1:  # the budget counts requests that reach the upstream
                    self.retry_budget.record_request()
                else:
                    self._count("retries")
                sent = self.clock.now()
                aiohttp_timeout = aiohttp.ClientTimeout()
                if deadline is not None:
                    remaining = deadline - sent
                    if remaining <= 0:
                        token.ignored()
                        outcome = "timeout"
                        raise TimeoutError("deadline passed while queued")
                    send_headers["X-Request-Timeout"] = f"{remaining:.3f}"
                    aiohttp_timeout = aiohttp.ClientTimeout(total=remaining)
                try:
                    async with self.session.request(
                        method, url, headers=send_headers, timeout=aiohttp_timeout, **kwargs
                    ) as answer:
                        body = await answer.read()
                except (TimeoutError, asyncio.TimeoutError):
                    upstream_s += self.clock.now() - sent
                    token.dropped()
                    self.throttle.record(accepted=False)
                    outcome = "timeout"
                    raise
                except aiohttp.ClientConnectionError as error:
                    upstream_s += self.clock.now() - sent
                    token.dropped()
                    self.throttle.record(accepted=False)
                    last_error = error
                    if self.retry_connection_errors:
                        waited = await self._may_retry(attempt, None, deadline)
                        if waited is not None:
                            local_s += waited
                            continue
                    outcome = "connection_error"
                    raise
                except BaseException:
                    token.ignored()
                    raise
                upstream_s += self.clock.now() - sent
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
                last = Response(
                    status=status,
                    headers=answer.headers,
                    body=body,
                    attempts=attempt,
                    queue_wait_s=local_s,
                    upstream_s=upstream_s,
                )
                if status in self.retry_statuses:
                    retry_after = parse_retry_after(answer.headers.get("Retry-After"))
                    waited = await self._may_retry(attempt, retry_after, deadline)
                    if waited is not None:
                        local_s += waited
                        continue
                outcome = (
                    "ok"
                    if status < 400
                    else "refused"
                    if refused
                    else "http_4xx"
                    if status < 500
                    else "http_5xx"
                )
                return last
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._count(outcome)
            if outcome in ("ok", "refused", "http_4xx", "http_5xx"):
                self._record(local_s, upstream_s, self.clock.now() - started)

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
