"""The limit-algorithm contract: a small pure class that turns samples into a number.

Algorithms never do I/O, never import asyncio and never read a clock: the time of
each sample travels in the sample (``Sample.now``).
"""

from __future__ import annotations

import math
from typing import ClassVar, NamedTuple

from mypy_extensions import mypyc_attr

from loadshed.checks import check_int, check_number
from loadshed.errors import ConfigError

__all__ = ["LimitAlgorithm", "Sample", "Windowed", "check_bounds"]


class Sample(NamedTuple):
    """One admitted request's outcome, reported when its token is released.

    rtt: seconds from admission to release (service time as the limiter sees it), or
        to the moment its slot was handed on if that came first
        (:meth:`~loadshed.admission.Token.vacate`).
    inflight: requests in flight when this one was admitted, itself included.
    dropped: the request ended in a sign of overload (timeout, 503/429, deadline).
    now: clock time at release (or when the slot was handed on), in seconds.
    queued: requests waiting for admission at release (0 if unknown): demand beyond
        the limit, which tells an algorithm the limit is binding.
    slack: seconds left before the request's deadline (its own, or the clients'
        learned patience) when it was released; inf without one.
    waited: seconds the request waited for admission before it was admitted (0 if
        admitted at once or unknown).
    work: the request's predicted service as a share of a mean request's, from its
        cost (:meth:`loadshed.costmodel.CostModel.work`); 1.0 without a cost or
        before the cost model is fitted.
    excess: seconds the request's cost predicts it takes over a mean request
        (negative for a cheap one; :meth:`loadshed.costmodel.CostModel.excess`); 0.0
        without a cost or before the cost model is fitted. ``rtt - excess`` is the
        latency a mean request would have had.

    A named tuple (immutable, like a frozen dataclass) because one is built per
    released request: on CPython 3.11 a frozen dataclass took ~1 us to build, a
    named tuple ~0.3 us.
    """

    rtt: float
    inflight: int
    dropped: bool
    now: float
    queued: int = 0
    slack: float = math.inf
    waited: float = 0.0
    work: float = 1.0
    excess: float = 0.0


def check_bounds(initial: int, min_limit: int, max_limit: int) -> None:
    """Validate a limit's bounds (integers, 1 <= min_limit <= initial <= max_limit);
    raise :class:`ConfigError` naming the field."""
    check_int("min_limit", min_limit, minimum=1)
    check_int("max_limit", max_limit, minimum=min_limit)
    check_int("initial_limit", initial, minimum=min_limit, maximum=max_limit)


# In the compiled build, algorithms written in Python may still subclass this. Not an
# abc.ABC: mypyc's compiled subclasses of an ABC share its isinstance cache, so one
# isinstance(x, Gradient) that is False made isinstance(x, LimitAlgorithm) False too.
# Admission calls check() at start-up instead: both members must be defined.
@mypyc_attr(allow_interpreted_subclasses=True)
class LimitAlgorithm:
    """Turns samples into a concurrency limit (an integer in [min_limit, max_limit]).

    Subclasses define :attr:`limit` and :meth:`update`.
    """

    # ClassVar: a subclass's own value is read (compiled, a plain default would
    # become an instance default that an interpreted subclass cannot override).
    name: ClassVar[str] = "limit"
    uses_samples: ClassVar[bool] = True
    """False when :meth:`update` ignores its sample: the limiter then builds none."""
    min_limit: int = 1
    max_limit: int = 1

    @property
    def limit(self) -> int:
        """The current limit."""
        raise NotImplementedError(f"{type(self).__name__} must define the limit property")

    def update(self, sample: Sample) -> int:
        """Fold one sample in and return the new limit."""
        raise NotImplementedError(f"{type(self).__name__} must define update()")

    def gave_up(self, now: float) -> None:
        """A client left while its request waited for admission (never admitted, so
        no sample): its patience was shorter than the queue. ``now`` is the clock time.
        The default ignores it."""

    @property
    def headroom(self) -> int:
        """Slots of the limit over the algorithm's own estimate, kept because they add
        throughput (``Little``: a job held ahead per worker); 0 for the others."""
        return 0

    @property
    def held_ahead(self) -> int:
        """Slots of the limit that hold jobs ahead of the workers rather than serve
        at once (the headroom, and a trial's extra slot while it measures one). The
        admission core's queue-wait floor, one service time, is then the mean time in
        flight x (limit - held_ahead) / limit: what a request spends in a worker when
        every slot is full."""
        return self.headroom

    def check(self) -> None:
        """Make ready for use, or raise :class:`ConfigError` (field ``limit``) naming
        the members a subclass must define but does not. Admission calls it at start-up.

        Also settles ``min_limit`` and ``max_limit``: in the compiled build they are
        slots of the compiled base, which a Python subclass's class attributes
        (``max_limit = 3`` in the class body) shadow for Python code only. Copying
        what Python sees into them makes compiled code (``_clamp``, ``Windowed``)
        see the same bounds; in pure Python it changes nothing.
        """
        cls = type(self)
        missing = [
            name
            for name, inherited in (("limit", cls.limit), ("update", cls.update))
            if inherited is getattr(LimitAlgorithm, name)
        ]
        if missing:
            raise ConfigError(
                "limit",
                f"{cls.__name__} is not a complete LimitAlgorithm (define "
                + " and ".join(missing)
                + ")",
            )
        # A generic lookup on purpose: it sees a Python subclass's class attribute.
        self.min_limit = getattr(self, "min_limit")  # noqa: B009
        self.max_limit = getattr(self, "max_limit")  # noqa: B009

    def _clamp(self, value: float) -> int:
        """Round down and clamp to [min_limit, max_limit]; NaN keeps min_limit."""
        if math.isnan(value):
            return self.min_limit
        return max(self.min_limit, min(self.max_limit, int(value)))

    def describe(self) -> str:
        """Short human-readable state, for logs and the CLI."""
        return f"{self.name}(limit={self.limit})"


