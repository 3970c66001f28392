"""The failure modes users report with adaptive concurrency limits (docs/design.md,
"Limit algorithms, and why"; each one in docs/limits.md).

Each one is either fixed in loadshed's version (shown against the peer's
``published()`` behaviour, where the peer fails) or documented as a known limit of the
algorithm, with a test that shows it:

1. a limit that drifts up when every request ends at the same timeout;
2. a minimum latency that creeps up under sustained load;
3. probes that cause rejections at low traffic;
4. an initial limit that sheds after deploys;
5. a limit that never recovers after a capacity drop.

Two small models in virtual time drive the algorithms (no sleeping):

- ``run_server``: requests arrive at given times; the limiter admits one when fewer than
  ``limit`` are in flight and rejects it otherwise (no limiter queue, so every excess
  request counts as a rejection); admitted requests run on ``workers`` FIFO workers.
  A client that waits longer than ``timeout`` gives up: its sample is reported as
  dropped at the timeout (as loadshed's limiter does) while the server still finishes
  the work, as model servers do. ``server_queue`` bounds the server's own queue, past
  which it answers at once with an error (a fast 503).
- ``saturate``: a processor-sharing server (threads on shared cores) under unbounded
  demand: ``limit`` requests always in flight, each taking
  ``service x max(1, limit / workers)``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pytest

from loadshed.limits import (
    AIMD,
    Gradient,
    Gradient2,
    LimitAlgorithm,
    Sample,
    Vegas,
)


@dataclass
class Run:
    """What happened to the requests of one ``run_server`` run."""

    admitted: int = 0
    rejected_at: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    limits: list[tuple[float, int]] = field(default_factory=list)

    def rejected(self, start: float = 0.0, end: float = math.inf) -> int:
        return sum(1 for t in self.rejected_at if start <= t < end)

    def dropped(self, start: float = 0.0, end: float = math.inf) -> int:
        return sum(1 for s in self.samples if s.dropped and start <= s.now < end)

    def succeeded(self, start: float = 0.0, end: float = math.inf) -> int:
        return sum(1 for s in self.samples if not s.dropped and start <= s.now < end)

    def limit_at(self, when: float) -> int:
        current = self.limits[0][1]
        for changed_at, limit in self.limits:
            if changed_at > when:
                break
            current = limit
        return current


def run_server(
    algo: LimitAlgorithm,
    arrivals: Iterable[float],
    *,
    workers: int,
    service: Callable[[float], float],
    timeout: float | None = None,
    server_queue: int | None = None,
) -> Run:
    """Arrivals -> limiter (reject at the limit) -> ``workers`` FIFO workers."""
    run = Run(limits=[(0.0, algo.limit)])
    worker_free_at = [0.0] * workers
    in_server: list[float] = []  # finish times of the work the server still holds
    # (release time, sequence, admitted at, inflight at admission, dropped)
    releases: list[tuple[float, int, float, int, bool]] = []
    inflight = 0

    def release_until(when: float) -> None:
        nonlocal inflight
        while releases and releases[0][0] <= when:
            end, _, start, admitted_inflight, dropped = heapq.heappop(releases)
            inflight -= 1
            sample = Sample(rtt=end - start, inflight=admitted_inflight, dropped=dropped, now=end)
            run.samples.append(sample)
            before = algo.limit
            algo.update(sample)
            if algo.limit != before:
                run.limits.append((end, algo.limit))

    for sequence, arrival in enumerate(arrivals):
        release_until(arrival)
        if inflight >= algo.limit:
            run.rejected_at.append(arrival)
            continue
        inflight += 1
        run.admitted += 1
        while in_server and in_server[0] <= arrival:
            heapq.heappop(in_server)
        if server_queue is not None and len(in_server) >= workers + server_queue:
            entry = (arrival + 0.001, sequence, arrival, inflight, True)  # fast 503
            heapq.heappush(releases, entry)
            continue
        worker = min(range(workers), key=worker_free_at.__getitem__)
        finish = max(arrival, worker_free_at[worker]) + service(arrival)
        worker_free_at[worker] = finish
        heapq.heappush(in_server, finish)
        if timeout is not None and finish - arrival > timeout:
            heapq.heappush(releases, (arrival + timeout, sequence, arrival, inflight, True))
        else:
            heapq.heappush(releases, (finish, sequence, arrival, inflight, False))
    release_until(math.inf)
    return run


def steady(rate: float, duration: float, start: float = 0.0) -> list[float]:
    """Evenly spaced arrivals at ``rate`` per second."""
    return [start + i / rate for i in range(int(rate * duration))]


def saturate(algo: LimitAlgorithm, *, workers: int, service: float, samples: int) -> list[int]:
    """Processor sharing under unbounded demand; returns the limit after each sample."""
    limits = []
    now = 0.0
    for _ in range(samples):
        limit = algo.limit
        rtt = service * max(1.0, limit / workers)
        now += rtt / limit
        algo.update(Sample(rtt=rtt, inflight=limit, dropped=False, now=now))
        limits.append(algo.limit)
    return limits


def every_request_times_out(algo: LimitAlgorithm, *, flagged: bool, count: int = 3000) -> int:
    """Every request ends at the same 5 s client timeout; returns the final limit."""
    now = 0.0
    for _ in range(count):
        now += 0.01
        algo.update(Sample(rtt=5.0, inflight=algo.limit, dropped=flagged, now=now))
    return algo.limit


OURS: list[Callable[[], LimitAlgorithm]] = [AIMD, Vegas, Gradient2, Gradient]

# -- 1. the limit drifts up when every request ends at the same timeout -------------------


def test_same_timeout_gradient2_peer_climbs_to_max_ours_backs_off() -> None:
    # Netflix issue #137: the rtt is perfectly stable at the timeout, the gradient is 1
    # and the queue term grows the limit, even though every request failed.
    assert every_request_times_out(Gradient2.published(), flagged=True) == 200
    assert every_request_times_out(Gradient2(), flagged=True) == 1


def test_same_timeout_envoy_peer_climbs_to_max_ours_backs_off() -> None:
    # Envoy measures its min RTT on the timed-out requests too: p50 = min RTT, gradient
    # 1.25, and x + sqrt(x) grows every interval.
    assert every_request_times_out(Gradient.published(), flagged=True) == 1000
    ours = Gradient()
    assert every_request_times_out(ours, flagged=True) == 1
    assert ours.min_rtt is None  # a timed-out request never passes for a latency


@pytest.mark.parametrize("cls", [AIMD, Vegas])
def test_same_timeout_loss_aware_peers_back_off_once_timeouts_are_flagged(
    cls: type[AIMD] | type[Vegas],
) -> None:
    # AIMD and Vegas react to drops; what they need is the limiter reporting a
    # timed-out request as dropped. Unflagged, a stable latency looks healthy:
    # AIMD's own check is rtt > timeout, and a request cut at exactly 5 s is not.
    published = cls.published()
    assert every_request_times_out(cls.published(), flagged=False) == published.max_limit
    assert every_request_times_out(cls.published(), flagged=True) == published.min_limit
    assert every_request_times_out(cls(), flagged=True) == 1


def test_same_timeout_under_overload_with_a_real_queue() -> None:
    # 8 workers x 0.1 s (80/s) offered 120/s with a 1 s client timeout, for 2 minutes.
    def overload(algo: LimitAlgorithm) -> Run:
        arrivals = steady(120, 120)
        return run_server(algo, arrivals, workers=8, service=lambda t: 0.1, timeout=1.0)

    published, ours = overload(Gradient2.published()), overload(Gradient2())
    # The peer's limit climbs while requests time out: most admitted requests fail.
    assert published.dropped() > 0.8 * published.admitted
    assert published.limit_at(119) == 200
    # Ours treats the timeouts as overload: few fail, and the goodput is higher.
    assert ours.dropped() < 0.05 * ours.admitted
    assert ours.succeeded() > 5 * published.succeeded()


# -- 2. the minimum latency creeps up under sustained load ---------------------------------


def test_envoy_pinned_probes_keep_min_rtt_true_under_sustained_load() -> None:
    # Fixed by design in the Envoy-style gradient: the min RTT is only measured with
    # the limit pinned at 3, below the 8 workers, so the queue never gets into it.
    for algo in (Gradient.published(), Gradient()):
        limits = saturate(algo, workers=8, service=0.1, samples=20_000)  # ~250 s
        assert algo.probes_started >= 4  # start-up and re-measures every ~minute
        assert algo.min_rtt == pytest.approx(0.1)
        assert max(limits[2000:]) <= 16  # ~1.25 x 8 + headroom, never creeping


def test_vegas_known_limit_rtt_noload_ratchets_under_sustained_saturation() -> None:
    # Known limit: under saturation every sample carries the queue Vegas holds, so each
    # re-probe adopts a higher rtt_noload and the limit ratchets up. Ours adopts the
    # minimum of the probe period (not one sample), which slows the ratchet but does
    # not stop it: use `little`, or a realistic max_limit, for saturated model servers.
    published, ours = Vegas.published(), Vegas()
    published_limits = saturate(published, workers=8, service=0.1, samples=20_000)
    our_limits = saturate(ours, workers=8, service=0.1, samples=20_000)
    assert published.rtt_noload > 5 * 0.1 and published_limits[-1] > 5 * 8
    assert ours.rtt_noload > 2 * 0.1 and our_limits[-1] > 2 * 8  # still creeps ...
    assert ours.rtt_noload < published.rtt_noload  # ... more slowly
    assert our_limits[-1] < published_limits[-1]


def test_gradient2_known_limit_long_rtt_follows_sustained_load_to_max() -> None:
    # Known limit: long_rtt averages whatever latency persists; with tolerance 1.5 the
    # gradient stays at 1 while latency grows slowly, so the limit reaches max_limit.
    for algo in (Gradient2.published(), Gradient2()):
        limits = saturate(algo, workers=8, service=0.1, samples=5000)
        assert limits[-1] == algo.max_limit
        assert algo.long_rtt > 10 * 0.1


def test_vegas_fast_errors_do_not_become_our_rtt_noload() -> None:
    # A fast 503 (1 ms) is not a no-load latency. The peer adopts it, after which every
    # real latency looks like a queue of ~L requests and the limit collapses (until the
    # next probe, 30 x L x jitter samples later).
    def around_a_fast_error(vegas: Vegas) -> tuple[int, int]:
        now = 0.0
        for _ in range(5):
            now += 0.1
            vegas.update(Sample(rtt=0.1, inflight=vegas.limit, dropped=False, now=now))
        before = vegas.limit
        vegas.update(Sample(rtt=0.001, inflight=vegas.limit, dropped=True, now=now))
        for _ in range(100):
            now += 0.1
            vegas.update(Sample(rtt=0.1, inflight=vegas.limit, dropped=False, now=now))
        return before, vegas.limit

    published = Vegas(initial_limit=40, ignore_dropped_rtt=False, probe_window_min=False)
    before, after = around_a_fast_error(published)
    assert published.rtt_noload == 0.001
    assert after <= 6 < before  # collapsed to where q = L fits under beta
    ours = Vegas(initial_limit=40)
    before, after = around_a_fast_error(ours)
    assert ours.rtt_noload == 0.1
    assert after == ours.max_limit  # no queue seen: kept growing


# -- 3. probes that cause rejections at low traffic --------------------------------------


def bursts_of_four(duration: float) -> list[float]:
    """Four simultaneous requests every 2 s: 10 % load on 4 workers of 0.1 s."""
    return [2.0 * k + 1e-4 * j for k in range(int(duration / 2)) for j in range(4)]


def test_envoy_probes_reject_bursts_at_low_traffic_ours_do_not_pin() -> None:
    arrivals = bursts_of_four(300)
    published, ours = Gradient.published(), Gradient()
    peer_run = run_server(published, arrivals, workers=4, service=lambda t: 0.1)
    our_run = run_server(ours, arrivals, workers=4, service=lambda t: 0.1)
    # The peer pins the limit to 3 for 50 requests (~25 s at this rate) every ~minute.
    assert published.probes_started >= 3
    assert peer_run.rejected(60) >= 30
    # Ours measures the min RTT from requests that ran at <= 3 in flight: after the
    # start-up measurement it never pins, so nothing is rejected.
    assert ours.probes_started == 1
    assert our_run.rejected(5) == 0
    assert ours.min_rtt == pytest.approx(0.1)


@pytest.mark.parametrize("factory", [AIMD, Vegas, Gradient2])
def test_algorithms_without_pinned_probes_never_reject_at_low_traffic(
    factory: Callable[[], LimitAlgorithm],
) -> None:
    run = run_server(factory(), bursts_of_four(300), workers=4, service=lambda t: 0.1)
    assert run.rejected() == 0


# -- 4. an initial limit that sheds after deploys ------------------------------------------


def test_envoy_start_up_probe_sheds_after_deploys_ours_is_bounded() -> None:
    # 32 workers of 1 s calls, 30 requests/s from the first second after a deploy.
    def deploy(algo: Gradient) -> Run:
        return run_server(algo, steady(30, 40), workers=32, service=lambda t: 1.0)

    peer_run, our_run = deploy(Gradient.published()), deploy(Gradient())
    # The peer starts pinned at 3 until 50 requests complete: ~17 s at 3 per second.
    assert peer_run.rejected(0, 15) > 300
    # Ours ends the start-up probe after 1 s (or its first latency). It then grows by
    # Envoy's x1.25 + sqrt per interval, here 2 s (two min RTTs): a known limit of this
    # rule for slow models, which ramp up in seconds to tens of seconds.
    assert our_run.limit_at(1.5) == 4
    assert our_run.rejected() < peer_run.rejected() / 2
    assert our_run.rejected(20) == 0
    assert our_run.limit_at(20) >= 32


@pytest.mark.parametrize("factory", OURS)
def test_small_initial_limit_ramps_to_a_large_server_within_seconds(
    factory: Callable[[], LimitAlgorithm],
) -> None:
    # Trade-off, not free: our initial limit (<= 4) protects a one-worker model, and
    # on a 32-worker server (0.5 s calls, 60/s) it sheds only while ramping up.
    algo = factory()
    run = run_server(algo, steady(60, 30), workers=32, service=lambda t: 0.5, timeout=2.0)
    assert run.rejected(10) == 0
    assert run.limit_at(10) >= 32
    assert run.dropped() == 0
    if not isinstance(algo, Gradient):
        # +1 or +beta per sample, or x1.8 per service time: done within 10 calls.
        assert run.rejected(5) == 0
    # The Envoy-style rule grows x1.25 + sqrt per interval (here 1 s): ~6 s to 32.


@pytest.mark.parametrize("cls", [AIMD, Gradient2])
def test_peer_floor_of_20_cannot_protect_a_one_worker_model(
    cls: type[AIMD] | type[Gradient2],
) -> None:
    # The peers' min_limit 20 means 20 requests in flight on a one-worker model of
    # 0.5 s: queueing alone is 10 s, beyond the 2 s client timeout. Ours goes down to 1.
    def deploy(algo: LimitAlgorithm) -> Run:
        return run_server(algo, steady(3, 60), workers=1, service=lambda t: 0.5, timeout=2.0)

    peer_run, our_run = deploy(cls.published()), deploy(cls())
    capacity = 2 * 60
    assert peer_run.succeeded() < 0.15 * capacity
    assert our_run.succeeded() > 0.4 * capacity
    assert our_run.succeeded() > 4 * peer_run.succeeded()
    # Known limit: ours still find the limit by causing timeouts (AIMD by design,
    # Gradient2 by tolerating 1.5x latency): over 30 % of admitted requests time out.
    assert our_run.dropped() > 0.3 * our_run.admitted
    # The Envoy-style rule, which compares with a measured minimum, does better:
    envoy_style = run_server(
        Gradient(), steady(3, 60), workers=1, service=lambda t: 0.5, timeout=2.0
    )
    assert envoy_style.succeeded() > 0.95 * capacity and envoy_style.dropped() == 0


# -- 5. a limit that never recovers after a capacity drop ---------------------------------


def slow_between(start: float, end: float) -> Callable[[float], float]:
    """Service time of 0.1 s, four times slower between ``start`` and ``end``."""
    return lambda t: 0.4 if start <= t < end else 0.1


def test_gradient2_peer_never_recovers_from_a_capacity_drop_ours_does() -> None:
    # 8 workers, 60 requests/s (75 % load); capacity falls to 20/s for 30 s, then
    # returns. The server keeps working on timed-out requests (1 s client timeout).
    def incident(algo: LimitAlgorithm) -> Run:
        arrivals = steady(60, 120)
        return run_server(algo, arrivals, workers=8, service=slow_between(30, 60), timeout=1.0)

    peer_run, our_run = incident(Gradient2.published()), incident(Gradient2())
    # The peer's limit climbed while requests timed out, the backlog it admitted
    # outlives the incident, and long_rtt is pinned at the timeout: still failing
    # every request 30 to 60 s after capacity came back.
    assert peer_run.dropped(90, 120) == peer_run.succeeded(90, 120) + peer_run.dropped(90, 120)
    assert peer_run.dropped(90, 120) > 1000
    # Ours backed off on the timeouts and is healthy soon after capacity returned.
    assert our_run.dropped(80) == 0
    assert our_run.rejected(80) == 0
    assert our_run.succeeded(90, 120) > 0.95 * 60 * 30


@pytest.mark.parametrize("server_queue", [8, None])
@pytest.mark.parametrize("factory", OURS)
def test_ours_recover_after_a_capacity_drop(
    factory: Callable[[], LimitAlgorithm], server_queue: int | None
) -> None:
    algo = factory()
    run = run_server(
        algo,
        steady(60, 150),
        workers=8,
        service=slow_between(30, 60),
        timeout=1.0,
        server_queue=server_queue,
    )
    assert run.rejected(30, 60) > 0  # it did shed during the incident
    assert run.dropped(100) == 0  # and is healthy afterwards
    if isinstance(algo, Gradient):
        # Under load (6 in flight > probe_limit 3) a re-measure still pins the limit,
        # for at most probe_timeout (1 s) per minute: ~60 requests at most.
        assert run.rejected(100) <= 60
    else:
        assert run.rejected(100) == 0
    assert run.succeeded(100, 150) > 0.95 * 60 * 50 - run.rejected(100)
    assert run.limit_at(149) >= 6  # back above the ~6 requests the load keeps in flight


def test_envoy_stale_min_rtt_after_a_slow_period_lowered_at_once_by_ours() -> None:
    # A min RTT measured while the model was slow (0.4 s) is stale once it is fast
    # again. The peer keeps it until the next probe (a minute), so a queue that triples
    # the latency (0.3 s) still looks fine and the limit keeps growing; ours took the
    # lower interval p50 as the min RTT at once and backs off.
    def after_slow_probe(algo: Gradient) -> Gradient:
        now = 0.0
        while algo.probing:
            now += 0.01
            algo.update(Sample(rtt=0.4, inflight=3, dropped=False, now=now))
        for _ in range(500):  # 5 s of fast requests
            now += 0.01
            algo.update(Sample(rtt=0.1, inflight=algo.limit, dropped=False, now=now))
        assert not algo.probing
        for _ in range(100):  # 1 s of queueing: three times the true min RTT
            now += 0.01
            algo.update(Sample(rtt=0.3, inflight=algo.limit, dropped=False, now=now))
        return algo

    published = after_slow_probe(Gradient.published())
    assert published.min_rtt == 0.4
    assert published.limit == published.max_limit  # gradient 1.25 x 0.4 / 0.3 > 1
    ours = after_slow_probe(Gradient(initial_limit=3))
    assert ours.min_rtt == pytest.approx(0.1)
    assert ours.limit < 20  # gradient 0.5 per interval while the queue lasts
