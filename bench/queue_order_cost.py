"""Cost of the queue's order with a deep queue: one release (a grant from the queue) and
one queued arrival with a deadline, per discipline.

    .venv/bin/python bench/queue_order_cost.py [--queued 1000] [--rounds 20000] [--repeat 3]

The admission core (``Fixed(4)``, the cost model fitted at 1 ms per unit of cost) holds
``--queued`` requests of costs log-uniform over 1..100 (seeded) while each round
releases one running request, which grants one from the queue, and queues one more
(with a deadline, so that its predicted wait is computed): the queue stays full.
Reported: the best of ``--repeat`` runs in microseconds per round for ``fifo``,
``shortest`` (its index, :mod:`loadshed.shortest`) and ``shortest, scanned``: the
same decisions taken by scanning the whole queue in Python, the reference the index
replaces (and that ``tests/test_shortest.py`` checks it against).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time

from loadshed.admission import _INF, _PRIORITIES, Admission, Ticket, Token, _State
from loadshed.clock import VirtualClock
from loadshed.errors import Priority
from loadshed.limits.fixed import Fixed


class Scanned(Admission):
    """The ``shortest`` discipline answered by scans of the queue."""

    def _work_before(self, priority: Priority, predicted: float) -> float:
        work = 0.0
        for level, queue in enumerate(self._queues[: priority + 1]):
            for ticket in queue:
                if ticket._state is _State.QUEUED:
                    seconds = self._predicted(ticket.cost)
                    if level < priority or seconds <= predicted:
                        work += seconds
        return work

    def _next_shortest(self) -> Ticket | None:
        for level, queue in enumerate(self._queues):
            best, best_seconds = None, _INF
            for ticket in queue:
                if ticket._state is _State.QUEUED:
                    seconds = self._predicted(ticket.cost)
                    if seconds < best_seconds:
                        best, best_seconds = ticket, seconds
            if best is None:
                continue
            if not self._can_admit(_PRIORITIES[level], best.cost):
                return None
            queue.remove(best)
            return best
        return None


def run(kind: type[Admission], discipline: str, queued: int, rounds: int) -> float:
    """Seconds per round (one release and one queued arrival)."""
    clock = VirtualClock()
    admission = kind(
        Fixed(4), clock, discipline=discipline, max_queue=queued, max_queue_wait=math.inf
    )
    for cost in range(1, 41):  # fit the cost model: 1 ms per unit
        token = admission.try_acquire(cost=cost)
        clock.advance(0.001 * cost)
        token.success()
    rng = random.Random(1)
    granted: list[Token] = []
    running = [admission.try_acquire(cost=1) for _ in range(4)]

    def cost() -> float:
        return math.exp(rng.uniform(0.0, math.log(100.0)))

    for _ in range(queued):
        admission.submit(cost=cost(), on_grant=granted.append, on_reject=lambda _: None)
    start = time.perf_counter()
    for index in range(rounds):
        running[index % 4].success()
        running[index % 4] = granted.pop()
        admission.submit(
            cost=cost(),
            deadline=clock.now() + 1e6,
            on_grant=granted.append,
            on_reject=lambda _: None,
        )
    elapsed = time.perf_counter() - start
    assert admission.queue_length == queued
    return elapsed / rounds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = (
        ("fifo", Admission, "fifo", args.rounds),
        ("shortest", Admission, "shortest", args.rounds),
        # The scan is slow: fewer rounds, the same per-round figure.
        ("shortest, scanned", Scanned, "shortest", max(100, args.rounds // 50)),
    )
    command = "python bench/queue_order_cost.py " + " ".join(sys.argv[1:])
    print(f"`{command.strip()}`\n")
    print(f"{args.queued} queued; best of {args.repeat} runs.\n")
    print("| discipline | us per release + queued arrival |")
    print("| --- | ---: |")
    for label, kind, discipline, rounds in rows:
        best = min(run(kind, discipline, args.queued, rounds) for _ in range(args.repeat))
        print(f"| {label} | {best * 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
