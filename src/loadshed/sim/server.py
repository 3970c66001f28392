"""A replica: the admission core in front of an origin, driven by callbacks in
virtual time (no asyncio).

The replica translates simulator events into limiter calls, exactly as an
integration does in real time: ``submit`` on arrival, ``release`` with the outcome
when the origin answers, ``cancel`` and ``client_gave_up`` when the client leaves,
and ``expire`` at the limiter's next expiry time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from loadshed.admission import Admission, Token
from loadshed.errors import Outcome, Priority, Rejected
from loadshed.sim.engine import Engine
from loadshed.sim.metrics import LimitTrace
from loadshed.sim.origin import Origin
from loadshed.sim.request import Request, Status
from loadshed.sim.service import ServiceModel

__all__ = ["Replica"]

_DEFAULT = Priority.DEFAULT
_SUCCESS = Outcome.SUCCESS
_DROPPED = Outcome.DROPPED


class Replica:
    """One server: optional admission core, then an :class:`Origin` with ``workers``.

    ``admission`` None is the unprotected baseline (``--limit none``): every request
    goes straight to the origin's own queue. ``one_way`` is half the network round
    trip, added to every response on its way back to the client. ``dispatch`` is the
    server's own time between admitting a request and a worker receiving it (parsing,
    serialisation, the pipe to a worker process): a worker with no job waiting at the
    origin idles that long between jobs, as a ``ModelRunner`` worker does with nothing
    handed ahead.
    """

    __slots__ = (
        "_engine",
        "_expiry_at",
        "_limit_now",
        "_now",
        "admission",
        "cost_aware",
        "dispatch",
        "index",
        "limit_trace",
        "on_outstanding",
        "one_way",
        "origin",
        "outstanding",
    )

    def __init__(
        self,
        engine: Engine,
        *,
        workers: int,
        service: ServiceModel,
        admission: Admission | None,
        one_way: float,
        origin_queue: int | None = None,
        index: int = 0,
        cost_aware: bool = False,
        dispatch: float = 0.0,
    ) -> None:
        self._engine = engine
        self._now = engine.clock.now
        self.origin = Origin(engine, workers, service, self._origin_done, max_queue=origin_queue)
        self.admission = admission
        self.cost_aware = cost_aware
        """Tell the limiter each request's cost (False: cost-blind, as without costs)."""
        self.one_way = one_way
        self.dispatch = dispatch
        self.index = index
        self.outstanding = 0
        """Requests at this replica not yet answered (what a balancer counts)."""
        self.on_outstanding: Callable[[Replica, int], None] | None = None
        """Called with (replica, previous count) whenever ``outstanding`` changes."""
        self._expiry_at = math.inf
        now = engine.clock.now()
        self._limit_now = admission.limit if admission is not None else 0
        self.limit_trace = LimitTrace(now, self._limit_now) if admission is not None else None

    # -- arrivals ---------------------------------------------------------------

    def arrive(self, request: Request) -> None:
        """A request reaches the server (the current virtual time)."""
        if request.client_gone:
            return
        now = self._now()
        request.replica = self
        request.arrived_at = now
        request.served = False
        self.outstanding += 1
        if self.on_outstanding is not None:
            self.on_outstanding(self, self.outstanding - 1)
        admission = self.admission
        if admission is None:
            self._dispatch(request)
            return
        try:
            result = admission.submit(
                priority=_DEFAULT,
                deadline=request.deadline,
                on_grant=request.granted,
                on_reject=request.rejected,
                cost=request.cost if self.cost_aware else None,
            )
        except Rejected:
            # a refusal leaves the queue and the limit as they were (every simulated
            # request has the same priority, so none is evicted to make room)
            self._answer(request, Status.REJECTED)
            return
        if isinstance(result, Token):
            # admitted at once: neither the queue nor the limit changed
            request.token = result
            self._dispatch(request)
        else:
            request.ticket = result
            self._after_change()

    # -- admission callbacks ----------------------------------------------------

    def granted(self, request: Request, token: object) -> None:
        """A queued request was admitted: start it at the origin."""
        request.ticket = None
        request.token = token
        self._dispatch(request)

    def _dispatch(self, request: Request) -> None:
        """Hand an admitted request to the origin, ``dispatch`` seconds from now."""
        if self.dispatch > 0:
            self._engine.after(self.dispatch, self.origin.start, request)
        else:
            self.origin.start(request)

    def evicted(self, request: Request) -> None:
        """A queued request was refused later (queue timeout, deadline, priority)."""
        request.ticket = None
        self._answer(request, Status.REJECTED)

    # -- completion and departure -----------------------------------------------

    def _origin_done(self, request: Request, ok: bool) -> None:
        token = request.token
        if token is not None:
            request.token = None
            deadline = request.deadline
            late = request.client_gone or (deadline is not None and self._now() > deadline)
            token.release(_DROPPED if (late or not ok) else _SUCCESS)
            self._after_change()
        self._answer(request, Status.SUCCESS if ok else Status.ORIGIN_REJECTED)

    def client_left(self, request: Request) -> None:
        """The client timed out while the server still held its request."""
        admission = self.admission
        if admission is None:
            return
        if request.ticket is not None:
            # a client_gone cancellation teaches the limiter the client's patience
            admission.cancel(request.ticket)
            request.ticket = None
            # the request leaves the server now, unanswered
            self._departed(request)
        else:
            admission.client_gave_up(self._now() - request.arrived_at)
        # leaving can only make the earliest expiry later: the pending event is enough

    def _answer(self, request: Request, status: int) -> None:
        request.served = True
        self.outstanding -= 1
        if self.on_outstanding is not None:
            self.on_outstanding(self, self.outstanding + 1)
        request.owner.on_response(request, status, self._now() + self.one_way)

    def _departed(self, request: Request) -> None:
        request.served = True
        self.outstanding -= 1
        if self.on_outstanding is not None:
            self.on_outstanding(self, self.outstanding + 1)

    # -- limiter housekeeping ---------------------------------------------------

    def _after_change(self, not_before: float = 0.0) -> None:
        admission = self.admission
        assert admission is not None
        limit = admission.limit
        now = self._now()
        if limit != self._limit_now:
            self._limit_now = limit
            assert self.limit_trace is not None
            self.limit_trace.record(now, limit)
        next_expiry = admission.next_expiry()
        # keep one pending expiry event, at the earliest time needed
        if next_expiry is not None and next_expiry < self._expiry_at:
            when = max(next_expiry, now, not_before)
            self._expiry_at = when
            self._engine.at(when, self._expire, when)

    def _expire(self, when: float) -> None:
        if when != self._expiry_at:
            return  # superseded by an earlier expiry event
        self._expiry_at = math.inf
        assert self.admission is not None
        self.admission.expire()
        # if the limiter still reports an expiry due now (a deadline that float
        # rounding left a hair short of passing), look again a microsecond later
        # rather than spinning at the same virtual instant
        self._after_change(not_before=when + 1e-6)
