"""Parsing of durations, rates and lists as users type them ("200ms", "1.5s", "5")."""

from __future__ import annotations

import re
from typing import Any

import click

from loadshed.errors import ConfigError

__all__ = ["DURATION", "Duration", "parse_duration", "parse_float_range", "parse_int_list"]

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(us|µs|ms|s|m|h)?\s*$")
_UNIT_SECONDS = {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "m": 60.0, "h": 3600.0}


def parse_duration(text: str | float | int, field: str = "duration") -> float:
    """Parse ``"250ms"``, ``"1.5s"``, ``"2m"`` or a bare number of seconds.

    Raises :class:`ConfigError` naming ``field`` and the accepted forms.
    """
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _DURATION_RE.match(text)
        if match is None:
            raise ConfigError(
                field, f"malformed duration {text!r}; use a number with us, ms, s, m or h"
            )
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds < 0:
        raise ConfigError(field, f"must be >= 0, got {text!r}")
    return seconds


def parse_int_list(text: str, field: str) -> list[int]:
    """Parse ``"1,2,4,8"`` or ``"1:64:2"`` (start:stop:step, stop included)."""
    text = text.strip()
    try:
        if ":" in text:
            parts = [int(p) for p in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            start, stop = parts[0], parts[1]
            step = parts[2] if len(parts) == 3 else 1
            if step <= 0 or stop < start:
                raise ValueError
            values = list(range(start, stop + 1, step))
        else:
            values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(
            field, f"malformed list {text!r}; use 1,2,4 or start:stop[:step]"
        ) from None
    if not values:
        raise ConfigError(field, "must not be empty")
    return values


def parse_float_range(text: str, field: str) -> list[float]:
    """Parse ``"100,200"`` or ``"100:1000:100"`` into floats (stop included)."""
    text = text.strip()
    try:
        if ":" in text:
            parts = [float(p) for p in text.split(":")]
            if len(parts) != 3 or parts[2] <= 0 or parts[1] < parts[0]:
                raise ValueError
            start, stop, step = parts
            count = int((stop - start) / step + 1e-9) + 1
            values = [start + i * step for i in range(count)]
        else:
            values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(
            field, f"malformed list {text!r}; use 100,200 or start:stop:step"
        ) from None
    if not values:
        raise ConfigError(field, "must not be empty")
    return values


class Duration(click.ParamType[float, Any]):
    """A click parameter type for durations; bad input exits 2 naming the flag."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_duration(
                str(value), field=param.name if param and param.name else "duration"
            )
        except ConfigError as exc:
            self.fail(f"{value!r} is not a duration (e.g. 500ms, 2s, 1.5)", param, ctx)
            raise AssertionError from exc  # unreachable: fail() raises


DURATION = Duration()
