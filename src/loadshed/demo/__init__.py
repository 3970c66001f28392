"""Demo services: small, real inference-like HTTP services to overload and protect.

Each is a plain Starlette app built by a factory that takes its settings (invalid settings raise
:class:`~loadshed.errors.ConfigError` at once); none carries any protection, so that the same
service can be measured bare and behind loadshed:

- :mod:`loadshed.demo.hashburn`: the throughput paradox's CPU-bound model.
  ``GET /calculate?input=...`` burns the event loop's CPU for a set service time, so one
  server process is one worker.
- :mod:`loadshed.demo.digits`: a scikit-learn classifier trained at start-up on the digits
  data set scikit-learn ships, served through :class:`~loadshed.runner.ModelRunner`.
- :mod:`loadshed.demo.origin`: the capacity-change experiment's origin: ``workers`` slots
  held for a changeable work time (asyncio sleep), a bounded queue, 503 past it.

:func:`create_demo_app` builds one by name (imports are lazy: ``digits`` pulls in
scikit-learn).
"""

from __future__ import annotations

import importlib
import math
from typing import Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse

from loadshed.errors import ConfigError

__all__ = [
    "DEMO_MODELS",
    "create_demo_app",
    "invalid_request",
    "positive_int",
    "positive_number",
]

DEMO_MODELS: tuple[str, ...] = ("hashburn", "digits", "origin")
"""Names accepted by :func:`create_demo_app`."""


def create_demo_app(model: str, **settings: Any) -> Starlette:
    """Build the demo service ``model`` (one of :data:`DEMO_MODELS`) with ``settings``
    passed to its ``create_app``."""
    if model not in DEMO_MODELS:
        raise ConfigError("model", f"got {model!r}, allowed: {'|'.join(DEMO_MODELS)}")
    module = importlib.import_module(f"loadshed.demo.{model}")
    app = module.create_app(**settings)
    assert isinstance(app, Starlette)
    return app


def invalid_request(field: str, reason: str) -> JSONResponse:
    """The demo services' 422 answer: ``{"error": "invalid_request", "field", "reason"}``,
    where ``reason`` starts with the field's name."""
    return JSONResponse(
        {"error": "invalid_request", "field": field, "reason": f"{field}: {reason}"},
        status_code=422,
    )


def positive_number(value: object, field: str, maximum: float = math.inf) -> float:
    """Validate a setting that must be a finite number in (0, maximum]; raise
    :class:`ConfigError` naming ``field`` otherwise."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= maximum
    ):
        bound = "" if math.isinf(maximum) else f" and <= {maximum:g}"
        raise ConfigError(field, f"must be a number > 0{bound}, got {value!r}")
    return float(value)


def positive_int(value: object, field: str, minimum: int = 1) -> int:
    """Validate an integer setting ``>= minimum``; raise :class:`ConfigError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(field, f"must be an integer >= {minimum}, got {value!r}")
    return value
