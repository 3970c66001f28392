"""The knee of latency against in-flight level: where a queue starts.

A request admitted with ``k`` requests in flight (itself included) at a server of
``W`` workers (first come, first served) starts at once while ``k <= W`` and takes
the mean service time ``S``; above, it first waits for ``k - W`` completions, at
``W / S`` per second. Its mean latency is

    R(k) = S x max(1, k / W)

flat up to the knee, then rising along a line through the origin. Fitting this
model to the mean latency of every level at once (weighted by the requests behind
each mean) finds ``S`` from all the data, the queued levels included, where a walk
up from the lowest level lets a rise of ``S / W`` per level (3 % on 32 workers,
well inside the noise of exponential service) pass level after level into the
"unqueued" mean. Pure arithmetic: no clock, no state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Knee", "fit_knee"]


@dataclass(frozen=True)
class Knee:
    """A fit of ``R(k) = service x max(1, k / workers)`` to per-level mean latencies."""

    service: float  # the mean latency without a queue (S)
    workers: int | None  # the knee (W), or None when the levels show no significant rise
    weight: float  # requests at levels up to the knee (all of them without a knee)


def fit_knee(
    levels: Iterable[tuple[int, float, float]], sd: float, z: float = 3.0, lowest: int = 0
) -> Knee | None:
    """Least-squares fit of the knee to ``(level, requests, latency sum)`` triples.

    Each level's mean counts with the weight of its requests. A knee is kept only
    when it explains the means better than a flat line by ``z`` standard errors of
    the latency (``sd``: one request's standard deviation): otherwise the levels are
    flat (no queue seen) and the service time is their pooled mean, unless the
    best knee is at ``lowest`` or over it (workers known to exist, e.g. from the
    order of completions): then its service time, still with no knee reported (a
    flat mean over levels that did queue reads the service high). Every integer
    knee from the lowest level up is tried; the sums make each try O(1).
    Returns None without data.
    """
    rows = sorted((k, n, total) for k, n, total in levels if n > 0 and k > 0)
    if not rows:
        return None
    count = sum(n for _, n, _ in rows)
    total = sum(t for _, _, t in rows)
    flat_gain = total * total / count  # sum of n x fitted^2 for a flat line
    # Above the knee: sums of n x m x k (= total x k) and n x k^2 over the levels above.
    above_mk = sum(t * k for k, _, t in rows)
    above_kk = sum(n * k * k for k, n, _ in rows)
    below_n = below_t = 0.0
    best_gain, best = flat_gain, Knee(total / count, None, count)
    for i, (k, n, t) in enumerate(rows[:-1]):
        below_n += n
        below_t += t
        above_mk -= t * k
        above_kk -= n * k * k
        # Levels <= W flat, levels > W on the line: W anywhere from this level up to
        # the next one's (exclusive) keeps the same split.
        for w in range(k, rows[i + 1][0]):
            numerator = below_t + above_mk / w
            denominator = below_n + above_kk / (w * w)
            gain = numerator * numerator / denominator
            if gain > best_gain:
                best_gain, best = gain, Knee(numerator / denominator, w, below_n)
    if best.workers is not None and best_gain - flat_gain < (z * sd) ** 2:
        if lowest > 0 and best.workers >= lowest and math.isfinite(best.service):
            return Knee(best.service, None, count)
        return Knee(total / count, None, count)
    if not math.isfinite(best.service):
        return None
    return best
