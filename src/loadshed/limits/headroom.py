"""``HeadroomTrial``: does one more slot than the workers turn into throughput?

A model server usually gives a worker its next job only after a trip through the
event loop: the finished request's response is sent, its slot is released, the next
request is admitted, parsed and written to the worker's pipe. With the limit at the
worker count, every worker idles that long after every job (about 1 ms; 4 % of a
25 ms model), because nothing is waiting to be handed ahead. One slot more keeps a job
waiting: the workers stay busy and throughput rises by about the trip over the service
time, at the price of one queued job of latency. ``Little``'s estimate (rate x minimum
latency) cannot see that gain: it is a fraction of a slot.

The gain is small and the rate noisy, so a trial measures it side by side: windows
of completions at the lower limit, the higher, the higher again and the lower again
(A/B/B/A cancels a drift), each after the requests admitted under the previous window
have left. The higher limit wins only if its throughput is higher by at least
``min_gain`` (1 %) and by ``z`` (2.5) standard errors of the difference (gaps between
completions are the samples). Each window holds as many gaps as the first one's spread
needs for twice ``min_gain`` to stand ``z + 1`` standard errors out, between
``min_window`` and ``max_window``. Demand that does not fill the limit, or any
request dropped, ends the trial without a verdict: the first says nothing of capacity,
the second that clients will not wait for the extra job. So does more than one
completion in ten finishing with less than ``min_slack`` before its deadline (the
request's own or the clients' learned patience): a job held ahead would add its
service time to every request's latency, and these clients have no room for it. Only
the lower limit's windows need demand beyond the limit; a higher window without it
can only read less throughput.

Pure: no clock, no asyncio; times come in the samples.
"""

from __future__ import annotations

import enum
import math

__all__ = ["HeadroomTrial", "TrialVerdict"]

_TIGHT_SHARE = 10  # more than 1 in this many completions short of min_slack: TIGHT


class TrialVerdict(enum.Enum):
    """Where a trial stands after a completion."""

    RUNNING = "running"
    GAIN = "gain"  # the higher limit served measurably more
    NO_GAIN = "no_gain"  # it did not (or not clearly)
    DROPPED = "dropped"  # a request was dropped: clients will not wait for more
    TIGHT = "tight"  # requests finished too close to their deadlines for a job more
    UNSATURATED = "unsaturated"  # demand did not fill the limit: nothing measured


class HeadroomTrial:
    """An A/B/B/A comparison of throughput at ``low`` and ``high`` limits.

    Feed every completion to :meth:`record`; while it returns ``RUNNING``, hold the
    limit at :attr:`limit`.
    """

    __slots__ = (
        "_arm",
        "_last",
        "_settle",
        "_stats",
        "_tight",
        "_unsaturated",
        "high",
        "low",
        "max_window",
        "min_gain",
        "min_slack",
        "window",
        "z",
    )

    def __init__(
        self,
        low: int,
        high: int,
        *,
        min_gain: float = 0.01,
        z: float = 2.5,
        min_window: int = 16,
        max_window: int = 128,
        min_slack: float = 0.0,
    ) -> None:
        if not 1 <= low < high:
            raise ValueError(f"need 1 <= low < high, got low={low}, high={high}")
        self.low = low
        self.high = high
        self.window = min_window
        self.max_window = max_window
        self.min_gain = min_gain
        self.z = z
        self._arm = 0  # index into (low, high, high, low)
        self._settle = high  # completions to skip: those admitted under the last limit
        self._last: float | None = None  # the last counted completion's time
        self._unsaturated = 0
        self.min_slack = min_slack
        self._tight = 0  # counted completions with less than min_slack to spare
        # per limit (0 low, 1 high): [gaps, sum, sum of squares]
        self._stats = [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]

    @property
    def limit(self) -> int:
        """The limit the current window measures."""
        return self.high if self._arm in (1, 2) else self.low

    def record(
        self, now: float, dropped: bool, queued: int, slack: float = math.inf
    ) -> TrialVerdict:
        """Count one completion at time ``now`` (seconds); ``queued``: requests
        waiting for admission then (0: demand did not fill the limit); ``slack``:
        seconds it had left before its deadline."""
        if dropped:
            return TrialVerdict.DROPPED
        if queued <= 0 and self._arm in (0, 3):
            # Only the limit's own windows need demand beyond them: a high window
            # without it (two clients at two slots) can only read less throughput.
            self._unsaturated += 1
            if 4 * self._unsaturated > self.window:
                return TrialVerdict.UNSATURATED
        if self._settle > 0:
            self._settle -= 1
            return TrialVerdict.RUNNING
        stats = self._stats[1 if self._arm in (1, 2) else 0]
        if slack < self.min_slack:
            self._tight += 1
        if self._last is not None:
            gap = now - self._last
            stats[0] += 1.0
            stats[1] += gap
            stats[2] += gap * gap
        self._last = now
        # Windows 0 and 3 fill the low limit's statistics, 1 and 2 the high one's.
        if stats[0] < self.window * (2 if self._arm >= 2 else 1):
            return TrialVerdict.RUNNING
        if self._arm == 0:
            # Size the windows by the spread the first one measured: the difference of
            # two means over 2 x window gaps each has a standard error of about
            # mean x cv / sqrt(window); twice min_gain should stand z + 1 of them out
            # (then it wins about 5 times in 6).
            mean = stats[1] / stats[0]
            variance = max(0.0, stats[2] / stats[0] - mean * mean)
            cv = math.sqrt(variance) / mean if mean > 0 else 0.0
            need = math.ceil(((self.z + 1) * cv / (2 * self.min_gain)) ** 2)
            window = max(self.window, min(self.max_window, need))
            if stats[0] < window:
                self.window = window
                return TrialVerdict.RUNNING
        # This window is complete: on to the next, after its own settling.
        self._arm += 1
        self._last = None
        self._settle = self.high
        if self._arm < 4:
            return TrialVerdict.RUNNING
        return self._verdict()

    def _verdict(self) -> TrialVerdict:
        (n_low, sum_low, sq_low), (n_high, sum_high, sq_high) = self._stats
        if self._tight * _TIGHT_SHARE > n_low + n_high:
            return TrialVerdict.TIGHT
        mean_low, mean_high = sum_low / n_low, sum_high / n_high
        if mean_high <= 0:
            return TrialVerdict.NO_GAIN
        gain = mean_low / mean_high - 1.0  # throughput ratio: the inverse of the gaps
        var_low = max(0.0, sq_low / n_low - mean_low * mean_low)
        var_high = max(0.0, sq_high / n_high - mean_high * mean_high)
        se = math.sqrt(var_low / n_low + var_high / n_high)
        difference = mean_low - mean_high
        clear = difference > self.z * se if se > 0 else difference > 0
        return TrialVerdict.GAIN if gain >= self.min_gain and clear else TrialVerdict.NO_GAIN
