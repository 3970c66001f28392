"""Reading a request's deadline, priority and cost from its headers.

Two deadline forms are understood: ``X-Request-Timeout: 2.5`` (seconds, a decimal
number) and gRPC's ``grpc-timeout: 250m`` (at most 8 digits and a unit: H hours,
M minutes, S seconds, m milliseconds, u microseconds, n nanoseconds).
"""

from __future__ import annotations

import math
import re

from loadshed.costmodel import MAX_COST
from loadshed.errors import ConfigError, LoadshedError, Priority

__all__ = [
    "HeaderError",
    "parse_cost",
    "parse_grpc_timeout",
    "parse_priority",
    "parse_timeout_seconds",
]

_GRPC_TIMEOUT_RE = re.compile(r"^(\d{1,8})([HMSmun])$")
_GRPC_UNIT_SECONDS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_MAX_TIMEOUT_SECONDS = 24 * 3600.0


class HeaderError(LoadshedError):
    """A request header has a malformed value; ``header`` names it."""

    def __init__(self, header: str, value: str, allowed: str) -> None:
        super().__init__(f"{header}: malformed value {value!r}; allowed: {allowed}")
        self.header = header
        self.value = value


def parse_timeout_seconds(value: str, header: str = "x-request-timeout") -> float:
    """Parse a positive number of seconds (e.g. ``"2.5"``); raise HeaderError otherwise."""
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= _MAX_TIMEOUT_SECONDS):  # also rejects nan and inf
        raise HeaderError(header, value, "seconds as a number > 0 and <= 86400, e.g. 2.5")
    return seconds


def parse_grpc_timeout(value: str, header: str = "grpc-timeout") -> float:
    """Parse a gRPC timeout such as ``"250m"`` into seconds; raise HeaderError otherwise."""
    match = _GRPC_TIMEOUT_RE.match(value.strip())
    if match is None or int(match.group(1)) == 0:
        raise HeaderError(header, value, "1 to 8 digits then one of H M S m u n, e.g. 250m")
    return min(int(match.group(1)) * _GRPC_UNIT_SECONDS[match.group(2)], _MAX_TIMEOUT_SECONDS)


def parse_cost(value: str, header: str = "x-request-cost") -> float:
    """Parse a request cost, a number in (0, ``MAX_COST``] (e.g. ``"256"``); raise
    HeaderError otherwise."""
    try:
        cost = float(value.strip())
    except ValueError:
        cost = math.nan
    if not (0 < cost <= MAX_COST):  # also rejects nan and inf
        raise HeaderError(header, value, f"a number in (0, {MAX_COST:g}], e.g. 256")
    return cost


def parse_priority(value: str, header: str = "x-priority") -> Priority:
    """Parse ``critical|default|sheddable``; raise HeaderError otherwise."""
    try:
        return Priority.parse(value)
    except ConfigError:
        raise HeaderError(header, value, "critical|default|sheddable") from None
