"""loadshed: admission control, adaptive concurrency limits and load testing for
machine-learning inference APIs."""

from __future__ import annotations

from loadshed.clock import Clock, MonotonicClock, VirtualClock
from loadshed.errors import ConfigError, LoadshedError, Outcome, Priority, Rejected, RejectReason

__all__ = [
    "Clock",
    "ConfigError",
    "LoadshedError",
    "MonotonicClock",
    "Outcome",
    "Priority",
    "RejectReason",
    "Rejected",
    "VirtualClock",
]
__version__ = "0.1.0"