class Windowed(LimitAlgorithm):
    """Feeds a wrapped algorithm per-window aggregates instead of every sample.

    A window closes once it is at least ``window`` seconds long and holds at least
    ``min_samples`` samples; the wrapped algorithm then sees one sample with the
    window's average rtt, maximum inflight and whether any sample was dropped.
    Samples shorter than ``min_rtt`` (100 us by default) are ignored as noise.

    With ``close_on_drop`` a drop closes its window at once, so a loss-based rule
    backs off on the first refusal instead of after a whole window of them; and, as
    TCP's fast recovery does, only drops of requests admitted after the last such
    close count, since those admitted before it saw the limit that was just cut
    (one back-off per round trip, however many refusals it brings back).
    """

    name = "windowed"

    def __init__(
        self,
        inner: LimitAlgorithm,
        *,
        window: float = 1.0,
        min_samples: int = 10,
        min_rtt: float = 100e-6,
        close_on_drop: bool = False,
    ) -> None:
        window = check_number("window", window, minimum=0, min_open=True, unit="seconds")
        if not isinstance(close_on_drop, bool):
            raise ConfigError("close_on_drop", f"must be true or false, got {close_on_drop!r}")
        min_samples = check_int("min_samples", min_samples, minimum=1)
        min_rtt = check_number("min_rtt", min_rtt, minimum=0, unit="seconds")
        inner.check()
        self.inner = inner
        self.min_limit = inner.min_limit
        self.max_limit = inner.max_limit
        self.window = window
        self.min_samples = min_samples
        self.min_rtt = min_rtt
        self.close_on_drop = close_on_drop
        self._recovery_point = -math.inf  # admissions before this saw a limit since cut
        self._start: float | None = None
        self._count = 0
        self._rtt_sum = 0.0
        self._max_inflight = 0
        self._dropped = False

    @property
    def limit(self) -> int:
        return self.inner.limit

    def update(self, sample: Sample) -> int:
        if sample.rtt < self.min_rtt and not sample.dropped:
            return self.inner.limit
        if self._start is None:
            self._start = sample.now
        self._count += 1
        self._rtt_sum += sample.rtt
        self._max_inflight = max(self._max_inflight, sample.inflight)
        if not self.close_on_drop:
            self._dropped = self._dropped or sample.dropped
            full = sample.now - self._start >= self.window and self._count >= self.min_samples
        else:
            fresh_drop = sample.dropped and sample.now - sample.rtt >= self._recovery_point
            self._dropped = self._dropped or fresh_drop
            full = fresh_drop or (
                sample.now - self._start >= self.window and self._count >= self.min_samples
            )
            if fresh_drop:
                self._recovery_point = sample.now
        if full:
            aggregate = Sample(
                rtt=self._rtt_sum / self._count,
                inflight=self._max_inflight,
                dropped=self._dropped,
                now=sample.now,
            )
            self._start = None
            self._count = 0
            self._rtt_sum = 0.0
            self._max_inflight = 0
            self._dropped = False
            return self.inner.update(aggregate)
        return self.inner.limit

    def describe(self) -> str:
        return f"windowed({self.inner.describe()})"
