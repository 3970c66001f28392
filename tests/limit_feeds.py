"""Crafted sample streams for limit algorithms, shared by the limit tests."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable

from loadshed.limits.base import Sample
from loadshed.limits.little import Little


def feed_fifo_origin(
    little: Little,
    *,
    workers: int,
    service: float,
    seconds: float,
    dispatch: float = 0.0,
    settle: bool = False,
    timeout: float = math.inf,
    after_update: Callable[[str], None] | None = None,
) -> float:
    """Drive ``little`` with a saturated FIFO origin of ``workers`` constant-time workers.

    Demand always exceeds the limit (queued > 0), so each freed slot is refilled at
    once; latency is the wait for a worker plus the service time. A request reaches
    the origin ``dispatch`` seconds after its admission (a server's own overhead).
    ``settle``: go on past ``seconds`` until ``little`` cruises (not mid-probe).
    ``timeout``: a request that took longer is a drop (its client left; the worker
    still served it). ``after_update`` is called after each sample with the state
    ``little`` was in before it. Returns the time of the last sample.
    """
    now = 0.0
    worker_free = [0.0] * workers
    inflight: list[tuple[float, float, int]] = []  # (completion, admitted, inflight at admit)
    while now < seconds or (settle and little.state != "cruise"):
        while len(inflight) < little.limit:
            start = max(now + dispatch, min(worker_free))
            slot = worker_free.index(min(worker_free))
            worker_free[slot] = start + service
            inflight.append((start + service, now, len(inflight) + 1))
        inflight.sort()
        done, admitted, level = inflight.pop(0)
        now = done
        before = little.state
        rtt = done - admitted
        little.update(Sample(rtt=rtt, inflight=level, dropped=rtt > timeout, now=now, queued=5))
        if after_update is not None:
            after_update(before)
    return now


def varied_fifo_limits(
    little: Little,
    *,
    workers: int,
    seed: int,
    completions: int,
    batch: int = 1,
    sigma: float | None = None,
) -> list[int]:
    """Drive ``little`` with a saturated origin of ``workers`` workers serving in the
    order admitted, exponential service of 200 ms (seeded; with ``sigma``, log-normal
    of that sigma and mean 200 ms), and return its limit after each completion.
    ``batch`` > 1: one worker that serves up to ``batch`` waiting requests at once and
    ends them together, in the order admitted (a batching model server); ``workers``
    is then ignored."""
    rng = random.Random(seed)

    def service() -> float:
        if sigma is None:
            return rng.expovariate(1 / 0.2)
        return 0.2 * math.exp(rng.gauss(-sigma * sigma / 2, sigma))

    worker_free = [0.0] * (1 if batch > 1 else workers)
    inflight: list[tuple[float, int, float, int]] = []  # (end, order, admitted, level)
    waiting: list[tuple[int, float, int]] = []  # a batching worker's queue
    order = 0
    limits: list[int] = []
    now = 0.0
    while len(limits) < completions:
        while len(inflight) + len(waiting) < little.limit:
            order += 1
            level = len(inflight) + len(waiting) + 1
            if batch > 1:
                waiting.append((order, now, level))
                continue
            start = max(now, min(worker_free))
            worker = worker_free.index(min(worker_free))
            worker_free[worker] = start + service()
            heapq.heappush(inflight, (worker_free[worker], order, now, level))
        if batch > 1 and waiting and worker_free[0] <= now:
            end = now + service()
            worker_free[0] = end
            for request in waiting[:batch]:
                heapq.heappush(inflight, (end, *request))
            del waiting[:batch]
        if not inflight:
            now = worker_free[0]
            continue
        end, _, admitted, level = heapq.heappop(inflight)
        now = end
        little.update(Sample(rtt=end - admitted, inflight=level, dropped=False, now=now, queued=5))
        limits.append(little.limit)
        while batch > 1 and inflight and inflight[0][0] == end:
            # The rest of the batch ends at the same instant, before any admission.
            _, _, admitted, level = heapq.heappop(inflight)
            little.update(Sample(rtt=end - admitted, inflight=level, dropped=False, now=now))
            limits.append(little.limit)
    return limits[:completions]
