"""How long a queued request may wait when nobody set a bound: the adaptive wait bound.

A refused client that retries at once (hey, wrk, bombardier, most SDK retry loops)
comes straight back; refusing it gains nothing, costs a request's worth of CPU, and
under a storm of such retries takes the CPU the model needs. A queued client costs
nothing while it waits, as long as it is still there when its answer comes. So the
bound starts at one mean service time (a queued request waits about as long as it
then runs) and:

- **grows while clients are patient and the bound turns requests away**: after a
  request was refused or timed out in the queue because of the bound, the next
  success that waited at least half of it shows that clients wait that long; the
  bound grows by one slot's share of a service time (``mean / limit``), so it rises
  by about a second per second of queueing whatever the worker count. It never
  exceeds ``ceiling`` seconds of response time (wait plus the mean service time,
  read now: a model that gets slower shortens the wait at once), well inside any
  plausible client timeout;
- **shrinks at once when clients give up**: to half the learned patience (the time
  by which one client in ten leaves, from the first give-up on; see
  ``loadshed.estimate.PatienceEstimator``), and to at most that time less two mean
  service times, so that a request that waited the whole bound still has two mean
  service times of its client's patience left to be served in (with exponential
  service, one in seven runs longer than that); and it does not grow while that
  patience is known. The patience weighs give-ups against the clients served after
  waiting longer, and forgets old give-ups: a few clients that leave early (a load
  test closing its connections) do not hold the bound down for good. Deadlines the
  requests carry bound their own waits anyway.

It never goes below one mean service time: that was, and stays, the floor. The class
is pure: the admission core hands it every value it needs.
"""

from __future__ import annotations

from loadshed.checks import check_number

__all__ = ["DEFAULT_WAIT_CEILING", "AdaptiveWaitBound"]

DEFAULT_WAIT_CEILING = 1.0
"""Seconds: the longest response time (queue wait + service) the bound grows to while
no client has given up."""
_GROW_AT = 0.5  # a success that waited this share of the bound is evidence of patience
_SHRINK_TO = 0.5  # after a give-up, the bound is this share of the time that client waited
_SERVICE_LEFT = 2.0  # ... and leaves this many mean service times of it for the service


class AdaptiveWaitBound:
    """The queue-wait bound of a limiter without ``max_queue_wait``; see the module.

    ``ceiling`` (seconds, >= 0) caps the response time the bound may grow to while no
    client has given up; 0 keeps it at one mean service time.
    """

    __slots__ = ("_grown", "_pressed", "ceiling")

    def __init__(self, ceiling: float = DEFAULT_WAIT_CEILING) -> None:
        self.ceiling = check_number("adaptive_wait_ceiling", ceiling, minimum=0, unit="seconds")
        self._grown = 0.0  # seconds of wait earned by patient clients (0: none yet)
        self._pressed = False  # the bound turned a request away since it last grew

    def bound(
        self, service_mean: float, patience: float | None, floor: float | None = None
    ) -> float:
        """The wait bound now, in seconds, given the mean service time (a request's
        time in flight) and the learned patience (None while unknown); ``floor``, the
        least bound, is the mean service time unless given (less when jobs are held
        ahead of the workers and wait in flight)."""
        if floor is None:
            floor = service_mean
        wait = self._grown
        top = self.ceiling - service_mean
        if wait > top:
            wait = top
        if patience is not None:
            cut = min(patience * _SHRINK_TO, patience - _SERVICE_LEFT * service_mean)
            if wait > cut:
                wait = cut
        return wait if wait > floor else floor

    def pressed(self) -> None:
        """The bound turned a request away (refused as the queue was full in time, or
        timed out in the queue)."""
        self._pressed = True

    def succeeded(
        self, queue_wait: float, service_mean: float, limit: int, patience: float | None = None
    ) -> None:
        """A queued request succeeded after waiting ``queue_wait`` seconds; ``patience``
        as for :meth:`bound`."""
        if not self._pressed or patience is not None:
            return  # nothing to gain, or clients give up: no growth while they do
        current = self._grown if self._grown > service_mean else service_mean
        top = self.ceiling - service_mean
        if queue_wait < current * _GROW_AT or current >= top:
            return  # not near the bound (no evidence), or at the ceiling
        grown = current + service_mean / (limit if limit > 1 else 1)
        self._grown = grown if grown < top else top
        self._pressed = False
