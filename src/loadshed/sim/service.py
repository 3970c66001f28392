"""Service-time distributions of the simulated model, and a change at a given time.

All distributions are parameterised by their mean, so that switching the shape keeps
the capacity (workers / mean) the same.
"""

from __future__ import annotations

import math
import random

from loadshed.errors import ConfigError

__all__ = [
    "DISTRIBUTIONS",
    "ConstantTime",
    "ExponentialTime",
    "LogNormalTime",
    "ServiceModel",
    "ServiceTime",
    "make_service_time",
]

DISTRIBUTIONS = ("constant", "exponential", "lognormal")


class ServiceTime:
    """A distribution of service times (seconds) with a known ``mean``."""

    __slots__ = ("mean",)

    def __init__(self, mean: float) -> None:
        if not mean > 0:
            raise ConfigError("service_time", f"must be > 0 seconds, got {mean}")
        self.mean = float(mean)

    def sample(self, rng: random.Random) -> float:
        """Draw one service time."""
        raise NotImplementedError

    def describe(self) -> str:
        """Short human-readable form."""
        raise NotImplementedError


class ConstantTime(ServiceTime):
    """Every request takes exactly ``mean`` seconds (the CPU-bound work of the
    throughput paradox and the capacity change)."""

    __slots__ = ()

    def sample(self, rng: random.Random) -> float:
        return self.mean

    def describe(self) -> str:
        return f"constant {self.mean:g}s"


class ExponentialTime(ServiceTime):
    """Memoryless service times with the given mean (the M/M/c textbook case)."""

    __slots__ = ("_rate",)

    def __init__(self, mean: float) -> None:
        super().__init__(mean)
        self._rate = 1.0 / self.mean

    def sample(self, rng: random.Random) -> float:
        return rng.expovariate(self._rate)

    def describe(self) -> str:
        return f"exponential mean {self.mean:g}s"


class LogNormalTime(ServiceTime):
    """Right-skewed service times with the given mean and log-space spread ``sigma``.

    Model latencies are usually log-normal: most calls near the median, a long tail.
    mu is chosen so that the mean is exactly ``mean``: mu = ln(mean) - sigma^2 / 2.
    """

    __slots__ = ("_mu", "sigma")

    def __init__(self, mean: float, sigma: float = 0.5) -> None:
        super().__init__(mean)
        if not sigma > 0:
            raise ConfigError("sigma", f"must be > 0, got {sigma}")
        self.sigma = float(sigma)
        self._mu = math.log(self.mean) - self.sigma**2 / 2

    def sample(self, rng: random.Random) -> float:
        return rng.lognormvariate(self._mu, self.sigma)

    def describe(self) -> str:
        return f"lognormal mean {self.mean:g}s sigma {self.sigma:g}"


def make_service_time(kind: str, mean: float, sigma: float = 0.5) -> ServiceTime:
    """Build a distribution: ``constant``, ``exponential`` or ``lognormal``.

    Raises :class:`ConfigError` naming ``service_dist`` and the allowed kinds.
    """
    if kind == "constant":
        return ConstantTime(mean)
    if kind == "exponential":
        return ExponentialTime(mean)
    if kind == "lognormal":
        return LogNormalTime(mean, sigma)
    raise ConfigError("service_dist", f"got {kind!r}, allowed: {'|'.join(DISTRIBUTIONS)}")


class ServiceModel:
    """Service times that may switch to another distribution at ``change_at``.

    ``sample(now)`` draws from ``before`` until ``change_at`` and from ``after`` from
    then on: a request started before the change keeps its old service time.
    """

    __slots__ = ("after", "before", "change_at", "rng")

    def __init__(
        self,
        before: ServiceTime,
        rng: random.Random,
        *,
        after: ServiceTime | None = None,
        change_at: float | None = None,
    ) -> None:
        if (after is None) != (change_at is None):
            raise ConfigError("change_at", "give both the new service time and when it applies")
        if change_at is not None and change_at < 0:
            raise ConfigError("change_at", f"must be >= 0 seconds, got {change_at}")
        self.before = before
        self.after = after
        self.change_at = change_at
        self.rng = rng

    def sample(self, now: float) -> float:
        """Draw the service time of a request that starts at ``now``."""
        if self.change_at is not None and now >= self.change_at:
            assert self.after is not None
            return self.after.sample(self.rng)
        return self.before.sample(self.rng)

    def mean_at(self, now: float) -> float:
        """Mean service time in force at ``now``."""
        if self.change_at is not None and now >= self.change_at:
            assert self.after is not None
            return self.after.mean
        return self.before.mean
