"""The admission core: tokens, the wait queue, deadlines and priorities.

This is the mechanism behind every integration. It is synchronous and driven by
callbacks, so the asyncio :class:`loadshed.limiter.Limiter` and the virtual-time
simulator run exactly the same admission code. It never knows HTTP and never
computes a limit: it asks its :class:`LimitAlgorithm` and feeds it samples.

A request is *submitted* with a priority and an optional absolute deadline on the
clock. It is granted a :class:`Token` at once (in-flight below the limit), queued
(a :class:`Ticket`; one of its callbacks fires later), or refused with
:class:`Rejected`. Whoever holds a token releases it with an :class:`Outcome`,
which becomes a sample for the limit algorithm and may grant queued tickets.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from loadshed.clock import Clock, reader
from loadshed.codel import CoDel
from loadshed.config import AdmissionConfig, Discipline, LimitUnit, resolve_config
from loadshed.costmodel import CostModel, check_cost
from loadshed.errors import ConfigError, Outcome, Priority, Rejected, RejectReason
from loadshed.estimate import PatienceEstimator, ServiceTimeEstimator
from loadshed.limits.base import LimitAlgorithm, Sample
from loadshed.limits.fixed import Fixed
from loadshed.shortest import ShortestFirst
from loadshed.waitbound import DEFAULT_WAIT_CEILING, AdaptiveWaitBound

__all__ = [
    "DISCIPLINES",
    "Admission",
    "LimiterListener",
    "LimiterSnapshot",
    "Ticket",
    "Token",
]

DISCIPLINES = tuple(d.value for d in Discipline)
"""The discipline names (:class:`~loadshed.config.Discipline`)."""
_FIFO: Final = Discipline.FIFO
_LIFO: Final = Discipline.LIFO
_CODEL: Final = Discipline.CODEL
_SHORTEST: Final = Discipline.SHORTEST
_PRIORITIES = tuple(Priority)  # most critical first
_DEFAULT_QUEUE_WAIT = 1.0  # seconds, until a service time has been measured
_MAX_RETRY_AFTER = 3600.0  # seconds: a Retry-After beyond an hour says nothing more
# A request that the service-time estimate says cannot finish is still admitted, as a
# probe, when no success was seen for this many estimates (and at least _STALE_MIN_S):
# only a request that runs can refresh an estimate that a slow spell left too high.
_STALE_ESTIMATES = 10.0
_STALE_MIN_S = 1.0
# The wait behind a single slot (_first_slot_free): service counts as steady with its
# high estimate under this x the mean, and what the request in flight has left gets
# this x the mean added for the timing its age leaves out.
_STEADY_HIGH = 1.25
_AGE_MARGIN = 0.2
# A request after a quiet this long (seconds) and this many mean service times: the
# give-ups since the request before it were the load leaving (see _arrived).
_QUIET_MIN_S = 1.0
_QUIET_SERVICES = 10.0
_new_sample = tuple.__new__
_INF = math.inf
REJECT_COUNT_KEYS: Final = {reason: f"rejected:{reason.value}" for reason in RejectReason}
"""Rejection reason -> its key in :attr:`Admission.counts`."""
# Reading an enum member through its class costs ~70 ns on CPython 3.11 (a plain
# name, ~6 ns): the per-request paths use these names.
_SUCCESS: Final = Outcome.SUCCESS
_DROPPED: Final = Outcome.DROPPED
_IGNORED: Final = Outcome.IGNORED


class LimiterListener(Protocol):
    """Receives admission events, e.g. to export metrics. Must be cheap."""

    def on_admit(self, queue_wait_s: float, priority: Priority) -> None:
        """A request was granted a token after waiting ``queue_wait_s``."""

    def on_release(self, outcome: Outcome, service_s: float) -> None:
        """A token was released after ``service_s`` seconds in flight."""

    def on_reject(self, reason: RejectReason, queue_wait_s: float) -> None:
        """A request was refused, or left the queue, after ``queue_wait_s``."""


@dataclass(frozen=True)
class LimiterSnapshot:
    """A consistent view of a limiter's state, for metrics, logs and the CLI."""

    name: str
    limit: int
    inflight: int
    queue_length: int
    service_time_s: float | None
    service_time_high_s: float | None
    patience_s: float | None
    algorithm: str
    counts: dict[str, int] = field(default_factory=dict)
    inflight_cost: float = 0.0
    """Cost units in flight, when the limit counts cost (``limit_unit="cost"``); else 0."""


class _State(enum.Enum):
    QUEUED = 1
    GRANTED = 2
    REJECTED = 3
    CANCELLED = 4


def _is_queued(ticket: Ticket) -> bool:
    return ticket._state is _State.QUEUED


class Ticket:
    """A queued request. Exactly one of its callbacks fires, unless it is cancelled."""

    __slots__ = (
        "_state",
        "cost",
        "deadline",
        "enqueued_at",
        "on_grant",
        "on_reject",
        "priority",
        "seq",
        "wait_expiry",
    )

    def __init__(
        self,
        priority: Priority,
        deadline: float | None,
        enqueued_at: float,
        wait_expiry: float,
        seq: int,
        on_grant: Callable[[Token], None],
        on_reject: Callable[[Rejected], None],
        cost: float | None = None,
    ) -> None:
        self.priority = priority
        self.deadline = deadline
        self.enqueued_at = enqueued_at
        self.wait_expiry = wait_expiry
        self.seq = seq
        self.on_grant = on_grant
        self.on_reject = on_reject
        self.cost = cost
        """The request's cost (None: none given)."""
        self._state = _State.QUEUED

    @property
    def queued(self) -> bool:
        """True while the ticket waits in the queue."""
        return self._state is _State.QUEUED


