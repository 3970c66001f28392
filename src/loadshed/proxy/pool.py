"""Upstreams: one :class:`Limiter` each, least-outstanding choice, down marking and probes.

Each upstream finds its own capacity: its limiter learns from its own samples, so a
replica with twice the workers ends up with about twice the limit. A request goes
to the live upstream with the fewest outstanding requests (in flight plus queued)
*per unit of limit*, which is least-outstanding-requests balancing weighted by
what each replica has shown it can hold.

``fail_threshold`` consecutive connection failures (refused, reset, connect
timeout) mark an upstream down; it then gets no traffic and is probed with a TCP
connect every ``probe_interval`` until one succeeds. Any answer from it, even a
503, counts as alive: overload is the limiter's business, not a health problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from loadshed.clock import MONOTONIC, Clock
from loadshed.limiter import Limiter
from loadshed.proxy.config import UpstreamURL

__all__ = ["Upstream", "UpstreamPool"]

logger = logging.getLogger("loadshed.proxy")


class Upstream:
    """One configured upstream: its URL, its limiter and its health."""

    def __init__(self, url: UpstreamURL, limiter: Limiter) -> None:
        self.url = url
        self.name = str(url)
        self.limiter = limiter
        self.up = True
        self.consecutive_failures = 0
        self.down_since: float | None = None
        self.times_marked_down = 0

    def load(self) -> float:
        """Outstanding requests per unit of limit (lower is better)."""
        limiter = self.limiter
        return (limiter.inflight + limiter.queue_length) / max(1, limiter.limit)


class UpstreamPool:
    """The configured upstreams; picks one per request and tracks their health."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        *,
        fail_threshold: int = 3,
        probe_interval: float = 1.0,
        connect_timeout: float = 2.0,
        clock: Clock = MONOTONIC,
    ) -> None:
        if not upstreams:
            raise ValueError("an upstream pool needs at least one upstream")
        self.upstreams = list(upstreams)
        self.fail_threshold = fail_threshold
        self.probe_interval = probe_interval
        self.connect_timeout = connect_timeout
        self.clock = clock
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._next = 0  # rotates ties so equal upstreams share the load

    def choose(self) -> Upstream | None:
        """The live upstream with the least outstanding load, or None if all are down."""
        upstreams = self.upstreams
        if len(upstreams) == 1:
            only = upstreams[0]
            return only if only.up else None
        count = len(upstreams)
        start = self._next
        self._next = (start + 1) % count
        best: Upstream | None = None
        best_load = float("inf")
        for offset in range(count):
            upstream = upstreams[(start + offset) % count]
            if not upstream.up:
                continue
            load = upstream.load()
            if load < best_load:
                best, best_load = upstream, load
        return best

    def connection_failed(self, upstream: Upstream) -> None:
        """A connection to ``upstream`` was refused, reset or timed out."""
        upstream.consecutive_failures += 1
        if upstream.up and upstream.consecutive_failures >= self.fail_threshold:
            upstream.up = False
            upstream.down_since = self.clock.now()
            upstream.times_marked_down += 1
            logger.warning(
                "upstream %s marked down after %d connection failures",
                upstream.name,
                upstream.consecutive_failures,
            )
            self._start_probe(upstream)

    def answered(self, upstream: Upstream) -> None:
        """``upstream`` answered (any status): it is alive."""
        if upstream.consecutive_failures:
            upstream.consecutive_failures = 0

    def _start_probe(self, upstream: Upstream) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside a loop (unit use): stays down until marked up
            return
        task = self._probes.get(upstream.name)
        if task is None or task.done():
            self._probes[upstream.name] = loop.create_task(self._probe(upstream))

    async def _probe(self, upstream: Upstream) -> None:
        """TCP-connect to a down upstream every probe_interval until it accepts."""
        while not upstream.up:
            await asyncio.sleep(self.probe_interval)
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(upstream.url.host, upstream.url.port),
                    self.connect_timeout,
                )
            except (OSError, asyncio.TimeoutError):
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            upstream.up = True
            upstream.consecutive_failures = 0
            upstream.down_since = None
            logger.warning("upstream %s is back up", upstream.name)

    async def close(self) -> None:
        """Stop the probes."""
        tasks = [task for task in self._probes.values() if not task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._probes.clear()
