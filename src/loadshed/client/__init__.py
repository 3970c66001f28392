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

from loadshed.bounded import bounded_map
from loadshed.client.adaptive import AdaptiveClient
from loadshed.client.errors import ClientThrottled
from loadshed.client.policy import OVERLOAD_STATUSES, CallOutcome, default_client_limit
from loadshed.client.response import Response, UpstreamError
from loadshed.client.stats import ClientStats, Latency

__all__ = [
    "OVERLOAD_STATUSES",
    "AdaptiveClient",
    "CallOutcome",
    "ClientStats",
    "ClientThrottled",
    "Latency",
    "Response",
    "UpstreamError",
    "bounded_map",
    "default_client_limit",
]
