"""The ``shortest`` discipline's index (:mod:`loadshed.shortest`) against a plain scan
of the queue, and its memory with a request starved at the head, in virtual time."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

from loadshed.admission import Admission, Ticket, Token
from loadshed.clock import VirtualClock
from loadshed.errors import Priority, Rejected
from loadshed.limits.fixed import Fixed

# The reference: the discipline answered by scans of the queue (bench/queue_order_cost.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from queue_order_cost import Scanned


def _trace(kind: type[Admission], seed: int) -> list[tuple[object, ...]]:
    """Every decision over a seeded mix of arrivals (costed or not, three classes, with
    deadlines or not), releases after a time that grows with the cost, cancellations
    and expiries."""
    rng = random.Random(seed)
    clock = VirtualClock()
    adm = kind(Fixed(3), clock, discipline="shortest", max_queue=50)
    out: list[tuple[object, ...]] = []
    running: list[Token] = []
    waiting: list[Ticket] = []

    def granted(token: Token, index: int) -> None:
        out.append(("granted", index))
        running.append(token)

    for index in range(1500):
        draw = rng.random()
        if draw < 0.45:
            cost = None if rng.random() < 0.2 else math.exp(rng.uniform(0, math.log(100)))
            deadline = clock.now() + rng.uniform(0.05, 2.0) if rng.random() < 0.7 else None
            try:
                result = adm.submit(
                    priority=rng.choice(list(Priority)),
                    deadline=deadline,
                    cost=cost,
                    on_grant=lambda token, index=index: granted(token, index),
                    on_reject=lambda error, index=index: out.append(
                        ("evicted", index, error.reason)
                    ),
                )
            except Rejected as error:
                out.append(("refused", index, error.reason))
                continue
            if isinstance(result, Token):
                running.append(result)
                out.append(("admitted", index))
            else:
                waiting.append(result)
                out.append(("queued", index))
        elif draw < 0.8 and running:
            token = running.pop(rng.randrange(len(running)))
            clock.advance(0.001 * (1 + (token.cost or 20)) * rng.uniform(0.8, 1.2))
            token.success()
        elif draw < 0.85 and waiting:
            adm.cancel(waiting.pop(rng.randrange(len(waiting))))
        else:
            clock.advance(rng.uniform(0, 0.05))
            adm.expire()
    return out


def test_the_index_decides_as_a_scan_of_the_queue_would() -> None:
    for seed in range(30):
        assert _trace(Admission, seed) == _trace(Scanned, seed), seed


def test_a_request_starved_at_the_head_keeps_no_granted_ones_in_memory() -> None:
    # A request of cost 1,000 that waits without a bound while smaller ones keep coming
    # and are granted: the arrival-order deques hold at most about twice the queue.
    clock = VirtualClock()
    adm = Admission(Fixed(1), clock, discipline="shortest", max_queue_wait=math.inf)
    for cost in range(1, 41):
        token = adm.try_acquire(cost=cost)
        clock.advance(0.001 * cost)
        token.success()
    granted: list[Token] = []
    busy = adm.try_acquire(cost=1)
    assert isinstance(busy, Token)
    adm.submit(cost=1000, on_grant=granted.append, on_reject=lambda _: None)
    for _ in range(5000):
        adm.submit(cost=1, on_grant=granted.append, on_reject=lambda _: None)
        busy.success()
        busy = granted.pop()
        assert busy.cost == 1
    assert adm.queue_length == 1  # the big one, starved
    assert sum(len(queue) for queue in adm._queues) <= 2 * adm.queue_length + 64
