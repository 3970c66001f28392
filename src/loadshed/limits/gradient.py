"""Envoy-style adaptive concurrency (the ``adaptive_concurrency`` gradient controller).

Reimplements the rule of Envoy's gradient controller in virtual time (samples carry
the clock, so intervals close on the first sample after their end):

- every update interval (``update_interval``; by default two min RTTs, at least
  100 ms): ``sample_rtt`` = the ``percentile`` of the interval's
  latencies; ``gradient = clamp((1 + buffer) x min_rtt / sample_rtt, 0.5, 2)``;
  ``x = gradient x L``; ``L = clamp(floor(x + sqrt(x)), min_limit, max_limit)``
  (``sqrt(x)`` is the burst headroom);
- ``min_rtt`` is measured at start and re-measured every ``probe_interval`` plus a
  random jitter of up to ``probe_jitter`` of it: the limit is pinned to
  ``probe_limit`` until ``probe_requests`` latencies of requests started during the
  probe are gathered; their percentile is the new ``min_rtt`` and the limit is
  restored. Five consecutive intervals that set the limit to ``min_limit`` (from
  ``min_limit``) trigger a re-measure at once.

Three details follow Envoy's ``gradient_controller.cc``:

- a measurement opens an epoch: the latency of a request admitted before the current
  measurement started never counts, neither during the measurement nor in the
  intervals after it (Envoy drops samples sent before ``min_rtt_epoch_``); with
  ``drop_backoff``, its drop still backs off the limit that admitted it;
- an interval without a latency (and, with ``drop_backoff``, without a drop) leaves
  the limit alone and neither adds to nor resets the count of intervals at the
  minimum (Envoy returns early on an empty histogram);
- the start-up measurement is open from the start: every request admitted since the
  algorithm was built counts (Envoy sets the epoch in the constructor), not only
  those admitted after the first request we hear of.
"""

from __future__ import annotations

import math
import random
from collections import deque

from loadshed.errors import ConfigError
from loadshed.limits.base import LimitAlgorithm, Sample, check_bounds

__all__ = ["Gradient"]

_AUTO_INTERVAL_FLOOR = 0.1  # seconds: Envoy's documented update interval
_MIN_STREAK_TO_PROBE = 5  # Envoy: 5 consecutive sample windows at the minimum


