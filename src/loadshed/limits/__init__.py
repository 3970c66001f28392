"""Concurrency-limit algorithms: pure classes that turn samples into a limit.

``make_limit(spec)`` builds one from a name (``little``, ``little+headroom``, ``aimd``,
``vegas``, ``gradient2``, ``gradient``, ``fixed:N``), an int (a fixed limit), or returns a
:class:`LimitAlgorithm` instance unchanged. Named algorithms get loadshed's defaults
for model endpoints; each peer class also has ``published()`` with the peer's own.
:class:`WorkerCount` (a runner's live worker count) has no name: it is built by
``Limiter(runner=...)``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from loadshed.errors import ConfigError
from loadshed.limits.aimd import AIMD
from loadshed.limits.base import LimitAlgorithm, Sample, Windowed, check_bounds
from loadshed.limits.fixed import Fixed
from loadshed.limits.gradient import Gradient
from loadshed.limits.gradient2 import Gradient2
from loadshed.limits.little import Little
from loadshed.limits.vegas import Vegas
from loadshed.limits.workers import WorkerCount

__all__ = [
    "AIMD",
    "LIMIT_NAMES",
    "LIMIT_SPECS",
    "Fixed",
    "Gradient",
    "Gradient2",
    "LimitAlgorithm",
    "Little",
    "Sample",
    "Vegas",
    "Windowed",
    "WorkerCount",
    "check_bounds",
    "make_limit",
]

_FACTORIES: dict[str, Callable[[], LimitAlgorithm]] = {
    "little": Little,
    "little+headroom": lambda: Little(headroom=True),
    "aimd": AIMD,
    "vegas": Vegas,
    "gradient2": Gradient2,
    "gradient": Gradient,
}
"""The registry of limit algorithms by name: the one place a new algorithm is added."""

LIMIT_NAMES: tuple[str, ...] = (*_FACTORIES, "fixed")
"""Algorithm names accepted by :func:`make_limit` (``fixed`` as ``fixed:N``)."""

LIMIT_SPECS = "|".join((*_FACTORIES, "fixed:N"))
"""The limit specs :func:`make_limit` takes, for help texts and error messages."""

_DIGITS = re.compile(r"[0-9]+")
_ALLOWED = f"allowed: {LIMIT_SPECS}"


def _fixed(count: int, spec: object) -> Fixed:
    if count < 1:
        raise ConfigError("limit", f"fixed limit must be >= 1, got {spec!r}; {_ALLOWED}")
    return Fixed(count)


def make_limit(spec: str | int | LimitAlgorithm) -> LimitAlgorithm:
    """Build a limit algorithm from ``spec``.

    ``spec`` is a name (``little|little+headroom|aimd|vegas|gradient2|gradient``,
    case-insensitive),
    ``fixed:N`` or a plain integer ``N`` (a fixed limit of N >= 1), or an existing
    :class:`LimitAlgorithm`, returned as is. Each call returns a new instance, since
    algorithms hold state. Raises :class:`ConfigError` (field ``limit``) naming the
    allowed values for anything else.
    """
    if isinstance(spec, LimitAlgorithm):
        return spec
    if isinstance(spec, bool):
        raise ConfigError("limit", f"expected a name or an integer, got {spec!r}; {_ALLOWED}")
    if isinstance(spec, int):
        return _fixed(spec, spec)
    if not isinstance(spec, str):
        raise ConfigError(
            "limit", f"expected a name or an integer, got {type(spec).__name__}; {_ALLOWED}"
        )
    text = spec.strip().lower()
    factory = _FACTORIES.get(text)
    if factory is not None:
        return factory()
    name, sep, value = text.partition(":")
    if name == "fixed" and sep:
        value = value.strip()
        if _DIGITS.fullmatch(value):
            return _fixed(int(value), spec)
        raise ConfigError("limit", f"fixed:N needs an integer N >= 1, got {spec!r}; {_ALLOWED}")
    if _DIGITS.fullmatch(text):
        return _fixed(int(text), spec)
    if text == "workers":
        raise ConfigError(
            "limit",
            "'workers' follows a ModelRunner's live worker count: pass runner= to "
            "Limiter or LoadShedMiddleware instead of a limit",
        )
    raise ConfigError("limit", f"unknown limit {spec!r}; {_ALLOWED}")
