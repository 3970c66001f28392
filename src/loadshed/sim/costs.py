"""Request costs in the simulator: a distribution of costs, and the service time each
cost stands for.

A request's cost is drawn when its client sends it (``--cost-dist loguniform:1:100``).
Its service time is the usual draw from the service distribution (the spread: model
noise, cache hits) times its *size*::

    size = fixed + (1 - fixed) x cost / mean cost

so service time ~= a + b x cost with a = fixed x mean service time and b = (1 - fixed)
x mean service time / mean cost. The sizes average 1: the mean service time, and with
it the capacity in requests per second, stay what ``--service-time`` says, whatever the
cost distribution; a run with costs and one without are comparable.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from loadshed.errors import ConfigError

__all__ = ["COST_KINDS", "CostDistribution"]

COST_KINDS = ("constant", "uniform", "loguniform")


@dataclass(frozen=True)
class CostDistribution:
    """Costs drawn from ``kind`` over [low, high] (``constant``: always ``low``), and
    the share ``fixed`` of the mean service time every request takes whatever its cost.
    """

    kind: str
    low: float
    high: float
    fixed: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in COST_KINDS:
            raise ConfigError("cost_dist", f"got {self.kind!r}, allowed: {'|'.join(COST_KINDS)}")
        if not (math.isfinite(self.low) and self.low > 0):
            raise ConfigError("cost_dist", f"costs must be > 0, got low {self.low:g}")
        if not (math.isfinite(self.high) and self.high >= self.low):
            raise ConfigError("cost_dist", f"high must be >= low ({self.low:g}), got {self.high:g}")
        if not 0 <= self.fixed < 1:
            raise ConfigError("cost_fixed", f"must be in [0, 1), got {self.fixed:g}")

    @classmethod
    def parse(cls, spec: str, fixed: float = 0.1) -> CostDistribution:
        """``constant:C``, ``uniform:LO:HI`` or ``loguniform:LO:HI``; :class:`ConfigError`
        (field ``cost_dist``) naming the allowed forms otherwise."""
        forms = "constant:C|uniform:LO:HI|loguniform:LO:HI"
        kind, _, rest = spec.partition(":")
        parts = rest.split(":") if rest else []
        try:
            values = [float(part) for part in parts]
        except ValueError:
            raise ConfigError("cost_dist", f"got {spec!r}, allowed: {forms}") from None
        if kind == "constant" and len(values) == 1:
            return cls(kind, values[0], values[0], fixed)
        if kind in ("uniform", "loguniform") and len(values) == 2:
            return cls(kind, values[0], values[1], fixed)
        raise ConfigError("cost_dist", f"got {spec!r}, allowed: {forms}")

    @property
    def mean(self) -> float:
        """The mean cost."""
        low, high = self.low, self.high
        if self.kind == "constant" or high == low:
            return low
        if self.kind == "uniform":
            return (low + high) / 2
        return (high - low) / math.log(high / low)

    def sample(self, rng: random.Random) -> float:
        """Draw one cost."""
        if self.kind == "constant":
            return self.low
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high)
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))

    def size(self, cost: float) -> float:
        """The service-time multiplier of a request of ``cost`` (1 on average)."""
        return self.fixed + (1.0 - self.fixed) * cost / self.mean

    def describe(self) -> str:
        """Short human-readable form."""
        if self.kind == "constant":
            return f"constant {self.low:g}"
        return f"{self.kind} {self.low:g}..{self.high:g}, fixed share {self.fixed:g}"
