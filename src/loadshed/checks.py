"""Validation of numeric settings, shared by every constructor that takes one.

Each check returns the value (an ``int`` stays an ``int``; a number becomes a
``float``) or raises :class:`~loadshed.errors.ConfigError` naming the setting, e.g.
``max_queue: must be an integer >= 0, got 'x'``. ``bool`` is never accepted as a
number (``True`` is an ``int`` to Python, never a queue bound to a user), NaN never,
and infinity only where a check says so. The checks run once, at construction:
nothing here is on a per-request path.
"""

from __future__ import annotations

import math

from loadshed.errors import ConfigError

__all__ = ["check_int", "check_number", "check_optional_number"]


def _range_text(
    minimum: float | None,
    maximum: float | None,
    min_open: bool,
    max_open: bool,
) -> str:
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if min_open else '>='} {minimum:g}")
    if maximum is not None:
        parts.append(f"{'<' if max_open else '<='} {maximum:g}")
    return " and ".join(parts)


def check_int(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """``value`` if it is an ``int`` (not a bool) within [minimum, maximum], else
    :class:`ConfigError` naming ``name``."""
    wanted = _range_text(minimum, maximum, False, False)
    message = (
        f"must be an integer {wanted}, got {value!r}"
        if wanted
        else f"must be an integer, got {value!r}"
    )
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, message)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigError(name, message)
    return value


def check_number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
    allow_inf: bool = False,
    unit: str = "",
) -> float:
    """``float(value)`` if it is an int or float (not a bool), not NaN, finite unless
    ``allow_inf``, and within the bounds (``min_open``/``max_open``: the bound itself
    is excluded); else :class:`ConfigError` naming ``name``. ``unit`` (e.g.
    ``"seconds"``) only words the message."""
    wanted = _range_text(minimum, maximum, min_open, max_open)
    what = "a number" if allow_inf else "a finite number"
    if unit:
        what += f" of {unit}"
    if wanted:
        what += " " + wanted
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, f"must be {what}, got {value!r}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not allow_inf):
        raise ConfigError(name, f"must be {what}, got {value!r}")
    if minimum is not None and (number <= minimum if min_open else number < minimum):
        raise ConfigError(name, f"must be {what}, got {value!r}")
    if maximum is not None and (number >= maximum if max_open else number > maximum):
        raise ConfigError(name, f"must be {what}, got {value!r}")
    return number


def check_optional_number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
    allow_inf: bool = False,
    unit: str = "",
) -> float | None:
    """None, or :func:`check_number` of ``value`` (the message says None is allowed)."""
    if value is None:
        return None
    try:
        return check_number(
            name,
            value,
            minimum=minimum,
            maximum=maximum,
            min_open=min_open,
            max_open=max_open,
            allow_inf=allow_inf,
            unit=unit,
        )
    except ConfigError as error:
        message = str(error).partition(": ")[2]
        before, sep, after = message.partition(", got ")
        raise ConfigError(name, f"{before} or None{sep}{after}") from None
