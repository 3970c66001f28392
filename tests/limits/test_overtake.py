"""The overtake edge (loadshed.limits.overtake): the workers of a server that serves in
order, read from the order requests end. Virtual time, seeded: deterministic."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable

import pytest

from loadshed.limits.overtake import OvertakeEdge


def drive(
    edge: OvertakeEdge,
    *,
    workers: int,
    inflight: int,
    requests: int,
    service: Callable[[random.Random], float],
    in_order: bool = True,
    seed: int = 1,
    start: float = 0.0,
    count: bool = True,
) -> float:
    """Keep ``inflight`` requests at a server of ``workers`` (a new one admitted as each
    ends) for ``requests`` completions; ``in_order``: first come, first served, else
    a random waiting request gets the next free worker; ``count``: passed to
    ``record``. Returns the time of the last."""
    rng = random.Random(seed)
    now = start
    waiting: list[tuple[float, int]] = []  # (admitted, level)
    running: list[tuple[float, float, int]] = []  # (ends, admitted, level)
    ended = 0

    def admit(level: int) -> None:
        waiting.append((now, level))

    def dispatch() -> None:
        while waiting and len(running) < workers:
            index = 0 if in_order else rng.randrange(len(waiting))
            admitted, level = waiting.pop(index)
            heapq.heappush(running, (now + service(rng), admitted, level))

    for level in range(1, inflight + 1):
        admit(level)
    dispatch()
    while ended < requests:
        ends, admitted, level = heapq.heappop(running)
        now = ends
        edge.record(now, now - admitted, level, dropped=False, count=count)
        ended += 1
        admit(inflight)  # refilled at once: the new one finds the others in flight
        dispatch()
    return now


def exponential(mean: float) -> Callable[[random.Random], float]:
    return lambda rng: rng.expovariate(1 / mean)


@pytest.mark.parametrize("workers", [4, 8, 32])
def test_the_edge_is_the_workers_of_a_server_that_serves_in_order(workers: int) -> None:
    edge = OvertakeEdge()
    drive(
        edge,
        workers=workers,
        inflight=workers + 8,
        requests=100 * workers,
        service=exponential(0.1),
    )
    assert edge.workers == workers
    assert edge.at_least <= workers  # a lower bound, whatever the requests did


def test_below_the_workers_the_lower_bound_follows_the_limit() -> None:
    # 6 in flight at 16 workers: none waits; requests overtake up to 5 others.
    edge = OvertakeEdge()
    drive(edge, workers=16, inflight=6, requests=2000, service=exponential(0.1))
    assert edge.workers is None  # nobody was admitted over 6: nothing bounds from above
    assert edge.at_least == 6


def test_constant_service_shows_no_edge() -> None:
    # Nobody overtakes anybody: the order says nothing about the workers.
    edge = OvertakeEdge()
    drive(edge, workers=8, inflight=16, requests=2000, service=lambda rng: 0.1)
    assert edge.workers is None


def test_a_server_that_does_not_serve_in_order_shows_no_edge_under_the_limit() -> None:
    # A random waiting request gets the next worker: later ones overtake waiting ones,
    # so the histogram runs up to the limit, not the workers.
    edge = OvertakeEdge()
    drive(
        edge,
        workers=8,
        inflight=24,
        requests=4000,
        service=exponential(0.1),
        in_order=False,
    )
    assert edge.workers is None or edge.workers >= 24


def test_more_workers_end_the_edge_and_the_new_one_is_found() -> None:
    edge = OvertakeEdge()
    now = drive(edge, workers=8, inflight=12, requests=2000, service=exponential(0.1))
    assert edge.workers == 8
    drive(
        edge,
        workers=16,
        inflight=24,
        requests=3000,
        service=exponential(0.1),
        seed=2,
        start=now,
    )
    assert edge.workers == 16


def test_clear_forgets_the_histogram() -> None:
    edge = OvertakeEdge()
    drive(edge, workers=8, inflight=12, requests=2000, service=exponential(0.1))
    assert edge.workers == 8
    edge.clear()
    assert edge.workers is None
    assert edge.at_least == 0


def test_a_dropped_request_never_counts_itself() -> None:
    edge = OvertakeEdge()
    edge.record(-1.0, 0.5, 1, dropped=False)  # history from before
    # Ten admitted in turn; the last two time out first: as successes they would have
    # overtaken 9 and 8 others (a lower bound of 9 workers).
    admitted = [i * 1e-3 for i in range(10)]
    edge.record(0.5, 0.5 - admitted[9], 10, dropped=True)
    edge.record(0.6, 0.6 - admitted[8], 9, dropped=True)
    for level in range(1, 9):  # the others end in the order they came
        now = 1.0 + level * 1e-3
        edge.record(now, now - admitted[level - 1], level, dropped=False)
    assert edge.at_least == 1
    assert not edge.overtook  # timed out first, they never counted as overtaking


@pytest.mark.parametrize("count", [True, False])
def test_overtook_tells_one_worker_from_several_whether_counting_or_not(count: bool) -> None:
    # One worker serving in order: nobody overtakes, whatever the spread.
    one = OvertakeEdge()
    drive(one, workers=1, inflight=4, requests=500, service=exponential(0.1), count=count)
    assert not one.overtook
    two = OvertakeEdge()
    drive(two, workers=2, inflight=4, requests=50, service=exponential(0.1), count=count)
    assert two.overtook
    two.clear()
    assert two.overtook  # kept: it says what the server has shown, not the histogram


def test_the_first_release_of_all_overtakes_those_admitted_before_it() -> None:
    edge = OvertakeEdge()
    edge.record(0.3, 0.3, 2, dropped=False, count=False)  # admitted second, ended first
    assert edge.overtook
    alone = OvertakeEdge()
    alone.record(0.3, 0.3, 1, dropped=False, count=False)
    assert not alone.overtook


def test_at_least_stays_under_the_level_in_flight_only_at_a_server_that_serves_in_order() -> None:
    # 2 workers behind 6 requests in flight: in order, the latest overtook at most one
    # other (at least 2 workers, under the 6 in flight: a worker bound); served in random
    # order, a request can pass every other in flight, and the bound says nothing
    # (little's back-off floor then needs the estimate's agreement).
    fifo = OvertakeEdge()
    drive(fifo, workers=2, inflight=6, requests=400, service=exponential(0.1))
    assert fifo.at_least == 2 < fifo.recent_level == 6
    shuffled = OvertakeEdge()
    drive(shuffled, workers=2, inflight=6, requests=400, service=exponential(0.1), in_order=False)
    assert shuffled.at_least == shuffled.recent_level == 6


def lognormal(mean: float, sigma: float) -> Callable[[random.Random], float]:
    mu = math.log(mean) - sigma * sigma / 2
    return lambda rng: rng.lognormvariate(mu, sigma)


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_the_ceiling_is_the_workers_where_the_histogram_tapers(workers: int) -> None:
    # Log-normal sigma 0.5: the overtakes taper towards the top (no edge shown), yet
    # over a long history requests still reach W - 1, and none ever passes it.
    edge = OvertakeEdge()
    drive(
        edge,
        workers=workers,
        inflight=workers + 4,
        requests=4096,
        service=lognormal(0.1, 0.5),
    )
    assert edge.workers is None  # tapering: the edge says nothing
    assert edge.ceiling == workers


def test_no_ceiling_where_the_top_is_a_handful_of_requests() -> None:
    # 32 log-normal workers: the top few values are a few requests each, a taper that
    # could go on past them; a ceiling read there would sit under the workers.
    edge = OvertakeEdge()
    drive(edge, workers=32, inflight=36, requests=4096, service=lognormal(0.1, 0.5))
    assert edge.ceiling is None


def test_no_ceiling_without_requests_free_to_overtake_more() -> None:
    # One slot over the workers: a request could overtake W others only if all W + 1
    # in flight were served at once, and the ceiling asks for more room than that (two
    # slots over the most overtaken + 1) before it reads the absence as a bound.
    edge = OvertakeEdge()
    drive(edge, workers=4, inflight=5, requests=4096, service=exponential(0.1))
    assert edge.ceiling is None
    roomy = OvertakeEdge()
    drive(roomy, workers=4, inflight=6, requests=4096, service=exponential(0.1))
    assert roomy.ceiling == 4


def test_a_server_that_lets_requests_pass_shows_no_ceiling_under_its_limit() -> None:
    shuffled = OvertakeEdge()
    drive(
        shuffled,
        workers=4,
        inflight=10,
        requests=4096,
        service=exponential(0.1),
        in_order=False,
    )
    # (In flight at most 10: an M of 8 or more has no room over M + 2.)
    assert shuffled.ceiling is None


def test_the_long_history_keeps_its_last_requests_only() -> None:
    edge = OvertakeEdge()
    drive(edge, workers=4, inflight=8, requests=10_000, service=lognormal(0.1, 0.5))
    assert len(edge._long_overtaken) == len(edge._long_inflight) == 4096
    assert sum(edge._long_overtakes.values()) == sum(edge._long_levels.values()) == 4096
    assert min(edge._long_overtakes.values()) > 0 and min(edge._long_levels.values()) > 0
    assert edge.ceiling == 4


def test_one_request_far_past_the_others_is_a_stray_one_just_past_is_not() -> None:
    # 40 requests overtook 3 (100 overtook 2), admitted at 8 in flight: 4 workers.
    def history(*extra: int) -> OvertakeEdge:
        edge = OvertakeEdge()
        for _ in range(100):
            edge._remember(2, 8)
        for _ in range(40):
            edge._remember(3, 8)
        for overtaken in extra:
            edge._remember(overtaken, 8)
        return edge

    assert history().ceiling == 4
    assert history(5).ceiling == 4  # alone, two past the top: forgiven
    assert history(4).ceiling is None  # one past: more workers, perhaps; not yet shown
