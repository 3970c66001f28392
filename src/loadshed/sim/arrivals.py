"""Open-loop arrival processes: the gaps between requests, independent of responses.

Each process draws from the seeded :class:`random.Random` it is given, so a run is
reproducible from its seed.
"""

from __future__ import annotations

import random

from loadshed.errors import ConfigError

__all__ = ["ARRIVAL_KINDS", "Arrivals", "Bursts", "Constant", "Poisson", "make_arrivals"]

ARRIVAL_KINDS = ("constant", "poisson", "bursts")


class Arrivals:
    """A stream of inter-arrival gaps (seconds) at an average ``rate`` per second."""

    __slots__ = ("rate",)

    def __init__(self, rate: float) -> None:
        if not rate > 0:
            raise ConfigError("rate", f"must be > 0 requests per second, got {rate}")
        self.rate = float(rate)

    def next_gap(self, rng: random.Random) -> float:
        """Seconds from the previous arrival to the next one."""
        raise NotImplementedError

    def describe(self) -> str:
        """Short human-readable form."""
        raise NotImplementedError


class Constant(Arrivals):
    """Evenly spaced arrivals, like a ticker (wrk2, vegeta, Go's ``time.Ticker``)."""

    __slots__ = ("_gap",)

    def __init__(self, rate: float) -> None:
        super().__init__(rate)
        self._gap = 1.0 / self.rate

    def next_gap(self, rng: random.Random) -> float:
        return self._gap

    def describe(self) -> str:
        return f"constant {self.rate:g}/s"


class Poisson(Arrivals):
    """Independent arrivals: exponential gaps with mean ``1 / rate``."""

    __slots__ = ()

    def next_gap(self, rng: random.Random) -> float:
        return rng.expovariate(self.rate)

    def describe(self) -> str:
        return f"poisson {self.rate:g}/s"


class Bursts(Arrivals):
    """``size`` requests at once, bursts spaced so the average rate is ``rate``."""

    __slots__ = ("_left", "_period", "size")

    def __init__(self, rate: float, size: int = 10) -> None:
        super().__init__(rate)
        if size < 1:
            raise ConfigError("burst_size", f"must be >= 1, got {size}")
        self.size = size
        self._period = size / self.rate
        self._left = 0

    def next_gap(self, rng: random.Random) -> float:
        if self._left > 0:
            self._left -= 1
            return 0.0
        self._left = self.size - 1
        return self._period

    def describe(self) -> str:
        return f"bursts of {self.size} at {self.rate:g}/s"


def make_arrivals(kind: str, rate: float, burst_size: int = 10) -> Arrivals:
    """Build an arrival process: ``constant``, ``poisson`` or ``bursts``.

    Raises :class:`ConfigError` naming ``arrivals`` and the allowed kinds.
    """
    if kind == "constant":
        return Constant(rate)
    if kind == "poisson":
        return Poisson(rate)
    if kind == "bursts":
        return Bursts(rate, burst_size)
    raise ConfigError("arrivals", f"got {kind!r}, allowed: {'|'.join(ARRIVAL_KINDS)}")