class Token:
    """The right to run one request. Release it exactly once with its outcome."""

    __slots__ = (
        "_admission",
        "_vacated",
        "_vacated_at",
        "admitted_at",
        "cost",
        "deadline",
        "inflight_at_admit",
        "outcome",
        "priority",
        "queue_wait",
    )

    def __init__(
        self,
        admission: Admission,
        priority: Priority,
        deadline: float | None,
        admitted_at: float,
        queue_wait: float,
        inflight_at_admit: int,
        cost: float | None = None,
    ) -> None:
        self._admission = admission
        self.priority = priority
        self.deadline = deadline
        self.admitted_at = admitted_at
        self.queue_wait = queue_wait
        self.inflight_at_admit = inflight_at_admit
        self.cost = cost
        """The request's cost (None: none given); a success feeds the cost model."""
        self.outcome: Outcome | None = None
        self._vacated = False
        self._vacated_at = 0.0

    @property
    def released(self) -> bool:
        """True once an outcome was recorded."""
        return self.outcome is not None

    @property
    def vacated(self) -> bool:
        """True once the slot was handed on by :meth:`vacate` (or by release)."""
        return self._vacated or self.outcome is not None

    def vacate(self) -> None:
        """The request's work on the limited resource is done (its model call returned):
        hand its slot to the next request now, before its response is sent. The outcome
        and the sample still come with :meth:`release`; the limit algorithm's sample
        is timed from admission to now (the slot's time), the service time that
        deadline admission learns to the release. Only the first call counts; a
        no-op once released."""
        if not self._vacated and self.outcome is None:
            self._vacated = True
            self._admission._vacate(self)

    def release(self, outcome: Outcome = Outcome.SUCCESS) -> None:
        """Record the outcome and free the slot. Only the first call counts."""
        if self.outcome is None:
            self.outcome = outcome
            self._admission._release(self, outcome)

    def success(self) -> None:
        """Release as a success: the latency is a capacity sample."""
        self.release(_SUCCESS)

    def dropped(self) -> None:
        """Release as dropped: a sign of overload (timeout, 503, deadline exceeded)."""
        self.release(_DROPPED)

    def ignored(self) -> None:
        """Release without a sample (client error, cancelled before start)."""
        self.release(_IGNORED)


