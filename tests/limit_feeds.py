"""Crafted sample streams for limit algorithms, shared by the limit tests."""

from __future__ import annotations

import math
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
