"""loadshed: admission control, adaptive concurrency limits and load testing for
machine-learning inference APIs.

The core names import at once; integrations that pull in heavier libraries
(aiohttp, prometheus-client, multiprocessing) load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from loadshed.admission import Admission, LimiterSnapshot, Ticket, Token
from loadshed.clock import Clock, MonotonicClock, VirtualClock
from loadshed.config import AdmissionConfig, Discipline, LimitUnit
from loadshed.errors import ConfigError, LoadshedError, Outcome, Priority, Rejected, RejectReason
from loadshed.limiter import Limiter
from loadshed.limits import make_limit

if TYPE_CHECKING:
    from loadshed.asgi import LoadShedMiddleware
    from loadshed.bounded import bounded_map
    from loadshed.client import AdaptiveClient
    from loadshed.metrics import LoadshedMetrics
    from loadshed.runner import ModelRunner

__all__ = [
    "AdaptiveClient",
    "Admission",
    "AdmissionConfig",
    "Clock",
    "ConfigError",
    "Discipline",
    "LimitUnit",
    "Limiter",
    "LimiterSnapshot",
    "LoadShedMiddleware",
    "LoadshedError",
    "LoadshedMetrics",
    "ModelRunner",
    "MonotonicClock",
    "Outcome",
    "Priority",
    "RejectReason",
    "Rejected",
    "Ticket",
    "Token",
    "VirtualClock",
    "bounded_map",
    "make_limit",
]
__version__ = "0.1.0"

_LAZY = {
    "AdaptiveClient": "loadshed.client",
    "LoadShedMiddleware": "loadshed.asgi",
    "LoadshedMetrics": "loadshed.metrics",
    "ModelRunner": "loadshed.runner",
    "bounded_map": "loadshed.bounded",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'loadshed' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