def _percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _positive_seconds(field: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(field, f"must be a finite number of seconds > 0, got {value}")


class Gradient(LimitAlgorithm):
    """Envoy-style gradient limit with periodic min-RTT re-measurement.

    Defaults (chosen for ML model endpoints: 1 to 64 workers, 10 ms to seconds per call):

    - ``initial_limit=4``, ``max_limit=128``: see :class:`~loadshed.limits.aimd.AIMD`.
    - ``min_limit=1`` separate from ``probe_limit=3`` (ours): Envoy uses its
      ``min_concurrency`` both as the probe limit and as the floor, so a floor high
      enough to make probes painless keeps an overloaded model from ever being shed
      enough to recover (Envoy issues #38338, #46532). The probe pins the limit to
      ``min(L, probe_limit)``, never raising it.
    - ``update_interval=None`` (ours): each interval lasts ``max(0.1 s, 2 x min_rtt)``,
      so that it sees the effect of the previous change even for calls of seconds,
      while fast models still get Envoy's 100 ms. A fixed 100 ms would let a
      1 s model's limit grow ten times before any latency reflects it; a fixed 1 s
      would make a 10 ms model ramp up ten times slower than it could.
    - ``percentile=0.5``, ``buffer=0.25``, ``probe_interval=60`` s,
      ``probe_jitter=0.15``: Envoy's values.
    - ``probe_requests=20`` and ``probe_timeout=1.0`` s (ours): the probe ends after 20
      latencies, or once it is ``probe_timeout`` old and holds at least one. Envoy
      waits for 50 latencies at a limit of 3, which at 1 s per call pins the limit
      for ~17 s, shedding after every deploy and every minute under load.
    - ``passive_probe=True`` (ours): a request admitted with at most ``probe_limit``
      in flight ran under the conditions a probe enforces. When a probe comes due
      and the last ``probe_requests`` such latencies were all gathered since the
      previous measurement, they are the measurement: no pinning. At low traffic
      the limit is then never pinned (Envoy pins it regardless, and blocks the
      occasional burst). This assumes a server that serves requests in order (a
      worker pool); under processor sharing, requests admitted later could slow them.
    - ``lower_min_rtt=True`` (ours): an interval whose percentile latency is below
      ``min_rtt`` proves ``min_rtt`` stale (measured while the model was slow, or
      with a backlog), so ``min_rtt`` drops to it at once instead of waiting up to a
      minute for the next probe, during which the gradient stays at 2 and the limit
      at ``max_limit``.
    - ``drop_backoff=0.9`` (ours): an interval with a dropped request ends with the
      limit at most ``floor(0.9 L)`` (during a probe, drops lower the pinned limit and
      the one to restore, once per interval), and dropped latencies are not used.
      Envoy only sees latencies, so when every request ends at the same timeout the
      p50 equals the (timeout-inflated) min RTT, the gradient is 1.25 and the limit
      climbs to ``max_limit``.

    ``seed`` seeds the jitter (``random.Random(seed)``) so runs are repeatable.
    :meth:`published` returns Envoy's defaults (limit 3 and pinned at start, min 3,
    max 1000, 100 ms interval, 50 probe requests, no timeout, no passive probe,
    stale min RTT kept until the next probe, drops ignored).
    """

    name = "gradient"

    def __init__(
        self,
        *,
        initial_limit: int = 4,
        min_limit: int = 1,
        max_limit: int = 128,
        update_interval: float | None = None,
        percentile: float = 0.5,
        buffer: float = 0.25,
        probe_interval: float = 60.0,
        probe_jitter: float = 0.15,
        probe_requests: int = 20,
        probe_limit: int = 3,
        probe_timeout: float | None = 1.0,
        passive_probe: bool = True,
        lower_min_rtt: bool = True,
        drop_backoff: float | None = 0.9,
        seed: int | None = 0,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        if update_interval is not None:
            _positive_seconds("update_interval", update_interval)
        _positive_seconds("probe_interval", probe_interval)
        if probe_timeout is not None:
            _positive_seconds("probe_timeout", probe_timeout)
        if not 0.0 < percentile <= 1.0:
            raise ConfigError("percentile", f"must be in (0, 1], got {percentile}")
        if not (buffer >= 0 and math.isfinite(buffer)):
            raise ConfigError("buffer", f"must be a finite fraction >= 0, got {buffer}")
        if not 0.0 <= probe_jitter <= 1.0:
            raise ConfigError("probe_jitter", f"must be in [0, 1], got {probe_jitter}")
        if probe_requests < 1:
            raise ConfigError("probe_requests", f"must be >= 1, got {probe_requests}")
        if probe_limit < 1:
            raise ConfigError("probe_limit", f"must be >= 1, got {probe_limit}")
        if drop_backoff is not None and not 0.5 <= drop_backoff < 1.0:
            raise ConfigError("drop_backoff", f"must be in [0.5, 1.0) or None, got {drop_backoff}")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.update_interval = update_interval
        self.percentile = percentile
        self.buffer = buffer
        self.probe_interval = probe_interval
        self.probe_jitter = probe_jitter
        self.probe_requests = probe_requests
        self.probe_limit = probe_limit
        self.probe_timeout = probe_timeout
        self.passive_probe = passive_probe
        self.lower_min_rtt = lower_min_rtt
        self.drop_backoff = drop_backoff
        self._random = random.Random(seed)
        self._min_rtt: float | None = None
        # Current update interval (sample window).
        self._interval_start: float | None = None
        self._interval_rtts: list[float] = []
        self._interval_dropped = False
        # Latencies of requests admitted at probe concurrency since the last measurement.
        self._passive_rtts: deque[float] = deque(maxlen=probe_requests)
        # Min-RTT probe: starts pinned at construction, as Envoy's controller does.
        self._probing = True
        # Latencies of requests admitted before the epoch (the start of the latest
        # measurement) never count. None: the start-up measurement, which every request
        # the algorithm hears of was admitted during.
        self._epoch: float | None = None
        # When the current probe started, for probe_timeout. The start-up probe started
        # when the algorithm was built, which no sample carries (algorithms read no
        # clock): its age counts from the earliest admission the samples show.
        self._probe_start: float | None = None
        self._probe_rtts: list[float] = []
        self._deferred_limit = initial_limit
        self._probe_backoff_at: float | None = None
        self._limit = max(self.min_limit, min(initial_limit, probe_limit))
        self._next_probe_at: float | None = None
        self._min_streak = 0
        self.probes_started = 1
        """How many min-RTT probes (pinned measurements) have started, for tests and logs."""

    @classmethod
    def published(cls, seed: int | None = 0) -> Gradient:
        """Envoy's gradient controller defaults (with a 100 ms update interval and a
        60 s min-RTT interval, the values of Envoy's documented example)."""
        return cls(
            initial_limit=3,
            min_limit=3,
            max_limit=1000,
            update_interval=0.1,
            percentile=0.5,
            buffer=0.25,
            probe_interval=60.0,
            probe_jitter=0.15,
            probe_requests=50,
            probe_limit=3,
            probe_timeout=None,
            passive_probe=False,
            lower_min_rtt=False,
            drop_backoff=None,
            seed=seed,
        )

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def min_rtt(self) -> float | None:
        """The measured no-load latency (None until the first probe completes)."""
        return self._min_rtt

    @property
    def interval_length(self) -> float:
        """The current update interval in seconds (``update_interval``, or the automatic
        ``max(0.1, 2 x min_rtt)`` when it is None)."""
        if self.update_interval is not None:
            return self.update_interval
        if self._min_rtt is None:
            return _AUTO_INTERVAL_FLOOR
        return max(_AUTO_INTERVAL_FLOOR, 2.0 * self._min_rtt)

    @property
    def probing(self) -> bool:
        """True while the limit is pinned to measure the min RTT."""
        return self._probing

    def update(self, sample: Sample) -> int:
        now = sample.now
        if self._probing:
            self._probe_step(sample, now)
            return self._limit
        if self._next_probe_at is not None and now >= self._next_probe_at:
            if len(self._passive_rtts) >= self.probe_requests:
                # Traffic already ran at probe concurrency: measured for free.
                self._min_rtt = _percentile(list(self._passive_rtts), self.percentile)
                self._passive_rtts.clear()
                self._schedule_probe(now)
            else:
                self._enter_probe(now)
                self._probe_step(sample, now)
                return self._limit
        if self._interval_start is None:
            self._interval_start = now
        elif now - self._interval_start >= self.interval_length:
            self._close_interval(now)
            if self._probing:  # the interval triggered a re-measure
                self._probe_step(sample, now)
                return self._limit
        rtt = self._latency(sample)
        if rtt is not None:
            self._interval_rtts.append(rtt)
            if self.passive_probe and sample.inflight <= self.probe_limit:
                self._passive_rtts.append(rtt)
        self._interval_dropped = self._interval_dropped or sample.dropped
        return self._limit

    def _latency(self, sample: Sample) -> float | None:
        """The sample's latency if it counts: a real latency (not a drop's, when drops
        are backed off on) of a request admitted since the epoch; else None."""
        rtt = sample.rtt
        if not (math.isfinite(rtt) and rtt > 0):
            return None
        if sample.dropped and self.drop_backoff is not None:
            return None
        if self._epoch is not None and sample.now - rtt < self._epoch:
            return None  # admitted before the latest measurement started
        return rtt

    # -- update intervals ----------------------------------------------------------

    def _close_interval(self, now: float) -> None:
        rtts = self._interval_rtts
        backoff = self.drop_backoff if self._interval_dropped else None
        if not (rtts and self._min_rtt is not None) and backoff is None:
            # Nothing to set the limit from: it stays, and so does the count of
            # intervals at the minimum (an idle interval is no sign of a bad min RTT).
            self._reset_interval(now)
            return
        old_limit = self._limit
        new_limit = old_limit
        if rtts and self._min_rtt is not None:
            sample_rtt = _percentile(rtts, self.percentile)
            buffered = self._min_rtt * (1.0 + self.buffer)
            gradient = max(0.5, min(2.0, buffered / sample_rtt))
            scaled = gradient * old_limit
            new_limit = self._clamp(math.floor(scaled + math.sqrt(scaled)))
            if self.lower_min_rtt and sample_rtt < self._min_rtt:
                self._min_rtt = sample_rtt
        if backoff is not None:
            new_limit = min(new_limit, self._clamp(math.floor(old_limit * backoff)))
        self._limit = new_limit
        if old_limit == self.min_limit and new_limit == self.min_limit:
            self._min_streak += 1
        else:
            self._min_streak = 0
        self._reset_interval(now)
        if self._min_streak >= _MIN_STREAK_TO_PROBE:
            # Stuck at the floor: the min RTT is probably wrong, and the limit is
            # already where a probe would put it, so measure again now.
            self._enter_probe(now)

    def _reset_interval(self, now: float) -> None:
        self._interval_start = now
        self._interval_rtts = []
        self._interval_dropped = False

    # -- min-RTT probe -------------------------------------------------------------

    def _enter_probe(self, now: float) -> None:
        self._probing = True
        self._epoch = now
        self._probe_start = now
        self._probe_rtts = []
        self._probe_backoff_at = None
        self._deferred_limit = self._limit
        self._limit = max(self.min_limit, min(self._limit, self.probe_limit))
        self._min_streak = 0
        self.probes_started += 1

    def _probe_step(self, sample: Sample, now: float) -> None:
        if self._epoch is None:
            # Start-up probe: open since the algorithm was built; its age counts from
            # the earliest admission seen so far.
            admitted_at = now - sample.rtt if math.isfinite(sample.rtt) else now
            if self._probe_start is None or admitted_at < self._probe_start:
                self._probe_start = admitted_at
        # Requests admitted before a re-measure ran at the old limit: not a min RTT.
        rtt = self._latency(sample)
        if rtt is not None:
            self._probe_rtts.append(rtt)
        if sample.dropped and self.drop_backoff is not None:
            # Overload while measuring (every request timing out, say): back off the
            # limit to restore, at most once per update interval, and never pin higher.
            last = self._probe_backoff_at
            if last is None or now - last >= self.interval_length:
                self._probe_backoff_at = now
                self._deferred_limit = self._clamp(
                    math.floor(self._deferred_limit * self.drop_backoff)
                )
                self._limit = min(self._limit, self._deferred_limit)
        gathered = len(self._probe_rtts)
        timed_out = (
            self.probe_timeout is not None
            and self._probe_start is not None
            and now - self._probe_start >= self.probe_timeout
            and gathered > 0
        )
        if gathered >= self.probe_requests or timed_out:
            self._min_rtt = _percentile(self._probe_rtts, self.percentile)
            self._probing = False
            self._probe_rtts = []
            self._passive_rtts.clear()
            self._limit = self._deferred_limit
            self._schedule_probe(now)
            self._reset_interval(now)

    def _schedule_probe(self, now: float) -> None:
        jitter = self._random.uniform(0.0, self.probe_jitter * self.probe_interval)
        self._next_probe_at = now + self.probe_interval + jitter

    def describe(self) -> str:
        min_rtt = "?" if self._min_rtt is None else f"{self._min_rtt * 1e3:.1f}ms"
        state = ", probing" if self._probing else ""
        return f"gradient(limit={self._limit}, min_rtt={min_rtt}{state})"
