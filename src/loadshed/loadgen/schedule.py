"""Open-loop arrival schedules: the intended send times, independent of any response."""

from __future__ import annotations

import random
from collections.abc import Iterator

from loadshed.errors import ConfigError
from loadshed.loadgen.options import ARRIVALS, Arrival

__all__ = ["arrival_offsets", "inter_arrival_gaps"]


def inter_arrival_gaps(
    rate: float, arrival: Arrival, rng: random.Random | None = None
) -> Iterator[float]:
    """Yield gaps in seconds between consecutive arrivals, forever.

    ``constant``: every gap is exactly ``1/rate``. ``poisson``: gaps are exponential with mean
    ``1/rate`` (a Poisson process), drawn from ``rng`` so a seeded run is reproducible.
    """
    if not rate > 0:
        raise ConfigError("--rate", f"must be > 0 requests/s, got {rate}")
    if arrival not in ARRIVALS:
        raise ConfigError("--arrival", f"must be one of {', '.join(ARRIVALS)}")
    if arrival == "constant":
        gap = 1.0 / rate
        while True:
            yield gap
    draw = (rng or random.Random()).expovariate
    while True:
        yield draw(rate)


def arrival_offsets(
    rate: float,
    arrival: Arrival,
    until_s: float,
    rng: random.Random | None = None,
    phase: float = 0.0,
) -> Iterator[float]:
    """Yield intended send times (seconds from the start) in ``[0, until_s)``.

    ``phase`` (a fraction of one gap, 0..1) shifts a constant schedule, so N processes each
    sending ``rate/N`` with phases ``i/N`` interleave into one even schedule.
    """
    gaps = inter_arrival_gaps(rate, arrival, rng)
    offset = phase / rate if arrival == "constant" else next(gaps)
    # Multiplying the index, not summing gaps, keeps a long constant schedule free of drift.
    index = 0
    while offset < until_s:
        yield offset
        index += 1
        offset = (index + phase) / rate if arrival == "constant" else offset + next(gaps)
