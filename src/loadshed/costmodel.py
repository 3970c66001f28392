"""The service time of a request from its cost: time ~= a + b x cost, fitted online.

A request's *cost* is a number its caller knows at arrival and its service time grows
with: rows in a batch, tokens in a prompt, pixels in an image. :class:`CostModel` fits
``seconds = intercept + slope x cost`` over a sliding window of recent successes, so
that admission can predict each request's own time instead of the recent mean: a
10,000-row request that cannot meet its deadline is refused at arrival, a 1-row one
that can is admitted.

The fit is least squares with one trimming pass: points whose residual lies more than
three robust standard deviations (1.4826 x the median absolute deviation) from the
median residual are dropped and the line is fitted again. A request that waited in a
queue at the origin, or hit a GC pause, reads slow for its cost; as long as such
points are a minority of the window they are trimmed and do not tilt the line. With
too little spread in the costs seen to tell intercept from slope, the time is taken as
proportional to the cost (intercept 0). A fitted slope below 0 (time does not grow
with cost) becomes 0 with the mean as the intercept; an intercept below 0 becomes 0
with the slope fitted through the origin.

``high(cost)`` is the prediction times the 90th percentile of the ratio of measured to
predicted time over the points kept: the conservative time a deadline is judged
against, as :class:`~loadshed.estimate.ServiceTimeEstimator.high` is without costs.

Pure: costs and times come in as arguments; no clock, no asyncio.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Sequence

from loadshed.checks import check_int
from loadshed.errors import ConfigError

__all__ = ["MAX_COST", "CostModel", "check_cost", "fit_cost_line"]

_TRIM_SDS = 3.0  # residuals beyond this many robust standard deviations are dropped
_MAD_TO_SD = 1.4826  # the median absolute deviation of a normal sample, in standard deviations
_HIGH_QUANTILE = 0.9
_COST_MEMORY = 1024  # successes the mean cost (the reference of work and excess) weighs
# Costs with a coefficient of variation below this cannot separate intercept and slope.
_MIN_COST_CV = 0.05


# The largest cost a request may carry: far beyond any batch or prompt, and small enough
# that the fit's squares and sums stay finite (a cost of 1e200 overflowed them, and one
# header could then stall a limiter).
MAX_COST = 1e12


def check_cost(cost: object, field: str = "cost") -> float:
    """A request cost as a float in (0, :data:`MAX_COST`]; else :class:`ConfigError`
    naming ``field``. Any real number type is taken (``int``, ``float``, numpy's)."""
    if isinstance(cost, bool) or not isinstance(cost, numbers.Real):
        raise ConfigError(field, f"must be a number in (0, {MAX_COST:g}], got {cost!r}")
    value = float(cost)
    if not (0 < value <= MAX_COST):  # also rejects nan and inf
        raise ConfigError(field, f"must be a number in (0, {MAX_COST:g}], got {cost!r}")
    return value


class CostModel:
    """``seconds ~= intercept + slope x cost``, fitted over the last ``window`` samples.

    Parameters:
        window: samples the fit covers (the most recent).
        min_samples: samples needed before the first fit (until then :meth:`predict`
            returns None, or the starting model's prediction, and admission uses the
            mean service time, as without costs); at most ``window``.
        refit_every: samples between two fits after the first (a fit sorts the window
            twice), whatever ``min_samples`` is (``min_samples == window`` included).
        intercept / slope: a starting model (e.g. from ``loadshed plan --profile``),
            used until ``min_samples`` samples were seen; give both or neither.
    """

    __slots__ = (
        "_cost_mean",
        "_costs_seen",
        "_first_fit_done",
        "_high_ratio",
        "_intercept",
        "_pending",
        "_samples",
        "_slope",
        "min_samples",
        "refit_every",
    )

    def __init__(
        self,
        *,
        window: int = 64,
        min_samples: int = 16,
        refit_every: int = 8,
        intercept: float | None = None,
        slope: float | None = None,
    ) -> None:
        window = check_int("cost_window", window, minimum=2)
        self.min_samples = check_int("cost_min_samples", min_samples, minimum=2, maximum=window)
        self.refit_every = check_int("cost_refit_every", refit_every, minimum=1)
        if (intercept is None) != (slope is None):
            raise ConfigError("cost_model", "give both intercept and slope, or neither")
        self._samples: deque[tuple[float, float]] = deque(maxlen=window)
        self._pending = 0
        self._first_fit_done = False  # min_samples gates the first fit only
        self._intercept: float | None = None
        self._slope: float | None = None
        self._high_ratio = 1.0
        # The mean cost of successes, over about the last _COST_MEMORY of them.
        self._cost_mean = 0.0
        self._costs_seen = 0
        if intercept is not None and slope is not None:
            for field, value in (("cost_intercept", intercept), ("cost_slope", slope)):
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConfigError(field, f"must be a number >= 0 seconds, got {value!r}")
                if not (math.isfinite(value) and value >= 0):
                    raise ConfigError(field, f"must be a finite number >= 0 seconds, got {value}")
            if intercept + slope <= 0:
                raise ConfigError("cost_model", "intercept + slope must be > 0 seconds")
            self._intercept, self._slope = float(intercept), float(slope)

    @property
    def samples(self) -> int:
        """Samples in the window."""
        return len(self._samples)

    @property
    def fitted(self) -> bool:
        """True when predictions are made (a fit or a starting model)."""
        return self._slope is not None

    @property
    def intercept(self) -> float | None:
        """Seconds every request takes whatever its cost (``a``), or None while unknown."""
        return self._intercept

    @property
    def slope(self) -> float | None:
        """Seconds per unit of cost (``b``), or None while unknown."""
        return self._slope

    def add(self, cost: float, seconds: float) -> None:
        """Record a success of ``cost`` that took ``seconds`` (anything not > 0 is ignored)."""
        if not (cost > 0 and seconds > 0 and math.isfinite(cost) and math.isfinite(seconds)):
            return
        self._samples.append((cost, seconds))
        if self._costs_seen < _COST_MEMORY:
            self._costs_seen += 1
        self._cost_mean += (cost - self._cost_mean) / self._costs_seen
        self._pending += 1
        if self._first_fit_done:
            if self._pending >= self.refit_every:
                self._fit()
        elif len(self._samples) >= self.min_samples:
            self._fit()

    def predict(self, cost: float) -> float | None:
        """The expected seconds of a request of ``cost``, or None while unknown."""
        slope = self._slope
        if slope is None:
            return None
        assert self._intercept is not None
        return self._intercept + slope * cost

    @property
    def mean_cost(self) -> float | None:
        """The mean cost of recent successes (about the last 1,024), or None before any."""
        return self._cost_mean if self._costs_seen else None

    def work(self, cost: float) -> float:
        """The predicted service of a request of ``cost`` as a share of a mean
        success's (the prediction at :attr:`mean_cost`); 1.0 while no model is fitted
        or no success was seen. A limit algorithm that counts completions weighs them
        by it (:attr:`loadshed.limits.base.Sample.work`)."""
        slope = self._slope
        if slope is None or not self._costs_seen:
            return 1.0
        assert self._intercept is not None
        mean = self._intercept + slope * self._cost_mean
        if not mean > 0:
            return 1.0
        return (self._intercept + slope * cost) / mean

    def excess(self, cost: float) -> float:
        """Seconds a request of ``cost`` is predicted to take over a success of the
        mean cost (negative when cheaper); 0.0 while no model is fitted or no success
        was seen (:attr:`loadshed.limits.base.Sample.excess`)."""
        slope = self._slope
        if slope is None or not self._costs_seen:
            return 0.0
        return slope * (cost - self._cost_mean)

    def high(self, cost: float) -> float | None:
        """A conservative time for ``cost``: the prediction x the 90th percentile of
        measured / predicted over the window (at least the prediction)."""
        predicted = self.predict(cost)
        return None if predicted is None else predicted * self._high_ratio

    def _fit(self) -> None:
        self._pending = 0
        self._first_fit_done = True
        points = list(self._samples)
        line, kept = _trimmed_fit(points)
        intercept, slope = line
        ratios = sorted(t / max(intercept + slope * c, 1e-12) for c, t in kept)
        rank = max(1, math.ceil(_HIGH_QUANTILE * len(ratios)))
        self._high_ratio = max(1.0, ratios[rank - 1])
        self._intercept, self._slope = intercept, slope


def _trimmed_fit(
    points: list[tuple[float, float]],
) -> tuple[tuple[float, float], list[tuple[float, float]]]:
    """The line fitted with one trimming pass over ``points`` (at least one), and the
    points it kept."""
    line = fit_cost_line(points)
    intercept, slope = line
    residuals = [t - (intercept + slope * c) for c, t in points]
    ordered = sorted(residuals)
    middle = ordered[len(ordered) // 2]
    spread = sorted(abs(r - middle) for r in ordered)[len(ordered) // 2] * _MAD_TO_SD
    # Most times identical (a coarse clock, an even virtual one): a spread of 0 must
    # still trim the one slow outlier, so never less than a millionth of the mean.
    spread = max(spread, 1e-6 * sum(t for _, t in points) / len(points))
    bound = _TRIM_SDS * spread
    kept = [point for point, r in zip(points, residuals, strict=True) if abs(r - middle) <= bound]
    if len(kept) >= 2 and len(kept) < len(points):
        return fit_cost_line(kept), kept
    return line, points


def fit_cost_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of ``seconds`` on ``cost`` by least squares over ``(cost,
    seconds)`` points (at least one), both >= 0 (see the module docstring). ``loadshed
    plan --profile`` fits its measured means with it: the starting model
    (``AdmissionConfig.initial_cost_model``)."""
    count = len(points)
    if not count:
        raise ValueError("fit_cost_line needs at least one (cost, seconds) point")
    mean_cost = sum(c for c, _ in points) / count
    mean_time = sum(t for _, t in points) / count
    cost_var = sum((c - mean_cost) ** 2 for c, _ in points)
    if cost_var <= (_MIN_COST_CV * mean_cost) ** 2 * count:
        return 0.0, mean_time / mean_cost  # no spread to separate them: proportional
    slope = sum((c - mean_cost) * (t - mean_time) for c, t in points) / cost_var
    if slope < 0:
        return mean_time, 0.0
    intercept = mean_time - slope * mean_cost
    if intercept < 0:
        return 0.0, sum(c * t for c, t in points) / sum(c * c for c, _ in points)
    return intercept, slope