class Admission:
    """Admission control over a limit algorithm; see the module docstring.

    Parameters:
        limit: the algorithm that sets the concurrency limit.
        clock: where time comes from (real or virtual).
        name: label for metrics and snapshots.
        max_queue: most requests waiting at once (0: no queue, refuse when full).
        max_queue_wait: longest wait in the queue in seconds; None (default) means
            the adaptive bound (:class:`~loadshed.waitbound.AdaptiveWaitBound`): one
            estimated service time at first, growing while queued requests succeed
            and no client gives up (up to ``adaptive_wait_ceiling`` of response
            time), cut at once when a client gives up (to half its wait, or that wait
            less two mean service times if shorter; the same of the learned patience).
            With ``fifo``, a request that finds enough work
            ahead of it to fill this wait (queued ahead / limit x mean service time
            >= the bound; with costs, each request queued ahead at its own predicted
            time, but at most the bound) is refused at once (``limit``) rather than
            queued to time out.
        adaptive_wait_ceiling: seconds of response time (queue wait plus a service
            time) the adaptive bound may grow to while clients are patient; 0 keeps
            the bound at one service time. Unused when ``max_queue_wait`` is set.
        discipline: ``fifo`` (default), ``lifo`` (newest first), ``codel``
            (FIFO, switching to LIFO with a short queue timeout while the minimum
            queue wait over ``codel_interval`` exceeds ``codel_target``), or
            ``shortest`` (the shortest predicted service time first, from the costs).
        reserved: share of the limit (0..1) kept for a class and those more critical,
            e.g. ``{Priority.CRITICAL: 0.2}``.
        initial_service_time: guess used for estimates until the first sample.
        learn_patience: use the learned client patience as the deadline of requests
            that carry none.
        codel_target / codel_interval: CoDel's settings (seconds).
        limit_unit: ``requests`` (default) or ``cost``: the limit then bounds the cost
            in flight (a request without a cost counts one unit; one costing more than
            the whole limit runs alone, when nothing else is in flight); it needs a
            :class:`~loadshed.limits.fixed.Fixed` limit. Queued requests are granted in
            order: a big one at the head is not passed over by smaller ones behind it.
        config: all of the above as one :class:`~loadshed.config.AdmissionConfig`
            (then leave the keywords at their defaults).

    A request whose own deadline is shorter than the time it would take even with a
    slot free (the shorter of the mean service time and the last success's) is
    refused at once (``deadline``), like one that could not wait its turn. Nothing is
    refused this way before the first success (an initial guess is not a
    measurement), nor on a learned patience (only a deadline the request carries),
    and when no success was seen for ten such estimates (at least 1 s) one such
    request runs anyway, as a probe: a slow spell cannot lock such clients out.
    """

    def __init__(
        self,
        limit: LimitAlgorithm,
        clock: Clock,
        *,
        name: str = "default",
        max_queue: int = 1000,
        max_queue_wait: float | None = None,
        discipline: Discipline | str = Discipline.FIFO,
        reserved: Mapping[Priority, float] | None = None,
        initial_service_time: float | None = None,
        learn_patience: bool = True,
        codel_target: float = 0.005,
        codel_interval: float = 0.1,
        adaptive_wait_ceiling: float = DEFAULT_WAIT_CEILING,
        limit_unit: LimitUnit | str = LimitUnit.REQUESTS,
        config: AdmissionConfig | None = None,
    ) -> None:
        config = resolve_config(
            config,
            max_queue=max_queue,
            max_queue_wait=max_queue_wait,
            discipline=discipline,
            reserved=reserved,
            initial_service_time=initial_service_time,
            learn_patience=learn_patience,
            adaptive_wait_ceiling=adaptive_wait_ceiling,
            codel_target=codel_target,
            codel_interval=codel_interval,
            limit_unit=limit_unit,
        )
        if not isinstance(name, str):
            raise ConfigError("name", f"must be a string, got {type(name).__name__}")
        self.config = config
        """The settings, validated (:class:`~loadshed.config.AdmissionConfig`)."""
        self._reserved: dict[Priority, float] = dict(config.reserved)

        if not isinstance(limit, LimitAlgorithm):
            raise ConfigError("limit", f"expected a LimitAlgorithm, got {type(limit).__name__}")
        limit.check()
        self.algorithm = limit
        self._feed_algorithm = limit.uses_samples  # read once: it is a class setting
        self.counts_cost = config.limit_unit is LimitUnit.COST
        """True when the limit counts cost units in flight, not requests."""
        if self.counts_cost and not isinstance(limit, Fixed):
            # An adaptive algorithm reads a number of requests from latencies; a cost
            # capacity (a KV cache's tokens) is known, not learned from them.
            raise ConfigError(
                "limit_unit",
                f"cost needs a fixed limit (fixed:N, N in cost units), got {limit.describe()}",
            )
        self.clock = clock
        self.now = reader(clock)
        """Reads the clock (read on every admission and release; see clock.reader)."""
        self.name = name
        self.max_queue = config.max_queue
        self.max_queue_wait = config.max_queue_wait
        self.discipline = config.discipline
        self.learn_patience = config.learn_patience
        self.service = ServiceTimeEstimator(initial=config.initial_service_time)
        initial_model = config.initial_cost_model
        self.cost_model = (
            CostModel()
            if initial_model is None
            else CostModel(intercept=initial_model[0], slope=initial_model[1])
        )
        """Service time from a request's cost, fitted on successes that carry one."""
        self.cost_counts = {"admitted": 0.0, "refused": 0.0, "completed": 0.0}
        """Cost admitted, refused (or left the queue) and completed successfully."""
        self.patience = PatienceEstimator()
        self._last_arrival = -math.inf  # when the last request arrived (see _arrived)
        self.wait_bound = AdaptiveWaitBound(config.adaptive_wait_ceiling)
        """The queue-wait bound used when ``max_queue_wait`` is None."""
        # The shortest time a request granted now should take: the lower of the mean
        # service time and the last success's, 0 until the first success (so no
        # deadline is judged on a guess). Kept as a plain float for grant_now.
        self._finish_estimate = 0.0
        self._success_at = -math.inf  # clock time of the last success (or probe)

        self._inflight = 0
        self._inflight_by_priority = [0] * len(_PRIORITIES)
        # Cost units in flight, in all and per class (only when the limit counts cost).
        self._inflight_cost = 0.0
        self._inflight_cost_by_priority = [0.0] * len(_PRIORITIES)
        # When the last request was granted: with one in flight, at most its age (a
        # later one may have left first), which tells how soon the slot frees.
        self._granted_at = -math.inf
        self._queues: list[deque[Ticket]] = [deque() for _ in _PRIORITIES]
        self._queued = 0
        self._queued_by_priority = [0] * len(_PRIORITIES)
        # Queued tickets that carry a cost, and their costs' sum, per class: the
        # predicted work ahead of a request (see _work_ahead).
        self._queued_costed = 0
        self._costed_by_priority = [0] * len(_PRIORITIES)
        self._cost_by_priority = [0.0] * len(_PRIORITIES)
        self._expiries: list[tuple[float, int, Ticket]] = []
        # The shortest-first index of the queue (discipline="shortest" only).
        self._shortest: ShortestFirst[Ticket] | None = (
            ShortestFirst(len(_PRIORITIES)) if config.discipline is _SHORTEST else None
        )
        self._seq = 0
        self._dispatching = False
        self._listeners: list[LimiterListener] = []
        self._counts: dict[str, int] = {"admitted": 0, "queued": 0}
        for outcome in Outcome:
            self._counts[outcome.value] = 0
        for reason in RejectReason:
            self._counts[REJECT_COUNT_KEYS[reason]] = 0

        self._codel: CoDel | None = (
            CoDel(config.codel_target, config.codel_interval, clock.now())
            if config.discipline is _CODEL
            else None
        )

    # ------------------------------------------------------------------ state

    @property
    def limit(self) -> int:
        """The current concurrency limit."""
        return self.algorithm.limit

    @property
    def inflight(self) -> int:
        """Tokens held now."""
        return self._inflight

    @property
    def inflight_cost(self) -> float:
        """Cost units held now when the limit counts cost (``limit_unit="cost"``); else 0."""
        return self._inflight_cost

    @property
    def queue_length(self) -> int:
        """Requests waiting now."""
        return self._queued

    @property
    def counts(self) -> dict[str, int]:
        """Counters: admitted, queued, per outcome and ``rejected:<reason>`` (a copy)."""
        return dict(self._counts)

    def add_listener(self, listener: LimiterListener) -> None:
        """Register a listener for admit/release/reject events."""
        self._listeners.append(listener)

    def snapshot(self) -> LimiterSnapshot:
        """Limit, in-flight, queue length, estimates and counters, at this moment."""
        return LimiterSnapshot(
            name=self.name,
            limit=self.limit,
            inflight=self._inflight,
            queue_length=self._queued,
            service_time_s=self.service.mean,
            service_time_high_s=self.service.high,
            patience_s=self.patience.patience,
            algorithm=self.algorithm.describe(),
            counts=dict(self._counts),
            inflight_cost=self._inflight_cost,
        )

    def retry_after(self) -> float:
        """Seconds until the queue would have drained at the current pace."""
        # Runs for every refusal: plain comparisons rather than max(), the algorithm's
        # limit read directly rather than through self.limit.
        service = self.service.mean or _DEFAULT_QUEUE_WAIT
        limit = self._slots()
        if self._queued_costed and self.cost_model.fitted:
            # The work queued, each request at its own predicted time.
            work = self._work_ahead(_PRIORITIES[-1], self._queued, service)
            seconds = (work + service) / (limit if limit > 1 else 1)
        else:
            seconds = (self._queued + 1) / (limit if limit > 1 else 1) * service
        if seconds > _MAX_RETRY_AFTER:
            return _MAX_RETRY_AFTER
        return seconds if seconds > 0.001 else 0.001

    def client_gave_up(self, waited: float) -> None:
        """A client disconnected or timed out after ``waited`` seconds: learn its patience."""
        self.patience.add(waited, self.now())

    def limit_changed(self) -> None:
        """Grant queued tickets now if the limit was raised outside a release.

        Algorithms change the limit when a token is released, and the queue is
        served right after; call this when something else changed it.
        """
        self._dispatch(self.clock.now())

    # -------------------------------------------------------------- admission

    def submit(
        self,
        *,
        priority: Priority = Priority.DEFAULT,
        deadline: float | None = None,
        on_grant: Callable[[Token], None],
        on_reject: Callable[[Rejected], None],
        cost: float | None = None,
    ) -> Token | Ticket:
        """Admit now (returns a Token), queue (returns a Ticket) or raise Rejected.

        ``cost`` (> 0, optional): what this request costs (rows, tokens); once the cost
        model is fitted, deadlines and waits are judged on this request's own predicted
        service time and the predicted work queued ahead of it.
        """
        now = self.clock.now()
        self._arrived(now)
        if cost is not None:
            cost = check_cost(cost)
        if self._codel is not None:
            self._codel.tick(now, self._queued, self._oldest_enqueued_at)
        own_deadline = deadline
        deadline = self._effective_deadline(deadline, now)
        if deadline is not None and deadline <= now:
            raise self._refuse(RejectReason.DEADLINE, 0.0, cost)
        ahead = self._waiting_at_or_above(priority)
        if not ahead and (
            self._fits(priority, cost)
            if self.counts_cost
            else self._inflight < (self._cap(priority) if self._reserved else self.algorithm.limit)
        ):
            if (
                own_deadline is not None
                and now + self._finish_for(cost) > own_deadline
                and self._cannot_finish(now)
            ):
                raise self._refuse(RejectReason.DEADLINE, 0.0, cost)
            return self._grant(priority, deadline, now, now, cost)

        slots = self._slots()  # what the queue drains through
        # The high service-time percentile sorts a window: read it only for a deadline.
        service_high = self._high_for(cost) if deadline is not None else None
        service_mean = self.service.mean
        costed = service_mean is not None and self._costed_ahead(priority, cost)
        if deadline is not None and service_mean is not None and service_high is not None:
            if costed and self._by_predicted():
                # Served before the shorter ones queued, not after all of them.
                expected_wait = (
                    self._work_before(priority, self._predicted(cost)) + service_mean
                ) / slots
            elif costed:
                expected_wait = (
                    self._work_ahead(priority, ahead, service_mean) + service_mean
                ) / slots
            else:
                expected_wait = (
                    self._first_slot_free(now, slots, service_mean, service_high)
                    + ahead / slots * service_mean
                )
            if now + expected_wait + service_high > deadline:
                raise self._refuse(RejectReason.DEADLINE, 0.0, cost)

        # A request that carries its own deadline waits by that deadline and at most
        # one service time; the adaptive bound is for clients whose patience is unknown.
        patient = own_deadline is None
        max_wait = self._max_wait(adaptive=patient)
        if (
            (
                self.discipline is _FIFO
                or (self.discipline is _SHORTEST and not (costed and self._by_predicted()))
            )
            and ahead  # nothing ahead: it may still be granted before max_wait
            and service_mean is not None
            and (
                self._work_fills_wait(priority, ahead, service_mean, slots, max_wait)
                if costed
                else ahead / slots * service_mean >= max_wait
            )
        ):
            # The queue is full in time: what is ahead alone takes the whole wait
            # bound, so this request would only time out in the queue. Refusing now
            # answers the client at once instead of after max_wait.
            if patient:
                self.wait_bound.pressed()
            raise self._refuse(RejectReason.LIMIT, 0.0, cost)

        if self._queued >= self.max_queue:
            # Only a queued ticket can make room (max_queue=0 never queues).
            victim = self._least_critical_below(priority) if self._queued else None
            if victim is None:
                raise self._refuse(RejectReason.LIMIT, 0.0, cost)
            self._evict(victim, RejectReason.PRIORITY, now)

        wait_expiry = now + max_wait
        expiry = wait_expiry
        if deadline is not None:
            expiry = min(expiry, deadline - (service_high or 0.0))
            if expiry <= now:
                raise self._refuse(RejectReason.DEADLINE, 0.0, cost)
        self._seq += 1
        ticket = Ticket(priority, deadline, now, wait_expiry, self._seq, on_grant, on_reject, cost)
        self._queues[priority].append(ticket)
        if self._shortest is not None:
            self._shortest.add(priority, ticket)
        self._queued += 1
        self._queued_by_priority[priority] += 1
        if cost is not None:
            self._queued_costed += 1
            self._costed_by_priority[priority] += 1
            self._cost_by_priority[priority] += cost
        self._counts["queued"] += 1
        heapq.heappush(self._expiries, (expiry, ticket.seq, ticket))
        return ticket

    def grant_now(
        self,
        *,
        priority: Priority = Priority.DEFAULT,
        deadline: float | None = None,
        cost: float | None = None,
    ) -> Token | None:
        """A token if one is free right now for this priority, else None (nothing is
        counted: the caller goes on to :meth:`submit`). The uncontended fast path.
        ``cost`` as for :meth:`submit`."""
        if cost is not None:
            cost = check_cost(cost)
        if self.counts_cost:
            if not self._fits(priority, cost):
                return None
        # Kept lean (it runs for every request): no reserved shares means the cap is the limit.
        elif self._inflight >= (self._cap(priority) if self._reserved else self.algorithm.limit):
            return None
        if self._queued and self._waiting_at_or_above(priority):
            return None
        now = self.now()
        self._arrived(now)
        if deadline is None:  # _effective_deadline, inlined: one call fewer per request
            patience = self.patience.patience if self.learn_patience else None
            if patience is not None:
                deadline = now + patience  # > now: patience is learned from waits > 0
        elif deadline <= now or (
            now + (self._finish_estimate if cost is None else self._finish_for(cost)) > deadline
            and self._cannot_finish(now)
        ):
            return None  # submit() refuses it and counts the reason
        return self._grant(priority, deadline, now, now, cost)

    def try_acquire(
        self,
        *,
        priority: Priority = Priority.DEFAULT,
        deadline: float | None = None,
        cost: float | None = None,
    ) -> Token:
        """Admit now or raise Rejected; never queues. ``cost`` as for :meth:`submit`."""
        now = self.clock.now()
        self._arrived(now)
        if cost is not None:
            cost = check_cost(cost)
        own_deadline = deadline
        deadline = self._effective_deadline(deadline, now)
        if deadline is not None and deadline <= now:
            raise self._refuse(RejectReason.DEADLINE, 0.0, cost)
        if self._can_admit(priority, cost) and not self._waiting_at_or_above(priority):
            if (
                own_deadline is not None
                and now + self._finish_for(cost) > own_deadline
                and self._cannot_finish(now)
            ):
                raise self._refuse(RejectReason.DEADLINE, 0.0, cost)
            return self._grant(priority, deadline, now, now, cost)
        raise self._refuse(RejectReason.LIMIT, 0.0, cost)

    def cancel(self, ticket: Ticket, reason: RejectReason = RejectReason.CLIENT_GONE) -> bool:
        """Take a ticket out of the queue without calling its callbacks.

        Returns False if it was no longer queued (already granted or rejected). A
        ``client_gone`` cancellation also teaches the limiter the client's patience.
        """
        if ticket._state is not _State.QUEUED:
            return False
        now = self.clock.now()
        ticket._state = _State.CANCELLED
        self._dequeued(ticket)
        waited = now - ticket.enqueued_at
        if reason is RejectReason.CLIENT_GONE:
            self.patience.add(waited, now)
            if self._feed_algorithm:
                self.algorithm.gave_up(now)
        self._count_reject(reason, waited, ticket.cost)
        self._compact()
        return True

    def next_expiry(self) -> float | None:
        """The earliest clock time at which :meth:`expire` may evict a queued ticket."""
        heap = self._expiries
        while heap and heap[0][2]._state is not _State.QUEUED:
            heapq.heappop(heap)
        earliest = heap[0][0] if heap else None
        codel = self._codel
        if codel is not None and self._queued:
            if codel.overloaded:
                oldest = self._oldest_queued()
                if oldest is not None:
                    short = oldest.enqueued_at + codel.short_wait(self._max_wait())
                    earliest = short if earliest is None else min(earliest, short)
            tick = codel.interval_end
            earliest = tick if earliest is None else min(earliest, tick)
        return earliest

    def expire(self) -> None:
        """Evict queued tickets whose wait or deadline ran out (calls their on_reject)."""
        now = self.clock.now()
        codel = self._codel
        if codel is not None:
            codel.tick(now, self._queued, self._oldest_enqueued_at)
            if codel.overloaded:
                short_wait = codel.short_wait(self._max_wait())
                for queue in self._queues:
                    for ticket in list(queue):
                        if (
                            ticket._state is _State.QUEUED
                            and ticket.enqueued_at + short_wait <= now
                        ):
                            self._evict(ticket, RejectReason.QUEUE_TIMEOUT, now)
        heap = self._expiries
        while heap and (heap[0][0] <= now or heap[0][2]._state is not _State.QUEUED):
            _, _, ticket = heapq.heappop(heap)
            if ticket._state is _State.QUEUED:
                timed_out = ticket.wait_expiry <= now
                if timed_out and ticket.deadline is None:
                    self.wait_bound.pressed()
                reason = RejectReason.QUEUE_TIMEOUT if timed_out else RejectReason.DEADLINE
                self._evict(ticket, reason, now)
        self._compact()

    # -------------------------------------------------------------- internals

    def _arrived(self, now: float) -> None:
        """A request arrived. After a quiet of over a second that was also long against
        the service time, the give-ups since the last arrival were the load leaving (a
        load test that ended, connections drained), not clients out of patience: a
        client that times out under load sends again, and open-loop traffic goes on."""
        last = self._last_arrival
        self._last_arrival = now
        if now - last > _QUIET_MIN_S and last > -_INF:
            service = self.service.mean
            if service is None or now - last > _QUIET_SERVICES * service:
                self.patience.forget_after(last)

    def _effective_deadline(self, deadline: float | None, now: float) -> float | None:
        if deadline is None and self.learn_patience:
            patience = self.patience.patience
            if patience is not None:
                return now + patience
        return deadline

    def _finish_for(self, cost: float | None) -> float:
        """The time a request of ``cost`` granted now should take: once the cost model is
        fitted and a success was seen, its predicted (mean) service time; else the
        cost-blind :attr:`_finish_estimate` (0 before the first success)."""
        if cost is not None and self._finish_estimate > 0:
            predicted = self.cost_model.predict(cost)
            if predicted is not None:
                return predicted
        return self._finish_estimate

    def _high_for(self, cost: float | None) -> float | None:
        """The conservative service time of a request of ``cost`` (the cost-blind high
        percentile without a cost or a fitted model)."""
        if cost is not None:
            high = self.cost_model.high(cost)
            if high is not None:
                return high
        return self.service.high

    def _costed_ahead(self, priority: Priority, cost: float | None) -> bool:
        """Whether waits are predicted from costs: the model is fitted and this request
        or one queued at or above its class carries a cost."""
        if not self.cost_model.fitted:
            return False
        return cost is not None or any(self._costed_by_priority[: priority + 1])

    def _work_ahead(self, priority: Priority, ahead: int, service_mean: float) -> float:
        """Predicted seconds of service queued at or above ``priority`` (``ahead``
        tickets): each costed one at intercept + slope x cost, the others at the mean."""
        costed = sum(self._costed_by_priority[: priority + 1])
        if not costed:
            return ahead * service_mean
        model = self.cost_model
        intercept, slope = model.intercept, model.slope
        assert intercept is not None and slope is not None
        cost = sum(self._cost_by_priority[: priority + 1])
        return intercept * costed + slope * cost + service_mean * (ahead - costed)

    def _work_fills_wait(
        self, priority: Priority, ahead: int, service_mean: float, slots: int, max_wait: float
    ) -> bool:
        """Whether the predicted work queued ahead (``ahead`` tickets at or above
        ``priority``), drained through ``slots``, fills the wait bound ``max_wait``, each
        costed ticket counted at most ``max_wait``: one request, however big, holds one
        slot while the others drain, so with two slots or more it alone cannot fill the
        queue (with one, it does: all behind it wait for its end)."""
        if self._work_ahead(priority, ahead, service_mean) / slots < max_wait:
            return False  # the sums already say not full; capping only lowers them
        # The sums say full: count again, ticket by ticket, with each costed one capped.
        # Only on this path (most requests never get here), and it stops once full.
        model = self.cost_model
        intercept, slope = model.intercept, model.slope
        assert intercept is not None and slope is not None
        work = service_mean * (ahead - sum(self._costed_by_priority[: priority + 1]))
        if work / slots >= max_wait:
            return True
        for queue in self._queues[: priority + 1]:
            for ticket in queue:
                cost = ticket.cost
                if cost is not None and ticket._state is _State.QUEUED:
                    seconds = intercept + slope * cost
                    work += seconds if seconds < max_wait else max_wait
                    if work / slots >= max_wait:
                        return True
        return False

    def _cannot_finish(self, now: float) -> bool:
        """Whether to refuse a request the estimate says cannot finish before its
        deadline (asked only then): yes, unless no success was seen for ten
        estimates (at least 1 s); then this one runs as a probe, and the next probe
        waits as long again."""
        stale_after = self._finish_estimate * _STALE_ESTIMATES
        if now - self._success_at < (stale_after if stale_after > _STALE_MIN_S else _STALE_MIN_S):
            return True
        self._success_at = now
        return False

    def _max_wait(self, adaptive: bool = False) -> float:
        if self.max_queue_wait is not None:
            return self.max_queue_wait
        service = self.service.mean
        if service is None:
            return _DEFAULT_QUEUE_WAIT
        floor = service
        held = self.algorithm.held_ahead
        if held > 0:
            # Jobs held ahead of the workers wait in flight: a request's time in flight
            # is then its service plus that wait, and "one service time" is the part
            # of it spent in a worker (Little's law with every slot full).
            limit = self.algorithm.limit
            if limit > held:
                floor = service * (limit - held) / limit
        if not adaptive:
            return floor
        return self.wait_bound.bound(service, self.patience.earliest, floor)

    def max_wait(self, *, own_deadline: bool = False) -> float:
        """The queue-wait bound a request queued now gets, in seconds: the adaptive
        bound for one without a deadline of its own, one mean service time for one with
        (unless ``max_queue_wait`` is set)."""
        return self._max_wait(adaptive=not own_deadline)

    def _cap(self, priority: Priority) -> int:
        """Slots this class may use: the limit less what is reserved for more critical ones."""
        limit = self.limit
        if not self._reserved:
            return limit
        held_back = 0
        for other, share in self._reserved.items():
            if other < priority:
                held_back += max(0, math.floor(share * limit) - self._inflight_by_priority[other])
        return limit - held_back

    def _can_admit(self, priority: Priority, cost: float | None) -> bool:
        """Whether a request of this class and ``cost`` fits under the limit now."""
        if self.counts_cost:
            return self._fits(priority, cost)
        return self._inflight < self._cap(priority)

    def _fits(self, priority: Priority, cost: float | None) -> bool:
        """With the limit in cost units: whether ``cost`` (one unit when None) fits in
        what this class may use (the limit less the unused shares reserved for more
        critical classes). A request costing more than that runs alone: with nothing
        in flight it always fits, so no cost is refused for being too big."""
        if not self._inflight:
            return True
        limit = self.algorithm.limit
        room = limit - self._inflight_cost
        if self._reserved:
            for other, share in self._reserved.items():
                if other < priority:
                    unused = share * limit - self._inflight_cost_by_priority[other]
                    if unused > 0:
                        room -= unused
        return (1.0 if cost is None else cost) <= room

    def _slots(self) -> int:
        """How many requests the queue drains through at once: the limit, or with the
        limit in cost units the requests in flight (the cost limit is reached whenever
        requests queue, so that is how many it holds at a time)."""
        slots = self._inflight if self.counts_cost else self.algorithm.limit
        return slots if slots > 1 else 1

    def _waiting_at_or_above(self, priority: Priority) -> int:
        """Live tickets queued at this priority or a more critical one."""
        if not self._queued:
            return 0
        return sum(self._queued_by_priority[: priority + 1])

    def _least_critical_below(self, priority: Priority) -> Ticket | None:
        """The oldest queued ticket of the least critical class less critical than ``priority``."""
        for level in reversed(_PRIORITIES):
            if level <= priority:
                return None
            for ticket in self._queues[level]:
                if ticket._state is _State.QUEUED:
                    return ticket
        return None

    def _oldest_queued(self) -> Ticket | None:
        oldest: Ticket | None = None
        for queue in self._queues:
            for ticket in queue:
                if ticket._state is _State.QUEUED:
                    if oldest is None or ticket.enqueued_at < oldest.enqueued_at:
                        oldest = ticket
                    break
        return oldest

    def _grant(
        self,
        priority: Priority,
        deadline: float | None,
        now: float,
        enqueued_at: float,
        cost: float | None = None,
    ) -> Token:
        self._inflight += 1
        self._inflight_by_priority[priority] += 1
        if self.counts_cost:
            units = 1.0 if cost is None else cost
            self._inflight_cost += units
            self._inflight_cost_by_priority[priority] += units
        self._counts["admitted"] += 1
        queue_wait = now - enqueued_at
        token = Token(self, priority, deadline, now, queue_wait, self._inflight, cost)
        self._granted_at = now
        if cost is not None:
            self.cost_counts["admitted"] += cost
        if self._listeners:
            for listener in self._listeners:
                listener.on_admit(queue_wait, priority)
        return token

    def _refuse(self, reason: RejectReason, waited: float, cost: float | None = None) -> Rejected:
        self._count_reject(reason, waited, cost)
        return Rejected(reason, self.retry_after())

    def _count_reject(self, reason: RejectReason, waited: float, cost: float | None = None) -> None:
        self._counts[REJECT_COUNT_KEYS[reason]] += 1
        if cost is not None:
            self.cost_counts["refused"] += cost
        for listener in self._listeners:
            listener.on_reject(reason, waited)

    def _dequeued(self, ticket: Ticket) -> None:
        if self._shortest is not None:
            self._shortest.removed(ticket.priority, ticket)
        self._queued -= 1
        priority = ticket.priority
        self._queued_by_priority[priority] -= 1
        cost = ticket.cost
        if cost is not None:
            self._queued_costed -= 1
            self._costed_by_priority[priority] -= 1
            if self._costed_by_priority[priority]:
                self._cost_by_priority[priority] -= cost
            else:
                self._cost_by_priority[priority] = 0.0  # no float residue left behind

    def _evict(self, ticket: Ticket, reason: RejectReason, now: float) -> None:
        ticket._state = _State.REJECTED
        self._dequeued(ticket)
        self._count_reject(reason, now - ticket.enqueued_at, ticket.cost)
        ticket.on_reject(Rejected(reason, self.retry_after()))

    def _first_slot_free(self, now: float, slots: int, mean: float, high: float) -> float:
        """When a slot should next be free, in seconds from ``now``: the mean service
        time shared by the slots; with a single slot and steady service times (the
        high one within 1.25 x the mean) and one request in flight, what that one has
        left, ``high`` less its age (read as the time since the last grant: never
        older than it is), plus a fifth of the mean for timing noise: behind one that has
        run 0.8 of its time a request waits 0.2 of it, not all of it. (Without the
        margin, 64 clients that retry at once and leave after two services of 50 ms,
        with 1 ms of dispatch, locked ``little+headroom`` in at 0.02 of capacity:
        every request queued to the edge of its clients' patience was served just
        after they left. With spread, age says little: an exponential request has a
        mean left whatever its age, and a log-normal one that ran long tends to run
        longer. With several slots, when the first frees depends on how their
        requests are staggered: in step after a burst they all free at once.)"""
        if slots == 1 and self._inflight == 1 and high <= _STEADY_HIGH * mean:
            age = now - self._granted_at
            if age < high:  # (overdue, it says nothing: it may be waiting for a worker)
                left = high - age + _AGE_MARGIN * mean
                if left < mean:
                    return left
        return mean / slots

    def _vacate(self, token: Token) -> None:
        now = self.now()
        token._vacated_at = now
        self._inflight -= 1
        self._inflight_by_priority[token.priority] -= 1
        if self.counts_cost:
            self._cost_freed(token)
        if self._queued:
            self._dispatch(now)

    def _cost_freed(self, token: Token) -> None:
        """Take a token's cost units out of those in flight (limit in cost units)."""
        if not self._inflight:  # nothing held: no float residue left behind
            self._inflight_cost = 0.0
            self._inflight_cost_by_priority = [0.0] * len(_PRIORITIES)
            return
        units = 1.0 if token.cost is None else token.cost
        self._inflight_cost -= units
        self._inflight_cost_by_priority[token.priority] -= units

    def _release(self, token: Token, outcome: Outcome) -> None:
        now = self.now()
        if not token._vacated:
            self._inflight -= 1
            self._inflight_by_priority[token.priority] -= 1
            if self.counts_cost:
                self._cost_freed(token)
        service_s = now - token.admitted_at
        self._counts[outcome] += 1  # a str enum: finds the key of its value
        if outcome is _SUCCESS:
            cost = token.cost
            if cost is not None:
                self.cost_model.add(cost, service_s)
                self.cost_counts["completed"] += cost
            service = self.service
            service.add(service_s)
            mean = service.mean
            if mean is not None and service_s >= 0:  # a sample the estimator took
                self._finish_estimate = service_s if service_s < mean else mean
                self._success_at = now
                self.patience.served(token.queue_wait + service_s, now)
                if token.queue_wait > 0 and token.deadline is None and self.max_queue_wait is None:
                    self.wait_bound.succeeded(
                        token.queue_wait, mean, self._slots(), self.patience.earliest
                    )
        if outcome is not _IGNORED and self._feed_algorithm:
            # tuple.__new__ builds the named tuple without its Python-level __new__.
            deadline = token.deadline
            slack = _INF if deadline is None else deadline - now
            cost = token.cost
            work, excess = (
                (1.0, 0.0)
                if cost is None
                else (self.cost_model.work(cost), self.cost_model.excess(cost))
            )
            # The algorithm sees the slot's time: a vacated slot was handed on when the
            # work ended, before the response was sent. Timed at the release, the
            # request its slot went to would look admitted before this one ended and
            # count its completion as one of its own (one worker read as two).
            freed_at = token._vacated_at if token._vacated else now
            sample = _new_sample(
                Sample,
                (
                    freed_at - token.admitted_at,
                    token.inflight_at_admit,
                    outcome is _DROPPED,
                    freed_at,
                    self._queued,
                    slack,
                    token.queue_wait,
                    work,
                    excess,
                ),
            )
            self.algorithm.update(sample)
        if self._listeners:
            for listener in self._listeners:
                listener.on_release(outcome, service_s)
        if self._queued:
            self._dispatch(now)
        elif self._codel is not None:
            self._codel.emptied()

    def _predicted(self, cost: float | None) -> float:
        """A request's predicted service time, the order of the ``shortest`` discipline:
        from its cost once the cost model is fitted, else the mean (0 before any)."""
        if cost is not None:
            predicted = self.cost_model.predict(cost)
            if predicted is not None:
                return predicted
        mean = self.service.mean
        return 0.0 if mean is None else mean

    def _by_predicted(self) -> bool:
        """Whether the queue goes by predicted service time now: the ``shortest``
        discipline with a cost model whose time grows with the cost (with none fitted
        yet, or a slope of 0, costs do not order requests: first come, first served)."""
        slope = self.cost_model.slope
        return self._shortest is not None and slope is not None and slope > 0

    def _work_before(self, priority: Priority, predicted: float) -> float:
        """Predicted seconds of service the ``shortest`` discipline grants before a
        request of ``priority`` predicted to take ``predicted`` (:meth:`_by_predicted`):
        every request queued in a more critical class, and those of its own class
        predicted no longer (costed ones at intercept + slope x cost, the others at
        the mean)."""
        index = self._shortest
        model = self.cost_model
        intercept, slope = model.intercept, model.slope
        assert index is not None and intercept is not None and slope is not None
        mean = self._predicted(None)
        work = 0.0
        for level in range(priority):
            costed = self._costed_by_priority[level]
            uncosted = self._queued_by_priority[level] - costed
            work += intercept * costed + slope * self._cost_by_priority[level] + uncosted * mean
        count, total = index.costed_upto(priority, (predicted - intercept) / slope)
        work += intercept * count + slope * total
        if mean <= predicted:
            work += (self._queued_by_priority[priority] - self._costed_by_priority[priority]) * mean
        return work

    def _next_shortest(self) -> Ticket | None:
        """Take the live ticket predicted to be shortest, most critical class first
        (the oldest among equals); None when it does not fit under the limit now."""
        index = self._shortest
        model = self.cost_model
        intercept, slope = model.intercept, model.slope
        assert index is not None and intercept is not None and slope is not None

        def predict(cost: float) -> float:
            return intercept + slope * cost

        mean = self._predicted(None)
        for level in range(len(self._queues)):
            ticket = index.first(level, _is_queued, predict, mean)
            if ticket is None:
                continue
            if not self._can_admit(_PRIORITIES[level], ticket.cost):
                return None
            index.take(level, ticket)
            # Taken out of turn, it stays in the arrival-order deque: drop the dead
            # ones there now and then, or a request starved at its head would keep
            # every later one granted behind it.
            self._compact()
            return ticket
        return None

    def _next_ticket(self) -> Ticket | None:
        """Pop the next live ticket to serve, most critical class first."""
        if self._queued_costed and self._by_predicted():
            return self._next_shortest()
        codel = self._codel
        lifo = self.discipline is _LIFO or (codel is not None and codel.overloaded)
        for level, queue in enumerate(self._queues):
            while queue:
                ticket = queue[-1] if lifo else queue[0]
                if ticket._state is not _State.QUEUED:
                    queue.pop() if lifo else queue.popleft()
                    continue
                if not self._can_admit(_PRIORITIES[level], ticket.cost):
                    return None  # head-of-line: a big request is not passed over
                queue.pop() if lifo else queue.popleft()
                return ticket
        return None

    def _dispatch(self, now: float) -> None:
        """Grant queued tickets while slots are free (re-entrant calls fold into this loop)."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while self._queued:
                ticket = self._next_ticket()
                if ticket is None:
                    break
                if (
                    ticket.deadline is not None
                    and now + (self._high_for(ticket.cost) or 0.0) > ticket.deadline
                ):
                    self._evict(ticket, RejectReason.DEADLINE, now)
                    continue
                ticket._state = _State.GRANTED
                self._dequeued(ticket)
                wait = now - ticket.enqueued_at
                if self._codel is not None:
                    self._codel.granted(wait)
                ticket.on_grant(
                    self._grant(
                        ticket.priority, ticket.deadline, now, ticket.enqueued_at, ticket.cost
                    )
                )
            if not self._queued and self._codel is not None:
                self._codel.emptied()
        finally:
            self._dispatching = False

    def _oldest_enqueued_at(self) -> float | None:
        oldest = self._oldest_queued()
        return oldest.enqueued_at if oldest is not None else None

    def _compact(self) -> None:
        """Drop dead tickets from the deques when they outnumber the live ones."""
        total = sum(len(q) for q in self._queues)
        if total > 64 and total > 2 * self._queued:
            for level, queue in enumerate(self._queues):
                self._queues[level] = deque(t for t in queue if t._state is _State.QUEUED)
            if self._shortest is not None:
                self._shortest.compact(_is_queued)
